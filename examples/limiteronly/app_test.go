package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/postgres"
	"github.com/postguard/postguard/db/sqlite"
	"github.com/postguard/postguard/internal/dbtest"
)

// main.go links SQLite alone; the tests run the same app on PostgreSQL too, the way a host on
// PostgreSQL would build it (postgres.NewEngineFromPool on its own pool).

var testSecret = []byte("the limiter-only app's secret, 32 bytes or more")

type testBundle struct {
	app    *App
	sqlDB  *sql.DB
	tables db.Tables
	// tablesQuery lists the database's tables, by name.
	tablesQuery string
}

// engines runs fn on the app on a new SQLite file and on an empty PostgreSQL schema of its own.
func engines(t *testing.T, fn func(t *testing.T, setup func(t *testing.T) *testBundle)) {
	t.Helper()

	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		fn(t, func(t *testing.T) *testBundle {
			t.Helper()
			sqlDB, err := OpenSQLite(filepath.Join(t.TempDir(), "app.db"))
			require.NoError(t, err)
			t.Cleanup(func() { sqlDB.Close() })
			engine, err := sqlite.NewEngineFromDB(sqlDB, &sqlite.Config{Logger: dbtest.Logger(t)})
			require.NoError(t, err)
			return newBundle(t, sqlDB, goose.DialectSQLite3, db.NewTables(engine, &db.TablesConfig{Logger: dbtest.Logger(t)}),
				"SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")
		})
	})
	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		fn(t, func(t *testing.T) *testBundle {
			t.Helper()
			pool, err := pgxpool.New(t.Context(), dbtest.PostgresEmptyURL(t))
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			sqlDB := stdlib.OpenDBFromPool(pool)
			t.Cleanup(func() { sqlDB.Close() })
			engine, err := postgres.NewEngineFromPool(t.Context(), pool, &postgres.Config{Logger: dbtest.Logger(t)})
			require.NoError(t, err)
			tables := db.NewTables(engine, &db.TablesConfig{Logger: dbtest.Logger(t)})
			t.Cleanup(func() { require.NoError(t, tables.Close()) })
			return newBundle(t, sqlDB, goose.DialectPostgres, tables,
				"SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename")
		})
	})
}

// newBundle migrates the app as main does, its own migrations first, and builds it with the
// limiter's clock five minutes into a window.
func newBundle(t *testing.T, sqlDB *sql.DB, dialect goose.Dialect, tables db.Tables, tablesQuery string) *testBundle {
	t.Helper()
	ctx := t.Context()
	require.NoError(t, MigrateApp(ctx, sqlDB, dialect))
	rules, err := DefaultRules().WithEnviron([]string{"RATE_LIMIT_LOGIN_KEY=3/15m", "RATE_LIMIT_LOGIN_IP=8/15m"})
	require.NoError(t, err)
	limiter, err := NewLimiter(ctx, &LimiterConfig{
		Tables:  tables,
		Secret:  testSecret,
		Rules:   rules,
		Logger:  dbtest.Logger(t),
		NowFunc: func() time.Time { return time.Date(2026, 3, 1, 10, 5, 0, 0, time.UTC) },
	})
	require.NoError(t, err)
	app, err := NewApp(&Config{DB: sqlDB, Limiter: limiter, Logger: dbtest.Logger(t), BcryptCost: bcrypt.MinCost})
	require.NoError(t, err)
	return &testBundle{app: app, sqlDB: sqlDB, tables: tables, tablesQuery: tablesQuery}
}

func (b *testBundle) post(t *testing.T, path, ip, email, password string) *httptest.ResponseRecorder {
	t.Helper()
	data, err := json.Marshal(map[string]string{"email": email, "password": password})
	require.NoError(t, err)
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	req.RemoteAddr = ip + ":40000"
	rec := httptest.NewRecorder()
	b.app.Router.ServeHTTP(rec, req)
	return rec
}

