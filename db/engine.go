package db

import (
	"context"
	"database/sql"

	"github.com/pressly/goose/v3"
)

// Engine is what differs between PostgreSQL and SQLite under the Tables, and nothing else: the
// connections, transactions, the app's sqlc queries with their time and error conversions, and
// the few things migrations need. TTx is the engine's transaction type (pgx.Tx, *sql.Tx), which
// is also River's on the same connections. db/postgres and db/sqlite implement it; NewTables
// builds the rest on it once.
//
// Every error an Engine returns has been through its conversion: a missing row is ErrNotFound,
// a database that cannot serve is wrapped in ErrUnavailable.
type Engine[TTx any] interface {
	// Name is "postgres" or "sqlite", and names the engine's directory of migrations.
	Name() string

	// Begin starts a transaction. Commit commits it; Rollback rolls back one that was not
	// committed, and is a no-op after Commit.
	Begin(ctx context.Context) (TTx, error)
	Commit(ctx context.Context, tx TTx) error
	Rollback(ctx context.Context, tx TTx) error

	// Queries runs the app's statements on the engine's connections, each committing alone.
	Queries() Queries
	// QueriesTx runs them in tx.
	QueriesTx(tx TTx) Queries
	// Counters runs the rate limiter's statements.
	Counters() Counters

	// InterpretError converts an error of the engine's driver that reached postguard some other
	// way (through River, on the same connections) as the engine's own methods convert theirs.
	InterpretError(err error) error

	// GooseDB is a *sql.DB on the engine's connections and goose's dialect for it, for the app's
	// migrations; release frees what GooseDB made (never the engine's connections).
	GooseDB() (sqlDB *sql.DB, dialect goose.Dialect, release func())
	// TableExists says whether the table of that name exists where the engine's statements
	// find their tables (on PostgreSQL, the search_path's schema), as goose checks its version
	// table: without creating anything.
	TableExists(ctx context.Context, sqlDB *sql.DB, name string) (bool, error)
	// LockMigrations waits for the lock that keeps two migrations of the database from running at
	// once, and returns its release.
	LockMigrations(ctx context.Context) (release func(), err error)

	// MayRetry says a call that failed with err may run again, once: because it sent nothing, or
	// because lossIsSafe (a read, an idempotent write, a transaction not yet committing) and its
	// session was lost. When it may, the retry runs with retryCtx, under which the engine hands
	// out only a connection it verified alive or dialled anew, never another pooled one that may
	// be as dead as the first. It is false whenever ctx is done. An engine that never loses a
	// session (SQLite) says false.
	MayRetry(ctx context.Context, err error, lossIsSafe bool) (retryCtx context.Context, ok bool)

	// Ready checks the database answers and takes a write (readiness).
	Ready(ctx context.Context) error

	// Close closes the engine's connections.
	Close() error
}
