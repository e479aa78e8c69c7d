package api

import (
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db/sqlite"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
)

// requireOutage checks rec is the answer to an outage, 503 with Retry-After, logged as one (at
// warn level, not as an internal error).
func requireOutage(t *testing.T, bundle *testBundle, rec *httptest.ResponseRecorder) {
	t.Helper()

	decodeProblem(t, rec, http.StatusServiceUnavailable)
	require.Equal(t, "5", rec.Header().Get("Retry-After"))
	require.NotContains(t, bundle.logs.String(), `"level":"ERROR"`)
}

// freshRegistration is a valid registration of a new email.
func freshRegistration(t *testing.T, prefix string) *http.Request {
	t.Helper()
	return jsonRequest(t, "/v1/auth/register", map[string]string{"email": uniqueEmail(prefix), "password": "correct horse battery"})
}

// TestServer_SQLiteBusy: another connection to the file (as another process would) holds
// SQLite's write lock longer than the store's busy timeout. A registration then answers 503 with
// Retry-After once the busy timeout has passed: classified SQLITE_BUSY, not the end of the
// request's deadline, which is an hour here. /readyz says 503 too; once the lock is released the
// same router serves.
func TestServer_SQLiteBusy(t *testing.T) {
	t.Parallel()

	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "busy.db")
	engine, err := sqlite.NewEngine(ctx, path, &sqlite.Config{Logger: dbtest.Logger(t), BusyTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	store, _, err := riverstore.New(engine, riversqlite.New(engine.DB()), &riverstore.Config{Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, store.Close()) })
	require.NoError(t, store.Migrate(ctx))
	bundle := setup(t, store, &setupOpts{configFunc: func(config *Config) { config.RequestTimeout = time.Hour }})
	register(t, bundle.router, uniqueEmail("before"))

	// The store registered the "sqlite" driver (modernc.org/sqlite).
	other, err := sql.Open("sqlite", path)
	require.NoError(t, err)
	t.Cleanup(func() { other.Close() })
	holder, err := other.Conn(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { holder.Close() })
	_, err = holder.ExecContext(ctx, "BEGIN IMMEDIATE")
	require.NoError(t, err)

	requireOutage(t, bundle, serve(t, bundle.router, freshRegistration(t, "busy")))
	require.Contains(t, bundle.logs.String(), "SQLITE_BUSY")
	requireOutage(t, bundle, serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/readyz", nil)))

	_, err = holder.ExecContext(ctx, "ROLLBACK")
	require.NoError(t, err)
	register(t, bundle.router, uniqueEmail("after"))
	require.Equal(t, http.StatusOK, serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/readyz", nil)).Code)
}

// TestServer_SQLiteFull: the database may not grow (max_page_count at its size: what a full disk
// is to SQLite). /readyz says 503 at once, though the heartbeat itself still fits in the pages
// the file has; registrations go on while their rows fit in free space, and the first that
// needs a page answers 503 with Retry-After (SQLITE_FULL), not 500. With room again, the same
// router serves.
func TestServer_SQLiteFull(t *testing.T) {
	t.Parallel()

	ctx := t.Context()
	store := dbtest.NewSQLite(t)
	bundle := setup(t, store, nil)
	register(t, bundle.router, uniqueEmail("before"))

	// No free pages (migrations drop tables, which leaves some), then max_page_count at the
	// file's size: max_page_count belongs to the connection, and the store has exactly one.
	_, err := store.SQLite.DB().ExecContext(ctx, "VACUUM")
	require.NoError(t, err)
	var pages int64
	require.NoError(t, store.SQLite.DB().QueryRowContext(ctx, "PRAGMA page_count").Scan(&pages))
	_, err = store.SQLite.DB().ExecContext(ctx, fmt.Sprintf("PRAGMA max_page_count = %d", pages))
	require.NoError(t, err)

	requireOutage(t, bundle, serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/readyz", nil)))

	// Each registration adds rows (a user, two jobs, counters), so one soon needs a page.
	full := false
	for i := 0; i < 1000 && !full; i++ {
		rec := serve(t, bundle.router, freshRegistration(t, fmt.Sprintf("fill-%d", i)))
		if rec.Code == http.StatusCreated {
			continue
		}
		requireOutage(t, bundle, rec)
		full = true
	}
	require.True(t, full, "1000 registrations fitted in a database that cannot grow")
	require.Contains(t, bundle.logs.String(), "database or disk is full (13)")

	_, err = store.SQLite.DB().ExecContext(ctx, fmt.Sprintf("PRAGMA max_page_count = %d", 1<<30))
	require.NoError(t, err)
	register(t, bundle.router, uniqueEmail("after"))
	require.Equal(t, http.StatusOK, serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/readyz", nil)).Code)
}
