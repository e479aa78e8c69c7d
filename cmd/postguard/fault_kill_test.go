package main

import (
	"errors"
	"maps"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs"
	"github.com/postguard/postguard/jobs/mail/resendfake"
)

// openTestStore opens a store on databaseURL (a dbtest schema URL that a process under test
// uses too) with an insert-only River client, closed when t ends.
func openTestStore(t *testing.T, databaseURL string) riverstore.Store {
	t.Helper()
	return dbtest.OpenPostgres(t, databaseURL)
}

// waitJob polls job id until cond holds, and returns it.
func waitJob(t *testing.T, store riverstore.Store, id int64, within time.Duration, what string, cond func(job *rivertype.JobRow) bool) *rivertype.JobRow {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		job, err := store.Jobs().JobGet(t.Context(), id)
		require.NoError(t, err)
		if cond(job) {
			return job
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %d: not %s within %s: state %s, attempt %d, errors %v", id, what, within, job.State, job.Attempt, job.Errors)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// resendEnv is the environment of a postguard process mailing through fake.
func resendEnv(databaseURL string, fake *resendfake.Server) map[string]string {
	return map[string]string{
		"DATABASE_URL":            databaseURL,
		"APP_SECRET":              faultSecret,
		"MAILER":                  "resend",
		"RESEND_API_KEY":          "re_fault_test",
		"RESEND_FROM_EMAIL":       "postguard@example.com",
		"RESEND_BASE_URL":         fake.URL(),
		"RESEND_MAX_RPS":          "0",
		"JOB_FETCH_COOLDOWN":      "10ms",
		"JOB_FETCH_POLL_INTERVAL": "100ms",
	}
}

// TestWorker_KillAfterSend kills a worker process with SIGKILL after the provider received its
// POST but before the answer came back: the ambiguous failure that idempotency keys exist for.
// River's rescuer retries the job once it has been running JOB_RESCUE_AFTER, and the second
// attempt sends the same request again (same Idempotency-Key, same body bytes: the key and the
// random token were stored at the first attempt, the token sealed, and are read back), so the
// provider delivers the email once.
//
// Timing: River's rescuer runs only on the leader, on start and every 30 s (its interval is not
// configurable through river.Config). The killed worker was the leader, and its lease (15 s)
// must expire before the second worker is elected (it retries every 5 s), so the rescue comes
// about 15-20 s after the kill. The rescued job is then scheduled by the retry policy (1 min
// after a first failure); the test brings that retry forward with JobRetry, as an operator would
// from River UI, rather than wait.
func TestWorker_KillAfterSend(t *testing.T) {
	t.Parallel()

	schemaURL := dbtest.PostgresURL(t)
	store := openTestStore(t, schemaURL)

	// The fake answers the first POST only when the test lets it, after the kill.
	received := make(chan struct{})
	release := make(chan struct{})
	var first sync.Once
	fake := resendfake.New(t, &resendfake.Config{
		BeforeAnswerFunc: func(*resendfake.Request) {
			first.Do(func() {
				close(received)
				<-release
			})
		},
	})
	var releaseOnce sync.Once
	releaseFirst := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(releaseFirst) // before the fake's Close, which waits for its handlers

	env := resendEnv(schemaURL, fake)
	env["JOB_TIMEOUT"] = "2s"
	env["JOB_RESCUE_AFTER"] = "3s"

	user, err := store.UserInsert(t.Context(), &db.UserInsertParams{Email: "kill@example.com", Name: "Kill", PasswordHash: "unused", Now: time.Now()})
	require.NoError(t, err)

	worker := startProcess(t, "worker", maps.Clone(env))
	insertedAt := time.Now().Truncate(time.Microsecond) // PostgreSQL's precision
	inserted, err := store.JobInsert(t.Context(), jobs.VerificationEmailArgs{UserID: user.ID}, nil)
	require.NoError(t, err)
	jobID := inserted.Job.ID

	select {
	case <-received:
	case <-time.After(20 * time.Second):
		t.Fatalf("the fake received no POST within 20s\nlogs:\n%s", worker.Logs)
	}
	killedAt := time.Now()
	worker.signal(t, syscall.SIGKILL)
	var exitErr *exec.ExitError
	require.True(t, errors.As(worker.wait(t, 10*time.Second), &exitErr))
	status, ok := exitErr.Sys().(syscall.WaitStatus)
	require.True(t, ok && status.Signaled() && status.Signal() == syscall.SIGKILL, "the worker died of SIGKILL: %v", exitErr)
	// The provider finishes the request the dead worker never hears the answer of.
	releaseFirst()

	job, err := store.Jobs().JobGet(t.Context(), jobID)
	require.NoError(t, err)
	require.Equal(t, rivertype.JobStateRunning, job.State, "the dead worker's job is left running")
	require.Equal(t, 1, job.Attempt)

	worker = startProcess(t, "worker", maps.Clone(env))
	job = waitJob(t, store, jobID, 45*time.Second, "rescued", func(job *rivertype.JobRow) bool {
		return len(job.Errors) > 0
	})
	t.Logf("rescued %s after the kill", time.Since(killedAt).Round(time.Millisecond))
	require.Equal(t, rivertype.JobStateRetryable, job.State)
	require.Contains(t, job.Errors[0].Error, "Stuck job rescued")
	// The attempt the kill cut short: made after the insert, before the kill.
	require.False(t, job.AttemptedAt.Before(insertedAt) || job.AttemptedAt.After(killedAt),
		"attempted at %s, inserted at %s, killed at %s", job.AttemptedAt, insertedAt, killedAt)

	_, err = store.Jobs().JobRetry(t.Context(), jobID)
	require.NoError(t, err)
	job = waitJob(t, store, jobID, 15*time.Second, "completed", func(job *rivertype.JobRow) bool {
		return job.State == rivertype.JobStateCompleted || job.FinalizedAt != nil
	})
	require.Equal(t, rivertype.JobStateCompleted, job.State, "errors: %v", job.Errors)
	require.Equal(t, 2, job.Attempt)

	deliveries := fake.Deliveries()
	require.Len(t, deliveries, 1, "delivered once")
	require.Equal(t, []string{"kill@example.com"}, deliveries[0].To)
	requests := fake.Requests()
	require.Len(t, requests, 2, "the dead worker's request and the rescued attempt's")
	key := requests[0].Header.Get("Idempotency-Key")
	require.Regexp(t, `^verification_email:`+strconv.FormatInt(user.ID, 10)+`:[0-9a-f]{32}$`, key)
	require.Equal(t, key, requests[1].Header.Get("Idempotency-Key"), "both attempts send the same Idempotency-Key")
	require.Equal(t, string(requests[0].Body), string(requests[1].Body), "both attempts send the same payload")

	worker.signal(t, syscall.SIGTERM)
	require.NoError(t, worker.wait(t, 20*time.Second), "SIGTERM exits cleanly\nlogs:\n%s", worker.Logs)
}
