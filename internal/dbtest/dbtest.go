// Package dbtest gives tests real, migrated stores of both engines: PostgreSQL in a schema of its
// own in the database at TEST_DATABASE_URL, SQLite in a file under t.TempDir(). Use Engines to run
// one test body against both, and Work to run a River worker on either with rivertest.
//
// When PostgreSQL is unreachable, its tests skip, except under CI=true, where they fail.
package dbtest

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"io/fs"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/postgres"
	"github.com/postguard/postguard/db/sqlite"
	"github.com/postguard/postguard/internal/riverstore"
)

// Store is a test's store, with what Work needs to run River workers on its database.
type Store struct {
	riverstore.Store

	// Postgres and SQLite are the engine under the store; one of them is nil.
	Postgres *postgres.Engine
	SQLite   *sqlite.Engine

	// sqliteRiver holds the River tables of Work's jobs on SQLite (see Work).
	sqliteRiver *sqliteRiver
}

// Option changes how a test's store is built.
type Option func(config *riverstore.Config)

// WithRiverConfig builds the store's River client from fn (the default is insert-only). River's
// TestOnly is set on the config fn returns, and a test logger when it has none.
func WithRiverConfig(fn func(store riverstore.Store) (*river.Config, error)) Option {
	return func(config *riverstore.Config) {
		config.RiverConfigFunc = func(store riverstore.Store) (*river.Config, error) {
			riverConfig, err := fn(store)
			if err != nil {
				return nil, err
			}
			riverConfig.TestOnly = true
			return riverConfig, nil
		}
	}
}

// NewStoreFunc returns a migrated store of one engine with empty tables, closed when t ends.
type NewStoreFunc func(t testing.TB, opts ...Option) *Store

// Engines runs fn as two parallel subtests, Postgres and SQLite, each given the NewStoreFunc of
// its engine. Call newStore from each subtest that needs its own data.
func Engines(t *testing.T, fn func(t *testing.T, newStore NewStoreFunc)) {
	t.Helper()

	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		fn(t, NewPostgres)
	})
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		fn(t, NewSQLite)
	})
}

// EnginesUnmigrated is Engines with stores whose database has no migration applied (neither
// River's nor the app's), for tests of Migrate and CheckSchema.
func EnginesUnmigrated(t *testing.T, fn func(t *testing.T, newStore NewStoreFunc)) {
	t.Helper()

	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		fn(t, NewPostgresUnmigrated)
	})
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		fn(t, NewSQLiteUnmigrated)
	})
}

// Logger is a logger writing warnings and errors to the test's output.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// NewPostgres returns a store on a migrated schema of its own, with empty tables, closed when t
// ends. The schema is reused by later tests of the process once emptied; see PostgresURL.
func NewPostgres(t testing.TB, opts ...Option) *Store {
	t.Helper()

	return OpenPostgres(t, PostgresURL(t), opts...)
}

// NewPostgresUnmigrated returns a store on a fresh, empty schema, closed and dropped when t ends.
func NewPostgresUnmigrated(t testing.TB, opts ...Option) *Store {
	t.Helper()

	return OpenPostgres(t, newEmptySchemaURL(t), opts...)
}

// OpenPostgres opens a store on databaseURL (a schema URL of this package), closed when t ends.
func OpenPostgres(t testing.TB, databaseURL string, opts ...Option) *Store {
	t.Helper()

	engine, err := postgres.NewEngine(t.Context(), databaseURL, &postgres.Config{Logger: Logger(t)})
	require.NoError(t, err)
	return newStore(t, &Store{Postgres: engine}, engine, riverpgxv5.New(engine.Pool()), opts)
}

// NewSQLite returns a migrated SQLite store on a new file under t.TempDir(), closed when t ends.
func NewSQLite(t testing.TB, opts ...Option) *Store {
	t.Helper()

	store := NewSQLiteUnmigrated(t, opts...)
	require.NoError(t, store.Migrate(t.Context()))
	return store
}

// NewSQLiteUnmigrated returns a SQLite store on a new, empty file under t.TempDir(), closed when t
// ends.
func NewSQLiteUnmigrated(t testing.TB, opts ...Option) *Store {
	t.Helper()

	return OpenSQLite(t, filepath.Join(t.TempDir(), "postguard.db"), opts...)
}

// OpenSQLite opens the SQLite database at path, without migrating it, and closes it when t ends
// (reopen a file to test what persists).
func OpenSQLite(t testing.TB, path string, opts ...Option) *Store {
	t.Helper()

	engine, err := sqlite.NewEngine(t.Context(), path, &sqlite.Config{Logger: Logger(t)})
	require.NoError(t, err)
	return newStore(t, &Store{SQLite: engine, sqliteRiver: &sqliteRiver{}}, engine, riversqlite.New(engine.DB()), opts)
}

func newStore[TTx any](t testing.TB, store *Store, engine db.Engine[TTx], driver riverdriver.Driver[TTx], opts []Option) *Store {
	t.Helper()

	config := &riverstore.Config{Logger: Logger(t)}
	for _, opt := range opts {
		opt(config)
	}
	s, _, err := riverstore.New(engine, driver, config)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	store.Store = s
	return store
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails, per crypto/rand
	return hex.EncodeToString(b)
}

// SQLiteOrPostgresDB is a *sql.DB on the store's database: the SQLite engine's own, or one over
// the PostgreSQL engine's pool, closed when t ends.
func (s *Store) SQLiteOrPostgresDB(t testing.TB) *sql.DB {
	t.Helper()

	if s.SQLite != nil {
		return s.SQLite.DB()
	}
	sqlDB := stdlib.OpenDBFromPool(s.Postgres.Pool())
	t.Cleanup(func() { _ = sqlDB.Close() })
	return sqlDB
}

// MigrateRevision2 brings the empty database behind sqlDB (engine "postgres" or "sqlite") to
// version of the history postguard ran before revision 3 (7: revision 2's last), as it ran it:
// goose, the very migration files, in goose's default table. Revision 3's MigrateTables upgrades
// such a database in place (db.MigrateOpts.Revision2Table).
func MigrateRevision2(t testing.TB, sqlDB *sql.DB, engine string, version int64) {
	t.Helper()

	dialect := map[string]goose.Dialect{"postgres": goose.DialectPostgres, "sqlite": goose.DialectSQLite3}[engine]
	migrations, err := fs.Sub(db.Migrations, "migrations/"+engine+"/revision2")
	require.NoError(t, err)
	provider, err := goose.NewProvider(dialect, sqlDB, migrations, goose.WithDisableGlobalRegistry(true), goose.WithSlog(Logger(t)))
	require.NoError(t, err)
	_, err = provider.UpTo(t.Context(), version)
	require.NoError(t, err)
}