func (b *testBundle) strings(t *testing.T, query string) []string {
	t.Helper()
	rows, err := b.sqlDB.QueryContext(t.Context(), query)
	require.NoError(t, err)
	defer rows.Close()
	var values []string
	for rows.Next() {
		var value string
		require.NoError(t, rows.Scan(&value))
		values = append(values, value)
	}
	require.NoError(t, rows.Err())
	return values
}

// requireRefused checks a 429 of the limiter, by policy.
func requireRefused(t *testing.T, rec *httptest.ResponseRecorder, policy string) {
	t.Helper()
	require.Equal(t, http.StatusTooManyRequests, rec.Code, rec.Body.String())
	require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
	require.Equal(t, "600", rec.Header().Get("Retry-After"))
	require.Equal(t, `"`+policy+`";r=0;t=600`, rec.Header().Get("RateLimit"))
}

func TestMigrate(t *testing.T) {
	t.Parallel()

	engines(t, func(t *testing.T, setup func(t *testing.T) *testBundle) {
		t.Run("BesideTheAppsOwnTables", func(t *testing.T) {
			t.Parallel()

			b := setup(t)
			// postguard's counters (and its trusted devices' revocations) and its own goose table,
			// beside the app's users and goose_db_version: nothing else of postguard's, no River.
			require.Equal(t, []string{"goose_db_version", "postguard_limiter_db_version", "rate_limit_counters", "rate_limit_device_revocations", "users"},
				b.strings(t, b.tablesQuery))

			// The app's goose history is its own: version 0 and its one migration.
			require.Equal(t, []string{"0", "1"}, b.strings(t, "SELECT version_id FROM goose_db_version ORDER BY id"))
			limiterVersions := []string{"0", "1", "2"}
			if b.tables.Engine() == "sqlite" { // 3: the counters as a rowid table; 4: in window order
				limiterVersions = append(limiterVersions, "3", "4")
			}
			require.Equal(t, limiterVersions, b.strings(t, "SELECT version_id FROM postguard_limiter_db_version ORDER BY id"))

			// Both migrate again as nothing: the app's and postguard's.
			ctx := t.Context()
			dialect := goose.DialectPostgres
			if b.tables.Engine() == "sqlite" {
				dialect = goose.DialectSQLite3
			}
			require.NoError(t, MigrateApp(ctx, b.sqlDB, dialect))
			require.NoError(t, b.tables.MigrateTables(ctx, &db.MigrateOpts{Parts: []db.Part{db.PartLimiter}}))
			behind, err := b.tables.MigrationsBehind(ctx, &db.MigrateOpts{Parts: []db.Part{db.PartLimiter}})
			require.NoError(t, err)
			require.Empty(t, behind)
			require.Equal(t, []string{"0", "1"}, b.strings(t, "SELECT version_id FROM goose_db_version ORDER BY id"))
		})

		t.Run("SignUpIntoTheAppsUsers", func(t *testing.T) {
			t.Parallel()

			b := setup(t)
			require.Equal(t, http.StatusCreated, b.post(t, "/signup", "192.0.2.1", "ada@example.com", "correct horse").Code)
			require.Equal(t, http.StatusConflict, b.post(t, "/signup", "192.0.2.1", "ADA@example.com", "correct horse").Code)
			require.Equal(t, []string{"ada@example.com"}, b.strings(t, "SELECT email FROM users"))
		})
	})
}

