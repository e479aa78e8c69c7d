package db_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/postgres"
	"github.com/postguard/postguard/db/sqlite"
	"github.com/postguard/postguard/internal/dbtest"
)

// hostTables are postguard's tables on a handle a host app opened itself, with a table of the
// host's own beside them, as the Go library is used. Its methods run on the host's own handle
// (on PostgreSQL, a *sql.DB over the host's pgx pool).
type hostTables struct {
	tables db.Tables
	sqlDB  *sql.DB
	// tablesQuery lists the schema's tables, by name.
	tablesQuery string
}

// exec runs a statement on the host's own handle.
func (h *hostTables) exec(t *testing.T, query string) {
	t.Helper()
	_, err := h.sqlDB.ExecContext(t.Context(), query)
	require.NoError(t, err)
}

// count counts a table's rows through the host's own handle.
func (h *hostTables) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, h.sqlDB.QueryRowContext(t.Context(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

// tableNames lists the schema's tables.
func (h *hostTables) tableNames(t *testing.T) []string {
	t.Helper()
	rows, err := h.sqlDB.QueryContext(t.Context(), h.tablesQuery)
	require.NoError(t, err)
	defer rows.Close()
	var names []string
	for rows.Next() {
		var name string
		require.NoError(t, rows.Scan(&name))
		names = append(names, name)
	}
	require.NoError(t, rows.Err())
	return names
}

// hostEngines runs fn on Tables over a host's pgx pool (an empty schema of its own) and over a
// host's *sql.DB (a new SQLite file), neither migrated.
func hostEngines(t *testing.T, fn func(t *testing.T, newHost func(t *testing.T) *hostTables)) {
	t.Helper()

	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		fn(t, func(t *testing.T) *hostTables {
			t.Helper()
			pool, err := pgxpool.New(t.Context(), dbtest.PostgresEmptyURL(t))
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			engine, err := postgres.NewEngineFromPool(t.Context(), pool, &postgres.Config{Logger: dbtest.Logger(t)})
			require.NoError(t, err)
			tables := db.NewTables(engine, &db.TablesConfig{Logger: dbtest.Logger(t)})
			t.Cleanup(func() { require.NoError(t, tables.Close()) })
			sqlDB := stdlib.OpenDBFromPool(pool)
			t.Cleanup(func() { sqlDB.Close() })
			return &hostTables{
				tables:      tables,
				sqlDB:       sqlDB,
				tablesQuery: "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename",
			}
		})
	})
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		fn(t, func(t *testing.T) *hostTables {
			t.Helper()
			sqlDB, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "host.db")+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
			require.NoError(t, err)
			sqlDB.SetMaxOpenConns(1)
			t.Cleanup(func() { sqlDB.Close() })
			engine, err := sqlite.NewEngineFromDB(sqlDB, &sqlite.Config{Logger: dbtest.Logger(t)})
			require.NoError(t, err)
			tables := db.NewTables(engine, &db.TablesConfig{Logger: dbtest.Logger(t)})
			t.Cleanup(func() { require.NoError(t, tables.Close()) })
			return &hostTables{
				tables:      tables,
				sqlDB:       sqlDB,
				tablesQuery: "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
			}
		})
	})
}

