// Package dbtest gives tests real, migrated stores of both engines: Postgres in a schema of its
// own in the database at TEST_DATABASE_URL, SQLite in a file under t.TempDir(). Use Engines to
// run one test body against both.
//
// When Postgres is unreachable, its tests skip, except under CI=true, where they fail.
package dbtest

import (
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/postgres"
	"github.com/postguard/postguard/db/sqlite"
)

// Engines runs fn as two parallel subtests, Postgres and SQLite. newStore(t) returns a migrated
// store of the subtest's engine with empty tables, closed when t ends; River is not configured
// (call ConfigureRiver). Call newStore from each subtest that needs its own data.
func Engines(t *testing.T, fn func(t *testing.T, newStore func(t *testing.T) db.Store)) {
	t.Helper()

	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		fn(t, func(t *testing.T) db.Store {
			t.Helper()
			return NewPostgres(t)
		})
	})
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		fn(t, func(t *testing.T) db.Store {
			t.Helper()
			return NewSQLite(t)
		})
	})
}

// EnginesUnmigrated is Engines with stores whose database has no migration applied (neither
// River's nor the app's), for tests of Migrate and CheckSchema.
func EnginesUnmigrated(t *testing.T, fn func(t *testing.T, newStore func(t *testing.T) db.Store)) {
	t.Helper()

	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		fn(t, func(t *testing.T) db.Store {
			t.Helper()
			return NewPostgresUnmigrated(t)
		})
	})
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		fn(t, func(t *testing.T) db.Store {
			t.Helper()
			return NewSQLiteUnmigrated(t)
		})
	})
}

// ConfigureRiver configures store's River client from config (nil is an insert-only client),
// after filling in a test logger when config has none and setting TestOnly.
func ConfigureRiver(t testing.TB, store db.Store, config *river.Config) {
	t.Helper()

	if config == nil {
		config = &river.Config{}
	}
	if config.Logger == nil {
		config.Logger = Logger(t)
	}
	config.TestOnly = true

	require.NoError(t, store.ConfigureRiver(config))
}

// Logger is a logger writing warnings and errors to the test's output.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// NewPostgres returns a store on a migrated schema of its own, with empty tables, closed when t
// ends. The schema is reused by later tests of the process once emptied; see PostgresURL.
func NewPostgres(t testing.TB) *postgres.Store {
	t.Helper()

	return openPostgres(t, PostgresURL(t))
}

// NewPostgresUnmigrated returns a store on a fresh, empty schema, closed and dropped when t ends.
func NewPostgresUnmigrated(t testing.TB) *postgres.Store {
	t.Helper()

	return openPostgres(t, newEmptySchemaURL(t))
}

// NewSQLite returns a migrated SQLite store on a new file under t.TempDir(), closed when t ends.
func NewSQLite(t testing.TB) *sqlite.Store {
	t.Helper()

	store := NewSQLiteUnmigrated(t)
	require.NoError(t, store.Migrate(t.Context()))
	return store
}

// NewSQLiteUnmigrated returns a SQLite store on a new, empty file under t.TempDir(), closed when t
// ends.
func NewSQLiteUnmigrated(t testing.TB) *sqlite.Store {
	t.Helper()

	return OpenSQLite(t, filepath.Join(t.TempDir(), "postguard.db"))
}

// OpenSQLite opens the SQLite database at path, without migrating it, and closes it when t ends
// (reopen a file to test what persists).
func OpenSQLite(t testing.TB, path string) *sqlite.Store {
	t.Helper()

	store, err := sqlite.Open(t.Context(), path, &sqlite.Config{Logger: Logger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, store.Close()) })
	return store
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails, per crypto/rand
	return hex.EncodeToString(b)
}
