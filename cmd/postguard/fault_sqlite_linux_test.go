//go:build linux

package main

import (
	"net/http"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestServe_SQLiteIOError runs `postguard serve` (the built binary) on SQLite and then lowers
// the process's file-size limit (RLIMIT_FSIZE, set from outside with prlimit(2)) below the size
// of its database files: every write the kernel refuses with EFBIG reaches SQLite as an I/O
// error (SQLITE_IOERR_WRITE), as a failing disk's would. Registrations then answer 503 with
// Retry-After, not 500, and /readyz says 503; with the limit lifted the same process serves.
func TestServe_SQLiteIOError(t *testing.T) {
	t.Parallel()

	serve := startProcess(t, "serve", map[string]string{
		"DATABASE_URL":              "sqlite://" + filepath.Join(t.TempDir(), "postguard.db"),
		"APP_SECRET":                faultSecret,
		"MAILER":                    "none",
		"RATE_LIMIT_REGISTER_IP":    "1000000/1h",
		"RATE_LIMIT_REGISTER_EMAIL": "1000000/1h",
	})
	require.Equal(t, http.StatusCreated, call(t, serve.URL, http.MethodPost, "/v1/auth/register", registerBody("before")).status)

	setFileSizeLimit := func(limit uint64) {
		t.Helper()
		// Max stays unlimited, so an unprivileged process may raise the limit back.
		require.NoError(t, unix.Prlimit(serve.cmd.Process.Pid, unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: limit, Max: unix.RLIM_INFINITY}, nil))
	}
	// Far below the database file and its WAL: every write past the first KiB of a file fails.
	setFileSizeLimit(1024)
	t.Cleanup(func() { setFileSizeLimit(unix.RLIM_INFINITY) })

	requireOutage(t, call(t, serve.URL, http.MethodPost, "/v1/auth/register", registerBody("ioerr")), serve.Logs)
	requireOutage(t, call(t, serve.URL, http.MethodGet, "/readyz", ""), serve.Logs)
	require.Contains(t, serve.Logs.String(), "disk I/O error")

	setFileSizeLimit(unix.RLIM_INFINITY)
	require.Equal(t, http.StatusCreated, call(t, serve.URL, http.MethodPost, "/v1/auth/register", registerBody("after")).status)
	require.Equal(t, http.StatusOK, call(t, serve.URL, http.MethodGet, "/readyz", "").status)
}