func TestNewTables(t *testing.T) {
	t.Parallel()

	hostEngines(t, func(t *testing.T, newHost func(t *testing.T) *hostTables) {
		t.Run("MigrateTablesBesideTheHosts", func(t *testing.T) {
			t.Parallel()

			host := newHost(t)
			ctx := t.Context()
			// The host's goose records its own migrations in goose's default table, and the host
			// has a users table of its own.
			host.exec(t, "CREATE TABLE goose_db_version (id INTEGER PRIMARY KEY, version_id BIGINT NOT NULL, is_applied BOOLEAN NOT NULL, tstamp TIMESTAMP)")
			host.exec(t, "INSERT INTO goose_db_version (id, version_id, is_applied) VALUES (1, 0, TRUE), (2, 20260101000000, TRUE)")
			host.exec(t, "CREATE TABLE users (id INTEGER PRIMARY KEY, login TEXT NOT NULL)")
			host.exec(t, "INSERT INTO users (id, login) VALUES (1, 'ada')")

			opts := &db.MigrateOpts{Parts: []db.Part{db.PartLimiter, db.PartMail}}
			require.NoError(t, host.tables.MigrateTables(ctx, opts))
			require.NoError(t, host.tables.MigrateTables(ctx, opts), "idempotent")
			behind, err := host.tables.MigrationsBehind(ctx, opts)
			require.NoError(t, err)
			require.Empty(t, behind)

			require.Equal(t, []string{
				"email_messages", "email_suppressions", "email_tokens", "goose_db_version",
				"postguard_limiter_db_version", "postguard_mail_db_version", "rate_limit_counters",
				"rate_limit_device_revocations", "send_pacer", "users", "webhook_events",
			}, host.tableNames(t), "the parts' tables and goose tables, beside the host's: no River, no users or heartbeat of postguard's")
			require.Equal(t, 2, host.count(t, "goose_db_version"), "the host's own versions untouched")
			var login string
			require.NoError(t, host.sqlDB.QueryRowContext(ctx, "SELECT login FROM users WHERE id = 1").Scan(&login))
			require.Equal(t, "ada", login, "the host's own users table untouched")
		})

		t.Run("MigrateTablesLimiterOnly", func(t *testing.T) {
			t.Parallel()

			host := newHost(t)
			ctx := t.Context()
			opts := &db.MigrateOpts{Parts: []db.Part{db.PartLimiter}}
			behind, err := host.tables.MigrationsBehind(ctx, opts)
			require.NoError(t, err)
			require.Equal(t, []string{"postguard's limiter tables are not migrated"}, behind)
			require.Empty(t, host.tableNames(t), "MigrationsBehind only reads")

			require.NoError(t, host.tables.MigrateTables(ctx, opts))
			require.Equal(t, []string{"postguard_limiter_db_version", "rate_limit_counters", "rate_limit_device_revocations"}, host.tableNames(t))
			behind, err = host.tables.MigrationsBehind(ctx, opts)
			require.NoError(t, err)
			require.Empty(t, behind)

			// The other parts are not migrated, and say so.
			behind, err = host.tables.MigrationsBehind(ctx, &db.MigrateOpts{Parts: db.Parts()})
			require.NoError(t, err)
			require.Equal(t, []string{"postguard's service tables are not migrated", "postguard's mail tables are not migrated"}, behind)

			// Every statement of the limiter runs on its part alone: the chain of several windows
			// (its statement names no users table unless asked to read a user), the peek, the clear.
			windows := []db.RateLimitCounterConsumeParams{
				{KeyHash: tokenHash("ip"), WindowStart: now, WindowEnd: now.Add(time.Minute), LimitCount: 5},
				{KeyHash: tokenHash("key"), WindowStart: now, WindowEnd: now.Add(time.Minute), LimitCount: 5},
			}
			res, err := host.tables.RateLimitCounterConsumeChain(ctx, &db.RateLimitCounterChainParams{Windows: windows})
			require.NoError(t, err)
			require.Equal(t, []int64{1, 1}, res.Counts)
			peek := &db.RateLimitCounterWindowsParams{Windows: []db.RateLimitCounterGetParams{{KeyHash: tokenHash("ip"), WindowStart: now, WindowEnd: now.Add(time.Minute)}}}
			got, err := host.tables.RateLimitCounterGetMany(ctx, peek)
			require.NoError(t, err)
			require.Equal(t, []int64{1}, got.Counts)
			_, err = host.tables.RateLimitCounterRefund(ctx, peek)
			require.NoError(t, err)
			_, err = host.tables.RateLimitCounterDeleteMany(ctx, peek)
			require.NoError(t, err)
			// The trusted devices' revocations are the limiter's part too.
			require.NoError(t, host.tables.RateLimitDeviceRevocationUpsert(ctx, tokenHash("account")))
			_, err = host.tables.RateLimitDeviceRevocationGet(ctx, tokenHash("account"))
			require.NoError(t, err)
		})

		t.Run("MigrateTablesNamesItsParts", func(t *testing.T) {
			t.Parallel()

			host := newHost(t)
			ctx := t.Context()
			for _, opts := range []*db.MigrateOpts{nil, {}, {Parts: []db.Part{"counters"}}, {Parts: []db.Part{db.PartMail, db.PartMail}}} {
				require.Error(t, host.tables.MigrateTables(ctx, opts))
				_, err := host.tables.MigrationsBehind(ctx, opts)
				require.Error(t, err)
			}
			require.Empty(t, host.tableNames(t), "nothing migrated")
		})

		t.Run("CountersAndTransactions", func(t *testing.T) {
			t.Parallel()

			host := newHost(t)
			ctx := t.Context()
			require.NoError(t, host.tables.MigrateTables(ctx, &db.MigrateOpts{Parts: []db.Part{db.PartLimiter, db.PartMail}}))

			// The counters run, exact as ever.
			window := &db.RateLimitCounterConsumeParams{KeyHash: tokenHash("k"), WindowStart: now, WindowEnd: now.Add(15 * time.Minute), LimitCount: 2}
			for want := int64(1); want <= 2; want++ {
				count, ok, err := host.tables.RateLimitCounterConsume(ctx, window)
				require.NoError(t, err)
				require.True(t, ok)
				require.Equal(t, want, count)
			}
			_, ok, err := host.tables.RateLimitCounterConsume(ctx, window)
			require.NoError(t, err)
			require.False(t, ok)

			// Transact commits, or rolls back on an error.
			insertMessage := func(ctx context.Context, q db.Queries, jobID int64) error {
				_, err := q.EmailMessageInsert(ctx, &db.EmailMessageInsertParams{JobID: jobID, Kind: "welcome_email", UserID: 7, IdempotencyKey: fmt.Sprintf("welcome_email:7:%d", jobID), Now: now})
				return err
			}
			require.NoError(t, host.tables.Transact(ctx, func(ctx context.Context, q db.Queries) error { return insertMessage(ctx, q, 1) }))
			errBoom := errors.New("boom")
			err = host.tables.Transact(ctx, func(ctx context.Context, q db.Queries) error {
				require.NoError(t, insertMessage(ctx, q, 2))
				return errBoom
			})
			require.ErrorIs(t, err, errBoom)
			require.Equal(t, 1, host.count(t, "email_messages"))
			_, err = host.tables.EmailMessageGetByJob(ctx, 2)
			require.ErrorIs(t, err, db.ErrNotFound)
		})

		t.Run("CloseLeavesTheHostsHandleOpen", func(t *testing.T) {
			t.Parallel()

			host := newHost(t)
			require.NoError(t, host.tables.Close())
			host.exec(t, "CREATE TABLE still_open (id INTEGER)")
		})
	})
}

