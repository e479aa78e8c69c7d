package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/cmd/internal/service"
	"github.com/postguard/postguard/db/sqlite"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/tokens"
)

// startRefused runs the server command of role with env and returns the error it stops with at
// start; the test fails if the process serves instead.
func startRefused(t *testing.T, role service.Role, env map[string]string) error {
	t.Helper()

	env["HTTP_ADDR"] = "127.0.0.1:0"
	env["METRICS_ADDR"] = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	logs := &syncBuffer{}
	cmd := &serverCommand{role: role, readyFunc: func(net.Addr) { close(ready) }}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Run(ctx, &commandEnv{Environ: envFunc(env), Stdout: io.Discard, Stderr: logs}) }()

	select {
	case err := <-exited:
		require.Error(t, err, "%s stopped without an error", role)
		return err
	case <-ready:
		cancel()
		require.NoError(t, <-exited)
		t.Fatalf("%s started, with another secret than its database's; logs:\n%s", role, logs.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("%s neither started nor stopped within 60s; logs:\n%s", role, logs.String())
	}
	return nil
}

// requireSecretRefusal checks a refusal names source and what another secret breaks.
func requireSecretRefusal(t *testing.T, err error, source string) {
	t.Helper()
	require.ErrorIs(t, err, service.ErrSecretMismatch)
	for _, want := range []string{source, "unsubscribe links", "suppression list", "rate-limit counters", "sealed copies", "trusted-device tokens", "postguard secret reset --yes"} {
		require.ErrorContains(t, err, want)
	}
}

