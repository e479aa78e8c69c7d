package main

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db/dbtest"
	"github.com/postguard/postguard/jobs/mail/resendfake"
)

// TestServe_SIGTERMUnderLoad sends SIGTERM to `postguard serve` (the built binary, on
// PostgreSQL) while clients register concurrently and email jobs are in the middle of their
// sends (the provider takes longer to answer than SHUTDOWN_TIMEOUT). The process exits 0 after
// SHUTDOWN_TIMEOUT; every request written before the signal got its answer, none was reset;
// every registration answered 201 has its user and both jobs; and no job is lost or charged
// an attempt: each is completed, or back in the queue (available) with no attempt spent, the
// ones whose send was cut short included.
func TestServe_SIGTERMUnderLoad(t *testing.T) {
	t.Parallel()

	const (
		shutdownTimeout = 2 * time.Second
		sendDelay       = 2*shutdownTimeout + time.Second // sends still running when it passes
		clients         = 12
		// A request written this long before the signal has been read by the server (it is
		// in flight, not in a socket buffer), so it must get its answer.
		writtenMargin = 250 * time.Millisecond
	)

	schemaURL := dbtest.PostgresURL(t)
	var sends atomic.Int64
	done := make(chan struct{})
	fake := resendfake.New(t, &resendfake.Config{
		BeforeAnswerFunc: func(*resendfake.Request) {
			sends.Add(1)
			select {
			case <-time.After(sendDelay):
			case <-done:
			}
		},
	})
	t.Cleanup(func() { close(done) }) // before the fake's Close, which waits for its handlers

	env := resendEnv(schemaURL, fake)
	env["SHUTDOWN_TIMEOUT"] = shutdownTimeout.String()
	env["RATE_LIMIT_REGISTER_IP"] = "1000000/1h"
	env["RATE_LIMIT_REGISTER_EMAIL"] = "1000000/1h"
	serve := startProcess(t, "serve", env)

	client := &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: clients},
	}
	load := startRegisterLoad(t, serve.URL, clients, client)
	t.Cleanup(func() { load.stop() })

	// Signal once registrations are flowing and sends are running.
	require.Eventually(t, func() bool {
		created := 0
		for _, r := range load.snapshot() {
			if r.status == http.StatusCreated {
				created++
			}
		}
		return created >= 4 && sends.Load() >= 1
	}, 20*time.Second, 10*time.Millisecond, "no registrations and sends under way\nlogs:\n%s", serve.Logs)
	signalledAt := time.Now()
	serve.signal(t, syscall.SIGTERM)
	require.NoError(t, serve.wait(t, shutdownTimeout+15*time.Second), "exit status 0\nlogs:\n%s", serve.Logs)
	exitedAfter := time.Since(signalledAt)
	results := load.stop()

	users := make(map[int64]string)
	var inFlight, refused int
	for _, r := range results {
		if !r.wrote.IsZero() && r.wrote.Before(signalledAt.Add(-writtenMargin)) {
			// Accepted and being handled at the signal: it finishes.
			require.NoError(t, r.err, "request %s written %s before SIGTERM", r.email, signalledAt.Sub(r.wrote))
			if r.end.After(signalledAt) {
				inFlight++
			}
		}
		if r.err != nil {
			refused++ // after the signal: the listener is closed
			continue
		}
		require.Equal(t, http.StatusCreated, r.status, "request %s: %s", r.email, r.body)
		var resp struct {
			ID    int64
			Email string
		}
		require.NoError(t, json.Unmarshal(r.body, &resp))
		users[resp.ID] = resp.Email
	}
	require.Positive(t, inFlight, "some requests were in flight at the signal")
	t.Logf("%d requests, %d created, %d in flight at SIGTERM, %d refused after it; %d sends started; exited %s after SIGTERM",
		len(results), len(users), inFlight, refused, sends.Load(), exitedAfter.Round(time.Millisecond))

	conn := directConn(t, schemaURL)
	requireRegistrationsStored(t, conn, users)

	// The jobs whose send had started: (kind, user id) from their idempotency keys
	// (<kind>:<user_id>:<random>).
	type jobKey struct {
		kind   string
		userID int64
	}
	sent := make(map[jobKey]bool)
	for _, req := range fake.Requests() {
		parts := strings.Split(req.Header.Get("Idempotency-Key"), ":")
		require.GreaterOrEqual(t, len(parts), 2, "idempotency key %q", req.Header.Get("Idempotency-Key"))
		kind := parts[0]
		userID, err := strconv.ParseInt(parts[1], 10, 64)
		require.NoError(t, err)
		sent[jobKey{kind, userID}] = true
	}

	var putBack int
	for userID, userJobs := range jobsByUser(t, conn) {
		for _, job := range userJobs {
			if job.Kind == "prune" {
				continue
			}
			switch job.State {
			case "completed":
			case "available":
				require.Zero(t, job.Attempt, "job %d (%s) is back in the queue without an attempt spent; errors %v", job.ID, job.Kind, job.Errors)
				if sent[jobKey{job.Kind, userID}] {
					putBack++
				}
			default:
				t.Fatalf("job %d (%s) is %s after a clean shutdown (attempt %d, errors %v)", job.ID, job.Kind, job.State, job.Attempt, job.Errors)
			}
		}
	}
	require.Positive(t, putBack, "sends cut short at SHUTDOWN_TIMEOUT put their jobs back")
}
