package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/cmd/internal/service"
	"github.com/postguard/postguard/db/sqlite"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs"
	"github.com/postguard/postguard/jobs/mail/resendfake"
)

// tokenEngine is one engine's way to run `postguard serve` on a database that a test can drop
// and recreate, and read after the server stopped.
type tokenEngine struct {
	name string
	// env is the server's environment on a fresh database.
	env map[string]string
	// recreate drops the database and makes it anew, empty, under the same name.
	recreate func(t *testing.T)
	// open opens the database (the server stopped), closed when t ends.
	open func(t *testing.T) riverstore.Store
}

func tokenEngines(t *testing.T, fn func(t *testing.T, engine *tokenEngine)) {
	t.Helper()

	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "postguard.db")
		fn(t, &tokenEngine{
			name: "sqlite",
			env:  map[string]string{"DATABASE_URL": "sqlite://" + path},
			recreate: func(t *testing.T) {
				t.Helper()
				for _, name := range []string{path, path + "-wal", path + "-shm"} {
					require.NoError(t, os.RemoveAll(name))
				}
			},
			open: func(t *testing.T) riverstore.Store {
				t.Helper()
				return dbtest.OpenSQLite(t, path)
			},
		})
	})
	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		schemaURL := dbtest.PostgresEmptyURL(t)
		migrate := func(t *testing.T) {
			t.Helper()
			out, err := runCommand(t, []string{"migrate"}, map[string]string{"DATABASE_URL": schemaURL})
			require.NoError(t, err, out)
		}
		migrate(t)
		fn(t, &tokenEngine{
			name: "postgres",
			env:  map[string]string{"DATABASE_URL": schemaURL, "APP_SECRET": faultSecret},
			recreate: func(t *testing.T) {
				t.Helper()
				conn := directConn(t, schemaURL)
				var schema string
				require.NoError(t, conn.QueryRow(t.Context(), "SELECT current_schema()").Scan(&schema))
				_, err := conn.Exec(t.Context(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
				require.NoError(t, err)
				_, err = conn.Exec(t.Context(), "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
				require.NoError(t, err)
				migrate(t)
			},
			open: func(t *testing.T) riverstore.Store {
				t.Helper()
				return dbtest.OpenPostgres(t, schemaURL)
			},
		})
	})
}

// tokenServer is `postguard serve` mailing through a fake of Resend that outlives it.
type tokenServer struct {
	*runningServer
	fake *resendfake.Server
}

func startTokenServer(t *testing.T, engine *tokenEngine, fake *resendfake.Server) *tokenServer {
	t.Helper()
	env := resendEnv("", fake)
	for k, v := range engine.env {
		env[k] = v
	}
	if _, ok := engine.env["APP_SECRET"]; !ok {
		delete(env, "APP_SECRET") // the embedded default makes its own
	}
	return &tokenServer{runningServer: startServer(t, service.RoleServe, env), fake: fake}
}

// waitForPrune waits until the prune job that every start runs has run, so that it has taken its
// job id before the test inserts any (prune_counters, inserted with it, has taken its own): the
// ids of the jobs that follow are the same on every run.
func (s *tokenServer) waitForPrune(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(s.Logs.String(), "prune done") },
		30*time.Second, 10*time.Millisecond, "the prune job of the start did not run; logs:\n%s", s.Logs)
}