func TestApp_Login(t *testing.T) {
	t.Parallel()

	const keyLimit, ipLimit = 3, 8

	engines(t, func(t *testing.T, setup func(t *testing.T) *testBundle) {
		t.Run("AttemptsLockTheAccount", func(t *testing.T) {
			t.Parallel()

			b := setup(t)
			require.Equal(t, http.StatusCreated, b.post(t, "/signup", "192.0.2.1", "ada@example.com", "correct horse").Code)
			for range keyLimit {
				require.Equal(t, http.StatusUnauthorized, b.post(t, "/login", "198.51.100.7", "ada@example.com", "wrong guess").Code)
			}
			// Every attempt counted: the next is refused, right password or not, from any IP.
			requireRefused(t, b.post(t, "/login", "198.51.100.7", "ada@example.com", "correct horse"), "login-key")
			requireRefused(t, b.post(t, "/login", "203.0.113.50", "ada@example.com", "correct horse"), "login-key")

			// An email without an account is counted the same: the answers do not tell.
			for range keyLimit {
				require.Equal(t, http.StatusUnauthorized, b.post(t, "/login", "198.51.100.9", "nobody@example.com", "wrong guess").Code)
			}
			requireRefused(t, b.post(t, "/login", "198.51.100.9", "nobody@example.com", "wrong guess"), "login-key")
		})

		t.Run("RightPasswordForgetsTheAccountsAttempts", func(t *testing.T) {
			t.Parallel()

			b := setup(t)
			require.Equal(t, http.StatusCreated, b.post(t, "/signup", "192.0.2.1", "ada@example.com", "correct horse").Code)
			for range keyLimit - 1 {
				require.Equal(t, http.StatusUnauthorized, b.post(t, "/login", "198.51.100.7", "ada@example.com", "wrong guess").Code)
			}
			require.Equal(t, http.StatusOK, b.post(t, "/login", "198.51.100.7", "ada@example.com", "correct horse").Code)
			// Forgotten: the account has its whole budget again (without the clear, the second of
			// these would be refused).
			for range keyLimit {
				require.Equal(t, http.StatusUnauthorized, b.post(t, "/login", "198.51.100.8", "ada@example.com", "wrong guess").Code)
			}
			requireRefused(t, b.post(t, "/login", "198.51.100.8", "ada@example.com", "correct horse"), "login-key")
		})

		t.Run("IPRuleHoldsAcrossAccounts", func(t *testing.T) {
			t.Parallel()

			b := setup(t)
			const sprayer = "203.0.113.66"
			for i := range ipLimit {
				require.Equal(t, http.StatusUnauthorized, b.post(t, "/login", sprayer, fmt.Sprintf("user%d@example.com", i), "Summer2026!").Code)
			}
			requireRefused(t, b.post(t, "/login", sprayer, "user99@example.com", "Summer2026!"), "login-ip")
		})

		t.Run("CountersHoldNoRawKeyOrIP", func(t *testing.T) {
			t.Parallel()

			b := setup(t)
			b.post(t, "/login", "198.51.100.7", "ada@example.com", "wrong guess")
			var n int
			require.NoError(t, b.sqlDB.QueryRowContext(t.Context(), "SELECT count(*) FROM rate_limit_counters").Scan(&n))
			require.Equal(t, 2, n, "the IP's counter and the account's")
			hex := "encode(key_hash, 'hex')"
			if b.tables.Engine() == "sqlite" {
				hex = "hex(key_hash)"
			}
			for _, key := range b.strings(t, "SELECT "+hex+" FROM rate_limit_counters") {
				require.Len(t, key, 64, "an HMAC-SHA-256 of the key, not the email or the IP")
			}
		})
	})
}

