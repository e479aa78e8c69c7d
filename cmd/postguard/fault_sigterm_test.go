package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/jobs"
	"github.com/postguard/postguard/jobs/mail/resendfake"
)

// TestServe_SIGTERMUnderLoad sends SIGTERM to `postguard serve` (the built binary, on
// PostgreSQL) while, by the test's arrangement rather than by timing, registrations are inside
// the server and mail is being sent:
//   - the provider holds every send it receives until the test ends, and the test waits until it
//     holds the sends of two registered users' four jobs;
//   - the test holds a lock on the users table that every registration's INSERT waits for, sends
//     registrations, and waits until PostgreSQL shows each of them waiting on that lock;
//   - it sends SIGTERM, waits until the server's listener refuses connections (shutdown under
//     way), and only then releases the lock.
//
// The process exits 0 after SHUTDOWN_TIMEOUT; each registration in flight at the signal answered
// 201 (none was reset) and has its user and both jobs; and no job is lost or charged an
// attempt: each is completed, or back in the queue (available) with no attempt spent, the four
// whose sends were cut short included.
func TestServe_SIGTERMUnderLoad(t *testing.T) {
	t.Parallel()

	const (
		// Long enough for the registrations released after the signal to finish, whatever the
		// machine; the held sends are cut short when it passes.
		shutdownTimeout = 8 * time.Second
		sendingUsers    = 2 // their welcome and verification mail is being sent at the signal
		inFlight        = 4 // registrations inside the server at the signal
	)

	schemaURL := dbtest.PostgresURL(t)
	received := make(chan string, 64)
	release := make(chan struct{})
	fake := resendfake.New(t, &resendfake.Config{
		BeforeAnswerFunc: func(req *resendfake.Request) {
			received <- req.Header.Get("Idempotency-Key")
			<-release
		},
	})
	t.Cleanup(func() { close(release) }) // before the fake's Close, which waits for its handlers

	// Room in the pool for the registrations waiting on the lock and for River's own queries.
	env := resendEnv(schemaURL+"&pool_max_conns=16", fake)
	env["SHUTDOWN_TIMEOUT"] = shutdownTimeout.String()
	env["RATE_LIMIT_REGISTER_IP"] = "1000000/1h"
	env["RATE_LIMIT_REGISTER_EMAIL"] = "1000000/1h"
	serve := startProcess(t, "serve", env)

	users := make(map[int64]string)
	register := func(email string) (int, []byte, error) {
		resp, err := (&http.Client{Timeout: time.Minute}).Post(serve.URL+"/v1/auth/register", "application/json",
			strings.NewReader(`{"email":"`+email+`","password":"correct horse battery"}`))
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, body, err
	}
	recordUser := func(body []byte) {
		var created struct {
			ID    int64
			Email string
		}
		require.NoError(t, json.Unmarshal(body, &created))
		users[created.ID] = created.Email
	}

	// Mail being sent: the provider holds the four sends of two users.
	for i := range sendingUsers {
		status, body, err := register(fmt.Sprintf("sending-%d@example.com", i))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status, string(body))
		recordUser(body)
	}
	heldKeys := make(map[string]bool)
	for len(heldKeys) < 2*sendingUsers {
		select {
		case key := <-received:
			heldKeys[key] = true
		case <-time.After(30 * time.Second):
			t.Fatalf("the provider received %d of %d sends\nlogs:\n%s", len(heldKeys), 2*sendingUsers, serve.Logs)
		}
	}

	// Registrations in flight: each waits inside the server for the lock the test holds.
	ctx := t.Context()
	lockConn := directConn(t, schemaURL)
	lockTx, err := lockConn.Begin(ctx)
	require.NoError(t, err)
	_, err = lockTx.Exec(ctx, "LOCK TABLE users IN SHARE ROW EXCLUSIVE MODE")
	require.NoError(t, err)

	type result struct {
		status int
		body   []byte
		err    error
	}
	results := make(chan result, inFlight)
	for i := range inFlight {
		go func() {
			status, body, err := register(fmt.Sprintf("in-flight-%d@example.com", i))
			results <- result{status, body, err}
		}()
	}
	watch := directConn(t, schemaURL)
	for waiting := 0; waiting < inFlight; {
		require.NoError(t, watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`,
			lockConn.PgConn().PID()).Scan(&waiting))
		if waiting < inFlight {
			time.Sleep(10 * time.Millisecond) // polling for a state the registrations reach
		}
	}

	signalledAt := time.Now()
	serve.signal(t, syscall.SIGTERM)
	// Shutdown has begun once the listener is closed (connections refused): the registrations
	// are in flight at it. A connection accepted by the kernel as the listener closes is reset.
	addr := strings.TrimPrefix(serve.URL, "http://")
	for {
		conn, err := net.Dial("tcp", addr)
		if errors.Is(err, syscall.ECONNREFUSED) {
			break
		}
		if err == nil {
			conn.Close()
		} else {
			require.ErrorIs(t, err, syscall.ECONNRESET, "dialling a closing listener")
		}
		time.Sleep(10 * time.Millisecond) // polling for the listener the signal closes
	}
	require.NoError(t, lockTx.Commit(ctx))

	for range inFlight {
		r := <-results
		require.NoError(t, r.err, "a registration in flight at SIGTERM got its answer")
		require.Equal(t, http.StatusCreated, r.status, string(r.body))
		recordUser(r.body)
	}
	require.NoError(t, serve.wait(t, shutdownTimeout+30*time.Second), "exit status 0\nlogs:\n%s", serve.Logs)
	t.Logf("exited %s after SIGTERM", time.Since(signalledAt).Round(time.Millisecond))

	conn := directConn(t, schemaURL)
	requireRegistrationsStored(t, conn, users)

	// The jobs whose send was held: (kind, user id) from their idempotency keys
	// (<kind>:<user_id>:<random>).
	type jobKey struct {
		kind   string
		userID int64
	}
	held := make(map[jobKey]bool)
	for key := range heldKeys {
		parts := strings.Split(key, ":")
		require.GreaterOrEqual(t, len(parts), 2, "idempotency key %q", key)
		kind := parts[0]
		userID, err := strconv.ParseInt(parts[1], 10, 64)
		require.NoError(t, err)
		held[jobKey{kind, userID}] = true
	}

	var putBack int
	for userID, userJobs := range jobsByUser(t, conn) {
		for _, job := range userJobs {
			if job.Kind == (jobs.PruneArgs{}).Kind() || job.Kind == (jobs.PruneCountersArgs{}).Kind() {
				continue
			}
			switch job.State {
			case "completed":
				require.False(t, held[jobKey{job.Kind, userID}], "job %d (%s) completed, though its send was never answered", job.ID, job.Kind)
			case "available":
				require.Zero(t, job.Attempt, "job %d (%s) is back in the queue without an attempt spent; errors %v", job.ID, job.Kind, job.Errors)
				if held[jobKey{job.Kind, userID}] {
					putBack++
				}
			default:
				t.Fatalf("job %d (%s) is %s after a clean shutdown (attempt %d, errors %v)", job.ID, job.Kind, job.State, job.Attempt, job.Errors)
			}
		}
	}
	require.Equal(t, 2*sendingUsers, putBack, "sends cut short at SHUTDOWN_TIMEOUT put their jobs back")
}
