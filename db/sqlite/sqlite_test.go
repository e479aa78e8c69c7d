package sqlite_test

import (
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/dbtest"
	"github.com/postguard/postguard/db/sqlite"
)

// SQLite-only behaviour; what both engines share is in db's conformance suite.

func TestStore_AppSecret(t *testing.T) {
	t.Parallel()

	t.Run("StableAcrossReopen", func(t *testing.T) {
		t.Parallel()

		ctx := t.Context()
		path := filepath.Join(t.TempDir(), "postguard.db")

		store, err := sqlite.Open(ctx, path, nil)
		require.NoError(t, err)
		require.NoError(t, store.Migrate(ctx))

		secret, err := store.AppSecret(ctx)
		require.NoError(t, err)
		require.Len(t, secret, 32)

		again, err := store.AppSecret(ctx)
		require.NoError(t, err)
		require.Equal(t, secret, again)
		require.NoError(t, store.Close())

		reopened, err := dbtest.OpenSQLite(t, path).AppSecret(ctx)
		require.NoError(t, err)
		require.Equal(t, secret, reopened)
	})

	t.Run("RandomPerDatabase", func(t *testing.T) {
		t.Parallel()

		ctx := t.Context()

		secret1, err := dbtest.NewSQLite(t).AppSecret(ctx)
		require.NoError(t, err)
		secret2, err := dbtest.NewSQLite(t).AppSecret(ctx)
		require.NoError(t, err)
		require.NotEqual(t, secret1, secret2)
	})
}

func TestStore_CheckSchema(t *testing.T) {
	t.Parallel()

	ctx := t.Context()
	store := dbtest.NewSQLiteUnmigrated(t)
	migrator, err := rivermigrate.New(riversqlite.New(store.DB()), nil)
	require.NoError(t, err)

	_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	require.NoError(t, err)

	err = store.CheckSchema(ctx)
	require.ErrorIs(t, err, db.ErrSchemaBehind)
	require.ErrorContains(t, err, "the app's migrations are not applied")
	require.NotContains(t, err.Error(), "River")

	require.NoError(t, store.Migrate(ctx))
	require.NoError(t, store.CheckSchema(ctx))

	_, err = migrator.Migrate(ctx, rivermigrate.DirectionDown, nil)
	require.NoError(t, err)

	err = store.CheckSchema(ctx)
	require.ErrorIs(t, err, db.ErrSchemaBehind)
	require.ErrorContains(t, err, "River's migrations [")
}

func TestStore_Engine(t *testing.T) {
	t.Parallel()

	require.Equal(t, "sqlite", dbtest.NewSQLite(t).Engine())
}

func TestStore_Open(t *testing.T) {
	t.Parallel()

	t.Run("Connection", func(t *testing.T) {
		t.Parallel()

		ctx := t.Context()
		store := dbtest.NewSQLite(t)

		require.Equal(t, 1, store.DB().Stats().MaxOpenConnections)

		for pragma, want := range map[string]string{
			"busy_timeout": strconv.FormatInt(sqlite.BusyTimeoutDefault.Milliseconds(), 10),
			"foreign_keys": "1",
			"journal_mode": "wal",
			"synchronous":  "1", // NORMAL
		} {
			var got string
			require.NoError(t, store.DB().QueryRowContext(ctx, "PRAGMA "+pragma).Scan(&got))
			require.Equal(t, want, got, "PRAGMA %s", pragma)
		}
	})

	t.Run("InvalidPath", func(t *testing.T) {
		t.Parallel()

		_, err := sqlite.Open(t.Context(), "", nil)
		require.Error(t, err)

		_, err = sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "a?b.db"), nil)
		require.Error(t, err)

		_, err = sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "missing", "dir", "x.db"), nil)
		require.Error(t, err)
	})

	t.Run("KeepsDataAcrossReopen", func(t *testing.T) {
		t.Parallel()

		ctx := t.Context()
		path := filepath.Join(t.TempDir(), "postguard.db")
		now := time.Now().UTC().Truncate(time.Microsecond)

		store, err := sqlite.Open(ctx, path, nil)
		require.NoError(t, err)
		require.NoError(t, store.Migrate(ctx))
		user, err := store.UserInsert(ctx, &db.UserInsertParams{Email: "ada@example.com", Now: now, PasswordHash: "hash"})
		require.NoError(t, err)
		require.NoError(t, store.Close())

		reopened := dbtest.OpenSQLite(t, path)
		require.NoError(t, reopened.CheckSchema(ctx))

		got, err := reopened.UserGetByEmail(ctx, "ada@example.com")
		require.NoError(t, err)
		require.Equal(t, user, got)
	})
}