// unsubscribeStatus is the status of GET /v1/unsubscribe with the link a user's welcome carried
// under secret.
func unsubscribeStatus(t *testing.T, baseURL string, secret []byte, userID int64) int {
	t.Helper()
	resp, err := http.Get(baseURL + "/v1/unsubscribe?token=" + tokens.Unsubscribe(secret, userID))
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// registerUser registers email and returns its id.
func registerUser(t *testing.T, baseURL, email string) int64 {
	t.Helper()
	status, body := opsRegister(t, baseURL, email)
	require.Equal(t, http.StatusCreated, status, body)
	var created struct{ ID int64 }
	require.NoError(t, json.Unmarshal([]byte(body), &created))
	return created.ID
}

// TestServe_SQLiteSecretFileLost: the embedded default's database remembers its secret. The
// third review deleted postguard.db.secret (as a restore that follows the advice to keep it out
// of backups does) and `serve` generated a new secret without a word: a complained-about
// address was mailed again, old unsubscribe links answered 400. Now serve refuses to start,
// naming the file and what a new secret breaks, and makes no new file; the restored file starts
// it again with every link working. `postguard secret reset --yes` is the way to a new secret.
func TestServe_SQLiteSecretFileLost(t *testing.T) {
	t.Parallel()

	path := filepath.Join(t.TempDir(), "postguard.db")
	secretPath := sqlite.SecretPath(path)
	env := func() map[string]string {
		return map[string]string{"DATABASE_URL": "sqlite://" + path, "MAILER": "none"}
	}
	server := startServer(t, service.RoleServe, env())
	userID := registerUser(t, server.URL, "ada@example.com")
	require.NoError(t, server.stop(t))
	saved, err := os.ReadFile(secretPath)
	require.NoError(t, err)
	oldSecret, err := hex.DecodeString(strings.TrimSpace(string(saved)))
	require.NoError(t, err)

	// Lost: refused, and no new secret is made in its place.
	require.NoError(t, os.Remove(secretPath))
	err = startRefused(t, service.RoleServe, env())
	requireSecretRefusal(t, err, "the secret file "+secretPath+" is missing")
	require.NoFileExists(t, secretPath)

	// Another secret in its place: refused too.
	require.NoError(t, os.WriteFile(secretPath, []byte(strings.Repeat("ab", 32)+"\n"), 0o600))
	err = startRefused(t, service.RoleServe, env())
	requireSecretRefusal(t, err, "the secret file "+secretPath+" is not the secret this database was made with")

	// Restored: it starts, and the links it mailed work.
	require.NoError(t, os.WriteFile(secretPath, saved, 0o600))
	server = startServer(t, service.RoleServe, env())
	require.Equal(t, http.StatusOK, unsubscribeStatus(t, server.URL, oldSecret, userID))
	require.NoError(t, server.stop(t))

	// A reset, when the old secret is gone for good: says what it breaks, and needs --yes.
	require.NoError(t, os.Remove(secretPath))
	out, err := runCommand(t, []string{"secret", "reset"}, env())
	require.ErrorIs(t, err, errNotConfirmed)
	require.Contains(t, out, "unsubscribe links already mailed stop working")
	require.NoFileExists(t, secretPath, "nothing changed")
	out, err = runCommand(t, []string{"secret", "reset", "--yes"}, env())
	require.NoError(t, err, out)
	require.Contains(t, out, "the database now records the secret file "+secretPath)
	server = startServer(t, service.RoleServe, env())
	require.Equal(t, http.StatusBadRequest, unsubscribeStatus(t, server.URL, oldSecret, userID), "as the reset said")
	require.NoError(t, server.stop(t))
}

// TestAPI_SecretMismatchRefused: on PostgreSQL the database records the check value of the
// first secret it meets (`postguard migrate` given APP_SECRET, else the first process), and every
// process with another APP_SECRET refuses to start. The third review ran two api processes with
// different secrets on one database: both started, and a burst of 200 against a limit of 5
// admitted 10, each secret counting in buckets of its own.
func TestAPI_SecretMismatchRefused(t *testing.T) {
	t.Parallel()

	databaseURL := dbtest.PostgresURL(t)
	secretA, secretB := strings.Repeat("a", 32), strings.Repeat("b", 32)
	env := func(secret string) map[string]string {
		return map[string]string{"DATABASE_URL": databaseURL, "APP_SECRET": secret}
	}

	// A deploy step without the secret records none: the first process does.
	out, err := runCommand(t, []string{"migrate"}, map[string]string{"DATABASE_URL": databaseURL})
	require.NoError(t, err, out)
	require.Contains(t, out, "APP_SECRET not given")

	first := startServer(t, service.RoleAPI, env(secretA))
	for _, role := range []service.Role{service.RoleAPI, service.RoleWorker, service.RoleServe} {
		err := startRefused(t, role, env(secretB))
		requireSecretRefusal(t, err, "APP_SECRET is not the secret this database was made with")
		require.NotContains(t, err.Error(), secretB, "the message names the variable, never its value")
	}
	_, err = runCommand(t, []string{"migrate"}, env(secretB))
	requireSecretRefusal(t, err, "APP_SECRET")
	out, err = runCommand(t, []string{"migrate"}, env(secretA))
	require.NoError(t, err, out)
	require.Contains(t, out, "APP_SECRET is the database's secret")
	second := startServer(t, service.RoleAPI, env(secretA))
	require.NoError(t, second.stop(t))

	// A reset needs --yes; then the new secret starts, and the old one is refused.
	out, err = runCommand(t, []string{"secret", "reset"}, env(secretB))
	require.ErrorIs(t, err, errNotConfirmed)
	require.Contains(t, out, "the suppression list matches no address any more")
	requireSecretRefusal(t, startRefused(t, service.RoleAPI, env(secretB)), "APP_SECRET")
	out, err = runCommand(t, []string{"secret", "reset", "--yes"}, env(secretB))
	require.NoError(t, err, out)
	require.Contains(t, out, "the database now records APP_SECRET")
	out, err = runCommand(t, []string{"secret", "reset", "--yes"}, env(secretB))
	require.NoError(t, err, out)
	require.Contains(t, out, "nothing was replaced")
	require.NoError(t, first.stop(t))
	third := startServer(t, service.RoleAPI, env(secretB))
	require.NoError(t, third.stop(t))
	requireSecretRefusal(t, startRefused(t, service.RoleAPI, env(secretA)), "APP_SECRET")

	// A reset on PostgreSQL needs APP_SECRET, as the server roles do.
	_, err = runCommand(t, []string{"secret", "reset", "--yes"}, map[string]string{"DATABASE_URL": databaseURL})
	require.ErrorContains(t, err, "APP_SECRET")
}
