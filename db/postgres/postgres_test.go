package postgres_test

import (
	"context"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/postgres"
	"github.com/postguard/postguard/db/postgres/dbsqlc"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
)

// Postgres-only behaviour; what both engines share is in db's conformance suite.

func TestStore_Migrate(t *testing.T) {
	t.Parallel()

	t.Run("Concurrent", func(t *testing.T) {
		t.Parallel()

		store := dbtest.NewPostgresUnmigrated(t)
		ctx := t.Context()
		other := dbtest.OpenPostgres(t, store.Postgres.Pool().Config().ConnString())

		// Without the lock, both would apply River's first migration and one would fail.
		var (
			wg   sync.WaitGroup
			errs [2]error
		)
		wg.Go(func() { errs[0] = store.Migrate(ctx) })
		wg.Go(func() { errs[1] = other.Migrate(ctx) })
		wg.Wait()
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])

		require.NoError(t, store.CheckSchema(ctx))
	})

	t.Run("SchemaFromSearchPath", func(t *testing.T) {
		t.Parallel()

		ctx := t.Context()
		store := dbtest.NewPostgres(t)

		var (
			schema string
			tables int
		)
		require.NoError(t, store.Postgres.Pool().QueryRow(ctx, `
			SELECT current_schema(), count(*)
			FROM pg_tables
			WHERE schemaname = current_schema()
				AND tablename IN ('postguard_service_db_version', 'river_job', 'river_migration', 'users')`,
		).Scan(&schema, &tables))
		require.Regexp(t, `^pgtest_`, schema)
		require.Equal(t, 4, tables)
	})

	t.Run("WaitsForLock", func(t *testing.T) {
		t.Parallel()

		ctx := t.Context()
		store := dbtest.NewPostgresUnmigrated(t)

		// Another deploy holds the lock.
		conn, err := pgx.ConnectConfig(ctx, store.Postgres.Pool().Config().ConnConfig)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close(context.Background()) })
		require.NoError(t, dbsqlc.New().MigrationLock(ctx, conn))

		done := make(chan error, 1)
		go func() { done <- store.Migrate(ctx) }()

		// Migrate waits in PostgreSQL, blocked by the other deploy's session, until it lets go.
		for blocked := 0; blocked == 0; {
			select {
			case err := <-done:
				require.FailNow(t, "Migrate did not wait for the lock", "err: %v", err)
			default:
			}
			require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`,
				conn.PgConn().PID()).Scan(&blocked))
		}
		select {
		case err := <-done:
			require.FailNow(t, "Migrate did not wait for the lock", "err: %v", err)
		default:
		}

		require.NoError(t, dbsqlc.New().MigrationUnlock(ctx, conn))

		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			require.FailNow(t, "Migrate did not finish after the lock was released")
		}
		require.NoError(t, store.CheckSchema(ctx))
	})
}

func TestNewEngine(t *testing.T) {
	t.Parallel()

	t.Run("Pools", func(t *testing.T) {
		t.Parallel()

		ctx := t.Context()
		engine, err := postgres.NewEngine(ctx, dbtest.DatabaseURL(t), &postgres.Config{MaxConns: 3, RateLimitMaxConns: 2})
		require.NoError(t, err)
		t.Cleanup(func() { engine.Close() })

		require.Equal(t, int32(3), engine.Pool().Config().MaxConns)
		require.Equal(t, int32(2), engine.RateLimitPool().Config().MaxConns)

		// Only the rate-limit pool gives up waiting for WAL flushes.
		var setting string
		require.NoError(t, engine.Pool().QueryRow(ctx, "SHOW synchronous_commit").Scan(&setting))
		require.Equal(t, "on", setting)
		require.NoError(t, engine.RateLimitPool().QueryRow(ctx, "SHOW synchronous_commit").Scan(&setting))
		require.Equal(t, "off", setting)
	})

	t.Run("PoolsDefault", func(t *testing.T) {
		t.Parallel()

		engine, err := postgres.NewEngine(t.Context(), "postgres://postgres@127.0.0.1:5432/test", nil)
		require.NoError(t, err)
		t.Cleanup(func() { engine.Close() })

		require.Equal(t, int32(postgres.RateLimitMaxConnsDefault), engine.RateLimitPool().Config().MaxConns)
	})

	t.Run("InvalidURL", func(t *testing.T) {
		t.Parallel()

		_, err := postgres.NewEngine(t.Context(), "postgres://%zz", nil)
		require.Error(t, err)
	})

	t.Run("ConnectTimeout", func(t *testing.T) {
		t.Parallel()

		engine, err := postgres.NewEngine(t.Context(), dbtest.DatabaseURL(t), nil)
		require.NoError(t, err)
		t.Cleanup(func() { engine.Close() })
		require.Equal(t, postgres.ConnectTimeoutDefault, engine.Pool().Config().ConnConfig.ConnectTimeout)
		require.Equal(t, postgres.ConnectTimeoutDefault, engine.RateLimitPool().Config().ConnConfig.ConnectTimeout)

		// The URL's own connect_timeout wins.
		u, err := url.Parse(dbtest.DatabaseURL(t))
		require.NoError(t, err)
		query := u.Query()
		query.Set("connect_timeout", "17")
		u.RawQuery = query.Encode()
		engine, err = postgres.NewEngine(t.Context(), u.String(), &postgres.Config{ConnectTimeout: time.Second})
		require.NoError(t, err)
		t.Cleanup(func() { engine.Close() })
		require.Equal(t, 17*time.Second, engine.Pool().Config().ConnConfig.ConnectTimeout)
	})

	t.Run("BlackholedConnectEnds", func(t *testing.T) {
		t.Parallel()

		// A server that accepts connections and never answers (packets dropped past the TCP
		// handshake): only the connect timeout ends the attempt, whatever the caller's context.
		listener, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { listener.Close() })
		go func() {
			for {
				conn, err := listener.Accept()
				if err != nil {
					return
				}
				t.Cleanup(func() { conn.Close() })
			}
		}()

		engine, err := postgres.NewEngine(t.Context(), "postgres://postgres@"+listener.Addr().String()+"/test?sslmode=disable",
			&postgres.Config{ConnectTimeout: 100 * time.Millisecond})
		require.NoError(t, err)
		t.Cleanup(func() { engine.Close() })

		done := make(chan error, 1)
		go func() { done <- engine.Ready(context.Background()) }()
		select {
		case err := <-done:
			require.ErrorIs(t, err, db.ErrUnavailable)
		case <-time.After(30 * time.Second):
			require.FailNow(t, "a connection that is never answered held Ready")
		}
	})

	t.Run("Unreachable", func(t *testing.T) {
		t.Parallel()

		// Connections are lazy: NewEngine succeeds, Ready reports the database down.
		engine, err := postgres.NewEngine(t.Context(), "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2", nil)
		require.NoError(t, err)
		t.Cleanup(func() { engine.Close() })

		require.ErrorIs(t, engine.Ready(t.Context()), db.ErrUnavailable)
	})
}

func TestStore_InTx(t *testing.T) {
	t.Parallel()

	// The transaction's connection is terminated (a restart, pg_terminate_backend) after it wrote
	// and before it committed: PostgreSQL rolled it back, so it runs again, once, on a fresh
	// connection, and its write is there exactly once.
	t.Run("LostBeforeCommitRunsAgain", func(t *testing.T) {
		t.Parallel()

		ctx := t.Context()
		database := dbtest.NewPostgresDatabase(t)
		store := dbtest.OpenPostgres(t, database.URL)

		var calls int
		err := store.InTx(ctx, func(ctx context.Context, tx riverstore.Tx) error {
			calls++
			if _, err := tx.UserInsert(ctx, &db.UserInsertParams{Email: "lost@example.com", PasswordHash: "x", Now: time.Now()}); err != nil {
				return err
			}
			if calls == 1 {
				database.TerminateBackends(t)
			}
			_, err := tx.UserGetByEmail(ctx, "lost@example.com")
			return err
		})
		require.NoError(t, err)
		require.Equal(t, 2, calls)

		user, err := store.UserGetByEmail(ctx, "lost@example.com")
		require.NoError(t, err)
		var count int
		require.NoError(t, store.Postgres.Pool().QueryRow(ctx, "SELECT count(*) FROM users WHERE id = $1", user.ID).Scan(&count))
		require.Equal(t, 1, count)
	})

	// A transaction that failed for its own reasons is not run again.
	t.Run("OwnErrorNotRetried", func(t *testing.T) {
		t.Parallel()

		store := dbtest.NewPostgres(t)
		var calls int
		err := store.InTx(t.Context(), func(ctx context.Context, tx riverstore.Tx) error {
			calls++
			_, err := tx.UserGetByID(ctx, 424242)
			return err
		})
		require.ErrorIs(t, err, db.ErrNotFound)
		require.Equal(t, 1, calls)
	})
}
