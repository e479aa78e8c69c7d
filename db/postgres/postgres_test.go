package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/dbtest"
	"github.com/postguard/postguard/db/postgres"
	"github.com/postguard/postguard/db/postgres/dbsqlc"
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
				AND tablename IN ('goose_db_version', 'river_job', 'river_migration', 'users')`,
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

		// Migrate is waiting once a session is blocked by the one holding the lock.
		require.Eventually(t, func() bool {
			var waiting bool
			err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pg_backend_pid() = ANY (pg_blocking_pids(pid)))`).Scan(&waiting)
			return err == nil && waiting
		}, 10*time.Second, 10*time.Millisecond, "Migrate never waited for the lock")
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

	t.Run("Unreachable", func(t *testing.T) {
		t.Parallel()

		// Connections are lazy: NewEngine succeeds, Ping reports the database down.
		engine, err := postgres.NewEngine(t.Context(), "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2", nil)
		require.NoError(t, err)
		t.Cleanup(func() { engine.Close() })

		require.ErrorIs(t, engine.Ping(t.Context()), db.ErrUnavailable)
	})
}
