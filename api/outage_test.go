package api

import (
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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

// busySQLite is a migrated SQLite store of its own, with a short busy timeout, and another
// connection to its file (as another process would have) that can hold its write lock.
type busySQLite struct {
	store  riverstore.Store
	holder *sql.Conn
}

func newBusySQLite(t *testing.T) *busySQLite {
	t.Helper()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "busy.db")
	engine, err := sqlite.NewEngine(ctx, path, &sqlite.Config{Logger: dbtest.Logger(t), BusyTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	store, _, err := riverstore.New(engine, riversqlite.New(engine.DB()), &riverstore.Config{Logger: dbtest.Logger(t)})
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

// fillPool makes pool hold its most connections, every one idle: each is acquired while the
// ones before it are held, so each is a connection of its own.
func fillPool(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	conns := make([]*pgxpool.Conn, pool.Config().MaxConns)
	for i := range conns {
		conn, err := pool.Acquire(t.Context())
		require.NoError(t, err)
		conns[i] = conn
	}
	for _, conn := range conns {
		conn.Release()
	}
	require.Equal(t, pool.Config().MaxConns, pool.Stat().IdleConns())
}

// TestServer_PostgresEveryConnectionDead: every pooled connection of both pools (the main one
// and the rate-limit counters') is dead at once, as right after pg_terminate_backend of every
// backend, before their closes reach the service: the connections look alive, whatever their
// idle time, and fail their next statement. The one retry the rule allows runs on a connection
// the pool verified or dialled anew, so a registration, a rate-limited forgot-password and
// /readyz each succeed at the client's first try. The third review saw the retry take another
// pooled connection just as dead, and a 503.
func TestServer_PostgresEveryConnectionDead(t *testing.T) {
	t.Parallel()

	database := dbtest.NewPostgresDatabase(t)
	proxy := dbtest.NewProxy(t, dbtest.PostgresTarget(t))
	store := dbtest.OpenPostgres(t, proxy.URL(t, database.URL))
	bundle := setup(t, store, nil)

	// killAll leaves both pools full of dead connections that look alive.
	killAll := func(t *testing.T) {
		t.Helper()
		fillPool(t, store.Postgres.Pool())
		fillPool(t, store.Postgres.RateLimitPool())
		proxy.HoldCloses()
		database.TerminateBackends(t)
	}

	// metDead checks the request before it met dead connections: its first try, and at least
	// one more that the retry discarded.
	metDead := func(t *testing.T, before int) {
		t.Helper()
		require.GreaterOrEqual(t, proxy.LateCloses()-before, 2, "the first try and another pooled connection were dead")
	}

	for round := range 2 {
		killAll(t)
		before := proxy.LateCloses()
		rec := serve(t, bundle.router, freshRegistration(t, fmt.Sprintf("dead-%d", round)))
		require.Equal(t, http.StatusCreated, rec.Code, "round %d: %s\nlogs:\n%s", round, rec.Body.String(), bundle.logs)
		metDead(t, before)

		known := uniqueEmail("known")
		register(t, bundle.router, known)
		jobs := jobCount(t, bundle.store, "password_reset_email")
		killAll(t)
		before = proxy.LateCloses()
		req := jsonRequest(t, "/v1/auth/forgot-password", map[string]string{"email": known})
		req.RemoteAddr = fmt.Sprintf("198.51.100.%d:40000", round+1) // a budget of its own
		rec = serve(t, bundle.router, req)
		require.Equal(t, http.StatusAccepted, rec.Code, "round %d: %s\nlogs:\n%s", round, rec.Body.String(), bundle.logs)
		require.Equal(t, jobs+1, jobCount(t, bundle.store, "password_reset_email"), "the reset mail is queued")
		require.Regexp(t, `^"forgot-password-ip";r=999999;`, rec.Header().Get("RateLimit"), "spent once: the try on a dead connection reached nothing")
		metDead(t, before)

		killAll(t)
		before = proxy.LateCloses()
		require.Equal(t, http.StatusOK, serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/readyz", nil)).Code, "round %d", round)
		metDead(t, before)
	}
	require.NotContains(t, bundle.logs.String(), `"level":"ERROR"`)
}
