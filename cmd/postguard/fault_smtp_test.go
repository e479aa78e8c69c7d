package main

import (
	"errors"
	"maps"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/jobs"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/jobs/mail/smtpfake"
)

// smtpEnv is the environment of a postguard process mailing through fake over plain SMTP (the
// process cannot trust the fake's test certificate; TLS is the SMTP tests' of jobs and jobs/mail).
func smtpEnv(databaseURL string, fake *smtpfake.Server) map[string]string {
	return map[string]string{
		"DATABASE_URL":            databaseURL,
		"APP_SECRET":              faultSecret,
		"MAILER":                  "smtp",
		"SMTP_URL":                fake.URL(mail.SMTPSchemeInsecure),
		"SMTP_MAX_RPS":            "0",
		"MAIL_FROM":               "Postguard <postguard@example.com>",
		"JOB_FETCH_COOLDOWN":      "10ms",
		"JOB_FETCH_POLL_INTERVAL": "100ms",
	}
}

// TestWorker_KillAfterSMTPAccepted kills a worker process with SIGKILL after the SMTP server
// answered 250 to the end of its mail's data and before the job completed: SMTP has no
// idempotency key, so only the acceptance the worker records on the message row, before the job
// can complete, keeps the rescued attempt from sending the mail a second time.
//
// The window is arranged, not timed: the fake holds its 250 until the test has locked the job's
// river_job row (so River's completion of the job waits on the test), and the test kills the
// worker once the message row says accepted. A welcome mail, which carries no link token: the
// rescued attempt renders the very same bytes, so nothing but the recorded acceptance stands
// between it and a second send. Rescue timing is TestWorker_KillAfterSend's.
func TestWorker_KillAfterSMTPAccepted(t *testing.T) {
	t.Parallel()

	schemaURL := dbtest.PostgresURL(t)
	store := openTestStore(t, schemaURL)

	// The fake holds its reply to the first mail's end of data until the test lets it.
	received := make(chan struct{})
	release := make(chan struct{})
	var first sync.Once
	fake := smtpfake.New(t, &smtpfake.Config{
		BeforeReplyFunc: func(*smtpfake.Message) {
			first.Do(func() {
				close(received)
				<-release
			})
		},
	})
	var releaseOnce sync.Once
	releaseFirst := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(releaseFirst) // before the fake's Close, which waits for its sessions

	env := smtpEnv(schemaURL, fake)
	env["JOB_TIMEOUT"] = "10s"
	env["JOB_RESCUE_AFTER"] = "11s"

	user, err := store.UserInsert(t.Context(), &db.UserInsertParams{Email: "smtp-kill@example.com", Name: "Kill", PasswordHash: "unused", Now: time.Now()})
	require.NoError(t, err)

	worker := startProcess(t, "worker", maps.Clone(env))
	require.Contains(t, worker.Logs.String(), `"smtp_url":"`+fake.URL(mail.SMTPSchemeInsecure)+`"`, "the start line names the relay")
	inserted, err := store.JobInsert(t.Context(), jobs.WelcomeEmailArgs{UserID: user.ID}, nil)
	require.NoError(t, err)
	jobID := inserted.Job.ID

	select {
	case <-received:
	case <-time.After(20 * time.Second):
		t.Fatalf("the fake received no mail within 20s\nlogs:\n%s", worker.Logs)
	}

	// Hold the job's row: the worker may record the acceptance, but River cannot complete the job.
	conn, err := pgx.Connect(t.Context(), schemaURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(t.Context()) })
	lock, err := conn.Begin(t.Context())
	require.NoError(t, err)
	var lockedID int64
	require.NoError(t, lock.QueryRow(t.Context(), "SELECT id FROM river_job WHERE id = $1 FOR UPDATE", jobID).Scan(&lockedID))

	releaseFirst() // the 250
	deadline := time.Now().Add(20 * time.Second)
	for {
		message, err := store.EmailMessageGetByJob(t.Context(), jobID)
		require.NoError(t, err)
		if message.AcceptedAt != nil {
			require.Equal(t, "smtp", *message.Provider)
			require.Nil(t, message.ProviderInDoubt)
			break
		}
		require.True(t, time.Now().Before(deadline), "the acceptance was not recorded within 20s\nlogs:\n%s", worker.Logs)
		time.Sleep(20 * time.Millisecond)
	}

	worker.signal(t, syscall.SIGKILL)
	var exitErr *exec.ExitError
	require.True(t, errors.As(worker.wait(t, 10*time.Second), &exitErr))
	// A completion the dead worker had sent waits on the lock in its server session, which
	// PostgreSQL does not end before the statement does: end it, so the job's row stays as the
	// crash left it, and only then release the lock.
	_, err = conn.Exec(t.Context(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))")
	require.NoError(t, err)
	require.NoError(t, lock.Rollback(t.Context()))

	job, err := store.Jobs().JobGet(t.Context(), jobID)
	require.NoError(t, err)
	require.Equal(t, rivertype.JobStateRunning, job.State, "the dead worker's job is left running")

	worker = startProcess(t, "worker", maps.Clone(env))
	job = waitJob(t, store, jobID, 60*time.Second, "rescued", func(job *rivertype.JobRow) bool {
		return len(job.Errors) > 0
	})
	require.Equal(t, rivertype.JobStateRetryable, job.State)
	require.Contains(t, job.Errors[0].Error, "Stuck job rescued")

	_, err = store.Jobs().JobRetry(t.Context(), jobID)
	require.NoError(t, err)
	job = waitJob(t, store, jobID, 15*time.Second, "completed", func(job *rivertype.JobRow) bool {
		return job.State == rivertype.JobStateCompleted || job.FinalizedAt != nil
	})
	require.Equal(t, rivertype.JobStateCompleted, job.State, "errors: %v", job.Errors)
	require.Equal(t, 2, job.Attempt)

	require.Equal(t, 1, len(fake.Received()), "the rescued attempt sent nothing") //nolint:testifylint // Len would print every message's bytes
	require.Equal(t, 1, len(fake.Messages()))                                     //nolint:testifylint // as above
	require.Equal(t, []string{"smtp-kill@example.com"}, fake.Messages()[0].To)
	require.Contains(t, worker.Logs.String(), "accepted this job's email in an earlier attempt")

	worker.signal(t, syscall.SIGTERM)
	require.NoError(t, worker.wait(t, 20*time.Second), "SIGTERM exits cleanly\nlogs:\n%s", worker.Logs)
}