// post sends a JSON body and returns the status.
func (s *tokenServer) post(t *testing.T, path string, body any) int {
	t.Helper()
	data, err := json.Marshal(body)
	require.NoError(t, err)
	resp, err := http.Post(s.URL+path, "application/json", bytes.NewReader(data))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// register registers email; forgotPassword asks for its reset mail and returns that mail's link
// token, once the fake has it.
func (s *tokenServer) register(t *testing.T, email string) {
	t.Helper()
	require.Equal(t, http.StatusCreated, s.post(t, "/v1/auth/register", map[string]string{"email": email, "password": "correct horse battery"}))
}

func (s *tokenServer) forgotPassword(t *testing.T, email string) string {
	t.Helper()
	require.Equal(t, http.StatusAccepted, s.post(t, "/v1/auth/forgot-password", map[string]string{"email": email}))
	var token string
	require.Eventually(t, func() bool {
		for _, d := range s.fake.Deliveries() {
			if slices.Contains(d.To, email) && strings.Contains(d.Text, "/v1/auth/reset-password?token=") {
				token = regexp.MustCompile(`reset-password\?token=([A-Za-z0-9_-]+)`).FindStringSubmatch(d.Text)[1]
				return true
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond, "no reset mail for %s\nlogs:\n%s", email, s.Logs)
	return token
}

// resetPassword posts a reset with token and returns the status.
func (s *tokenServer) resetPassword(t *testing.T, token string) int {
	t.Helper()
	return s.post(t, "/v1/auth/reset-password", map[string]string{"token": token, "password": "attacker's new password"})
}

// derivedResetToken is the first scheme's reset token, HMAC(APP_SECRET, "reset:v1:"+job id),
// which anyone holding the secret and a job id could compute.
func derivedResetToken(secret []byte, jobID int64) string {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte("reset:v1:" + strconv.FormatInt(jobID, 10)))
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// resetJobs lists the password reset jobs of a database.
func resetJobs(t *testing.T, store riverstore.Store) []int64 {
	t.Helper()
	var ids []int64
	require.NoError(t, store.InTx(t.Context(), func(ctx context.Context, tx riverstore.Tx) error {
		for id := int64(1); id <= 20; id++ {
			message, err := tx.EmailMessageGetByJob(ctx, id)
			if err == nil && message.Kind == (jobs.PasswordResetEmailArgs{}).Kind() {
				ids = append(ids, id)
			}
		}
		return nil
	}))
	return ids
}

// TestServe_ResetLinkCannotBeMinted is the first account takeover of the review: whoever holds
// APP_SECRET (on the embedded default: whoever could read the database file, which held it) and
// a job id could compute a working reset link. Now the secret is not in the database's bytes,
// and a link computed from it and the job's id is refused: tokens are random.
func TestServe_ResetLinkCannotBeMinted(t *testing.T) {
	t.Parallel()

	tokenEngines(t, func(t *testing.T, engine *tokenEngine) {
		fake := resendfake.New(t, nil)
		server := startTokenServer(t, engine, fake)
		server.register(t, "victim@example.com")
		mailed := server.forgotPassword(t, "victim@example.com")
		require.NoError(t, server.stop(t))

		store := engine.open(t)
		jobIDs := resetJobs(t, store)
		require.Len(t, jobIDs, 1)

		secret := []byte(faultSecret)
		if engine.name == "sqlite" {
			path := strings.TrimPrefix(engine.env["DATABASE_URL"], "sqlite://")
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			hexSecret, err := os.ReadFile(sqlite.SecretPath(path))
			require.NoError(t, err)
			require.False(t, bytes.Contains(data, bytes.TrimSpace(hexSecret)), "the generated secret is not in the database file")
			// The attacker has the secret file too: still no link.
			secret, err = hex.DecodeString(string(bytes.TrimSpace(hexSecret)))
			require.NoError(t, err)
		}
		minted := derivedResetToken(secret, jobIDs[0])
		require.NotEqual(t, mailed, minted)

		server = startTokenServer(t, engine, fake)
		status := server.resetPassword(t, minted)
		t.Logf("a reset link computed from APP_SECRET and job id %d: %d", jobIDs[0], status)
		require.Equal(t, http.StatusBadRequest, status)
		require.Equal(t, http.StatusNoContent, server.resetPassword(t, mailed), "the mailed link works")
		require.NoError(t, server.stop(t))
	})
}

// TestServe_RecreatedDatabaseIssuesNewLinks is the second: a database dropped and recreated
// with the same secret hands out the same user and job ids again. A reset link mailed before
// must not work on the account that now has its job id, and no idempotency key may repeat
// (Resend would refuse the new user's mail as another payload under a known key).
func TestServe_RecreatedDatabaseIssuesNewLinks(t *testing.T) {
	t.Parallel()

	tokenEngines(t, func(t *testing.T, engine *tokenEngine) {
		if engine.name == "sqlite" {
			engine.env["APP_SECRET"] = faultSecret // the same secret across the recreation
		}
		// The jobs of a start (prune and prune_counters, inserted at once) take their ids before
		// the test's; no later prune_counters may take one in between.
		engine.env["COUNTER_PRUNE_INTERVAL"] = "1h"
		fake := resendfake.New(t, nil) // one Resend, before and after: it remembers keys

		server := startTokenServer(t, engine, fake)
		server.waitForPrune(t)
		server.register(t, "alice@example.com")
		aliceLink := server.forgotPassword(t, "alice@example.com")
		require.NoError(t, server.stop(t))
		aliceJobs := resetJobs(t, engine.open(t))

		engine.recreate(t)

		server = startTokenServer(t, engine, fake)
		server.waitForPrune(t)
		server.register(t, "bob@example.com")
		bobLink := server.forgotPassword(t, "bob@example.com")

		status := server.resetPassword(t, aliceLink)
		t.Logf("Alice's old link after the database was recreated: %d", status)
		require.Equal(t, http.StatusBadRequest, status, "Alice's old link does not reset Bob's password")
		require.NoError(t, server.stop(t))
		require.Equal(t, aliceJobs, resetJobs(t, engine.open(t)), "Bob's reset job has Alice's old job id")

		// Every mail of both users was delivered, under keys that never repeat.
		var keys []string
		for _, d := range fake.Deliveries() {
			require.NotContains(t, keys, d.IdempotencyKey)
			keys = append(keys, d.IdempotencyKey)
		}
		require.Len(t, keys, 6, "welcome, verification and reset, for each user")
		for _, req := range fake.Requests() {
			require.Equal(t, http.StatusOK, req.Status, "no send was refused (409) or failed")
		}

		server = startTokenServer(t, engine, fake)
		require.Equal(t, http.StatusNoContent, server.resetPassword(t, bobLink), "Bob's own link works")
		require.NoError(t, server.stop(t))
	})
}