func TestNewEngineFromPool(t *testing.T) {
	t.Parallel()

	ctx := t.Context()
	pool, err := pgxpool.New(ctx, dbtest.PostgresURL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	t.Run("OwnRateLimitPool", func(t *testing.T) {
		t.Parallel()

		engine, err := postgres.NewEngineFromPool(ctx, pool, nil)
		require.NoError(t, err)
		require.Same(t, pool, engine.Pool())
		require.NotSame(t, pool, engine.RateLimitPool())
		var setting string
		require.NoError(t, engine.RateLimitPool().QueryRow(ctx, "SHOW synchronous_commit").Scan(&setting))
		require.Equal(t, "off", setting, "the counters' commits do not wait for their WAL flush")
		require.NoError(t, engine.Close())
		require.ErrorContains(t, engine.RateLimitPool().Ping(ctx), "closed pool")
		require.NoError(t, pool.Ping(ctx), "the host's pool stays open")
	})

	t.Run("GivenRateLimitPool", func(t *testing.T) {
		t.Parallel()

		engine, err := postgres.NewEngineFromPool(ctx, pool, &postgres.Config{RateLimitPool: pool})
		require.NoError(t, err)
		require.Same(t, pool, engine.RateLimitPool())
		require.NoError(t, engine.Close())
		require.NoError(t, pool.Ping(ctx))
	})

	t.Run("NilPool", func(t *testing.T) {
		t.Parallel()

		_, err := postgres.NewEngineFromPool(ctx, nil, nil)
		require.Error(t, err)
	})
}

func TestNewEngineFromDB(t *testing.T) {
	t.Parallel()

	sqlDB, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "host.db"))
	require.NoError(t, err)
	t.Cleanup(func() { sqlDB.Close() })
	engine, err := sqlite.NewEngineFromDB(sqlDB, nil)
	require.NoError(t, err)
	_, err = engine.AppSecret(t.Context())
	require.ErrorContains(t, err, "give APP_SECRET")
	require.NoError(t, engine.Close())
	require.NoError(t, sqlDB.Ping(), "the host's *sql.DB stays open")

	_, err = sqlite.NewEngineFromDB(nil, nil)
	require.Error(t, err)
}