// TestPruneCounters: the app prunes its limiter's expired counters itself (nothing else would),
// in batches, keeping those whose window ended within counterRetention.
func TestPruneCounters(t *testing.T) {
	t.Parallel()

	engines(t, func(t *testing.T, setup func(t *testing.T) *testBundle) {
		t.Run("ExpiredOnly", func(t *testing.T) {
			t.Parallel()

			b := setup(t)
			// The limiter's clock is 10:05, in the window 10:00–10:15: two counters (IP, account).
			b.post(t, "/login", "198.51.100.7", "ada@example.com", "wrong guess")
			windowEnd := time.Date(2026, 3, 1, 10, 15, 0, 0, time.UTC)
			var logs bytes.Buffer
			p := &pruner{tables: b.tables, logger: slog.New(slog.NewTextHandler(&logs, nil))}

			p.now = func() time.Time { return windowEnd.Add(counterRetention) }
			p.once(t.Context())
			require.Equal(t, 2, b.counters(t), "kept while their window ended within counterRetention")

			p.now = func() time.Time { return windowEnd.Add(counterRetention + time.Microsecond) }
			p.once(t.Context())
			require.Zero(t, b.counters(t), "pruned once past it")
			require.Contains(t, logs.String(), "rate-limit counters pruned")
			require.Contains(t, logs.String(), "deleted=2")
		})

		t.Run("InBatches", func(t *testing.T) {
			t.Parallel()

			b := setup(t)
			// More than a batch of expired counters, and one within retention.
			windowEnd := time.Date(2026, 3, 1, 10, 15, 0, 0, time.UTC)
			spend := func(key []byte, end time.Time) {
				_, ok, err := b.tables.RateLimitCounterConsume(t.Context(), &db.RateLimitCounterConsumeParams{
					KeyHash: key, WindowStart: end.Add(-15 * time.Minute), WindowEnd: end, LimitCount: 5,
				})
				require.NoError(t, err)
				require.True(t, ok)
			}
			for i := range pruneBatchSize + 1 {
				spend(fmt.Appendf(nil, "key %d", i), windowEnd)
			}
			spend([]byte("kept"), windowEnd.Add(time.Hour))
			n, err := PruneCounters(t.Context(), b.tables, windowEnd.Add(time.Microsecond))
			require.NoError(t, err)
			require.Equal(t, int64(pruneBatchSize+1), n)
			require.Equal(t, 1, b.counters(t))
		})
	})
}

// counters counts the limiter's rows.
func (b *testBundle) counters(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.sqlDB.QueryRowContext(t.Context(), "SELECT count(*) FROM rate_limit_counters").Scan(&n))
	return n
}

func TestRun(t *testing.T) {
	t.Parallel()

	t.Run("PrunesCounters", func(t *testing.T) {
		t.Parallel()

		// The app's database with a counter whose window ended an hour ago, and one still open.
		path := filepath.Join(t.TempDir(), "app.db")
		sqlDB, err := OpenSQLite(path)
		require.NoError(t, err)
		t.Cleanup(func() { sqlDB.Close() })
		require.NoError(t, MigrateApp(t.Context(), sqlDB, goose.DialectSQLite3))
		engine, err := sqlite.NewEngineFromDB(sqlDB, &sqlite.Config{Logger: dbtest.Logger(t)})
		require.NoError(t, err)
		tables := db.NewTables(engine, &db.TablesConfig{Logger: dbtest.Logger(t)})
		_, err = NewLimiter(t.Context(), &LimiterConfig{Tables: tables, Secret: testSecret})
		require.NoError(t, err)
		now := time.Now().UTC().Truncate(time.Second)
		for key, end := range map[string]time.Time{"expired": now.Add(-time.Hour), "open": now.Add(10 * time.Minute)} {
			_, ok, err := tables.RateLimitCounterConsume(t.Context(), &db.RateLimitCounterConsumeParams{
				KeyHash: []byte(key), WindowStart: end.Add(-15 * time.Minute), WindowEnd: end, LimitCount: 5,
			})
			require.NoError(t, err)
			require.True(t, ok)
		}
		b := &testBundle{sqlDB: sqlDB}
		require.Equal(t, 2, b.counters(t))

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			done <- run(ctx, []string{"DATABASE_PATH=" + path, "APP_SECRET=" + string(testSecret), "HTTP_ADDR=127.0.0.1:0"})
		}()
		require.Eventually(t, func() bool { return b.counters(t) == 1 }, 30*time.Second, 10*time.Millisecond,
			"the app's start prunes the expired counter, and only it")
		cancel()
		require.NoError(t, <-done)
	})

	for name, secret := range map[string]string{"Missing": "", "Short": "abc"} {
		t.Run(name+"Secret", func(t *testing.T) {
			t.Parallel()

			err := run(t.Context(), []string{"DATABASE_PATH=" + filepath.Join(t.TempDir(), "app.db"), "APP_SECRET=" + secret, "HTTP_ADDR=127.0.0.1:0"})
			require.ErrorContains(t, err, "error setting up the login's limiter: abuse.NewLimiter: secret too short")
		})
	}
}
