package api

import (
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/dbtest"
	"github.com/postguard/postguard/db/sqlite"
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

// busySQLite is a migrated SQLite store of its own, with a short busy timeout, and another
// connection to its file (as another process would have) that can hold its write lock.
type busySQLite struct {
	store  db.Store
	holder *sql.Conn
}

func newBusySQLite(t *testing.T) *busySQLite {
	t.Helper()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "busy.db")
	engine, err := sqlite.NewEngine(ctx, path, &sqlite.Config{Logger: dbtest.Logger(t), BusyTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	store, err := db.NewStore(engine, &db.StoreConfig{Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, store.Close()) })
	require.NoError(t, store.Migrate(ctx))

	// The store registered the "sqlite" driver (modernc.org/sqlite).
	other, err := sql.Open("sqlite", path)
	require.NoError(t, err)
	t.Cleanup(func() { other.Close() })
	holder, err := other.Conn(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { holder.Close() })
	return &busySQLite{store: store, holder: holder}
}

// lock takes the file's write lock, and holds it past the store's busy timeout until unlock.
func (b *busySQLite) lock(t *testing.T) {
	t.Helper()
	_, err := b.holder.ExecContext(t.Context(), "BEGIN IMMEDIATE")
	require.NoError(t, err)
}

func (b *busySQLite) unlock(t *testing.T) {
	t.Helper()
	_, err := b.holder.ExecContext(t.Context(), "ROLLBACK")
	require.NoError(t, err)
}

// TestServer_SQLiteBusy: another connection to the file (as another process would) holds
// SQLite's write lock longer than the store's busy timeout. A registration then answers 503 with
// Retry-After once the busy timeout has passed: classified SQLITE_BUSY, not the end of the
// request's deadline, which is an hour here. /readyz says 503 too; once the lock is released the
// same router serves.
func TestServer_SQLiteBusy(t *testing.T) {
	t.Parallel()

	busy := newBusySQLite(t)
	bundle := setup(t, busy.store, &setupOpts{configFunc: func(config *Config) { config.RequestTimeout = time.Hour }})
	register(t, bundle.router, uniqueEmail("before"))

	busy.lock(t)
	requireOutage(t, bundle, serve(t, bundle.router, freshRegistration(t, "busy")))
	require.Contains(t, bundle.logs.String(), "SQLITE_BUSY")
	requireOutage(t, bundle, serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/readyz", nil)))

	busy.unlock(t)
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
