// Package sqlite is the embedded engine of db: one SQLite file through modernc.org/sqlite (pure
// Go), one *sql.DB with one connection for the app's sqlc queries (dbsqlc), whose INTEGER
// unix-microsecond times and errors it converts to db's. It also keeps the embedded default's
// generated APP_SECRET beside the file (AppSecret). db.NewTables builds postguard's tables on it;
// River, when an app runs it, shares the one connection (riversqlite on DB), never through this
// package.
package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/pressly/goose/v3"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/sqlite/dbsqlc"
)

// tableExistsSQL says whether a table exists. Goose's SQLite dialect has no such check, and
// sqlc's SQLite catalog does not know sqlite_master.
const tableExistsSQL = `SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?)`

// BusyTimeoutDefault is Config.BusyTimeout's default: long enough to wait out another writer's
// transaction (a `postguard migrate`, a backup), shorter than a request's deadline (10 s), so a
// database held by another process is answered as busy (503) rather than as a request that ran
// out of time.
const BusyTimeoutDefault = 5 * time.Second

// readinessRoomBytes is how much Ready asks the database to find room for, in a transaction it
// rolls back: one page of SQLite's default size, more than fits inline in any page, so it needs
// at least one free page (or room to grow the file by one).
const readinessRoomBytes = 4096

// Config configures an Engine. The zero value (or nil) is fine.
type Config struct {
	// Logger receives migration logs. Defaults to slog.Default().
	Logger *slog.Logger

	// BusyTimeout is how long a statement waits for another connection's write lock before it
	// fails with SQLITE_BUSY (db.ErrUnavailable). Defaults to BusyTimeoutDefault; at least a
	// millisecond.
	BusyTimeout time.Duration

	// Tracer is told of the app's statements (see QueryTracer): an OpenTelemetry tracer, to time
	// them in the trace of the request or job that runs them. nil traces none.
	Tracer QueryTracer
}

// Engine is the SQLite db.Engine. It has one *sql.DB with one connection: SQLite takes one writer
// at a time anyway, River's SQLite driver wants it so, and a single connection never meets
// SQLITE_BUSY from itself. The flip side: inside a transaction nothing may use the engine's own
// Queries (only the transaction's), or it waits forever on the connection its transaction holds.
type Engine struct {
	db         *sql.DB
	logger     *slog.Logger
	secretPath string // "" for an engine on a *sql.DB of the caller's (NewEngineFromDB)
	ownsDB     bool   // Close closes db
	tracer     QueryTracer
	stmts      *stmtCache // the batches of checks' prepared statements
}

var _ db.Engine[*sql.Tx] = (*Engine)(nil)

// NewEngine opens (creating it if needed) the SQLite database at path, taken verbatim, in WAL
// mode with a busy timeout, foreign keys on, synchronous=NORMAL (durable in WAL mode except for
// the last commits before a power loss), a 64 MiB page cache, a checkpoint every 20,000 pages,
// temporary files in memory (a batch's multi-row upsert keeps a statement journal larger than
// the 64 KiB SQLite holds in memory before it spills to a file) and secure_delete on (deleted
// rows are zeroed, so a copy of the file does not hold what was deleted: used tokens, old
// counters). The database's files are created with mode 0600, and an older database's files are
// restricted to it. A secret that the first version kept inside the database is moved out to
// SecretPath (see AppSecret). NewEngine does not migrate; see db.Tables.MigrateTables.
func NewEngine(ctx context.Context, path string, config *Config) (*Engine, error) {
	if config == nil {
		config = &Config{}
	}
	if path == "" {
		return nil, errors.New("SQLite path is empty")
	}
	// The driver splits a plain file name from its parameters at the first '?'.
	if strings.Contains(path, "?") {
		return nil, fmt.Errorf("SQLite path %q must not contain '?'", path)
	}
	if err := restrictFiles(path); err != nil {
		return nil, err
	}

	// _txlock=immediate takes the write lock at BEGIN: a transaction never has to upgrade a read
	// lock, which is where SQLite answers SQLITE_BUSY without waiting, should another process
	// (e.g. `postguard migrate`) hold the file.
	busyTimeout := cmp.Or(config.BusyTimeout, BusyTimeoutDefault)
	params := url.Values{
		"_pragma": {
			fmt.Sprintf("busy_timeout(%d)", max(busyTimeout.Milliseconds(), 1)),
			"foreign_keys(1)",
			"journal_mode(WAL)",
			"secure_delete(1)",
			"synchronous(NORMAL)",
			"temp_store(MEMORY)",
			// The counters' inserts land on pages all over their primary key's index, and in
			// WAL mode every page a commit dirtied is written whole: a page cache of 64 MiB
			// (the default is 2 MiB) keeps those pages in memory rather than reading them back,
			// and a checkpoint every 20,000 pages (80 MiB of WAL, not 1,000) copies a page
			// dirtied by many commits once, in fewer, larger steps; journal_size_limit then
			// truncates the WAL back to 64 MiB after each. Measured with the load tool's
			// sqlite/http-many-ips row (docs/operations.md, "Capacity").
			"cache_size(-65536)",
			"wal_autocheckpoint(20000)",
			"journal_size_limit(67108864)",
		},
		"_txlock": {"immediate"},
	}
	sqlDB, err := sql.Open("sqlite", path+"?"+params.Encode())
	if err != nil {
		return nil, fmt.Errorf("error opening SQLite database: %w", err)
	}
	sqlDB.SetMaxOpenConns(1)

	// Open the file now, so that a bad path fails here rather than at first use.
	if err := sqlDB.PingContext(ctx); err != nil {
		sqlDB.Close()
		return nil, fmt.Errorf("error opening SQLite database %q: %w", path, interpretError(err))
	}

	engine := &Engine{
		db:         sqlDB,
		logger:     cmp.Or(config.Logger, slog.Default()),
		secretPath: SecretPath(path),
		ownsDB:     true,
		tracer:     config.Tracer,
		stmts:      newStmtCache(sqlDB),
	}
	if err := engine.moveLegacySecret(ctx); err != nil {
		sqlDB.Close()
		return nil, err
	}
	return engine, nil
}

// NewEngineFromDB returns an Engine on a *sql.DB a host app opened itself with
// modernc.org/sqlite's "sqlite" driver, for postguard's tables beside its own (db.NewTables). The
// caller keeps the handle: Close leaves it open. Open it as NewEngine does, or River's SQLite
// driver and postguard's transactions will wait on each other: one connection
// (SetMaxOpenConns(1)), WAL, a busy timeout, and _txlock=immediate, e.g.
// "app.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate". Such an engine
// keeps no generated secret (AppSecret fails): the host gives APP_SECRET itself.
func NewEngineFromDB(sqlDB *sql.DB, config *Config) (*Engine, error) {
	if sqlDB == nil {
		return nil, errors.New("sqlite.NewEngineFromDB: nil *sql.DB")
	}
	if config == nil {
		config = &Config{}
	}
	return &Engine{db: sqlDB, logger: cmp.Or(config.Logger, slog.Default()), tracer: config.Tracer, stmts: newStmtCache(sqlDB)}, nil
}

// Name implements db.Engine.
func (e *Engine) Name() string { return "sqlite" }

// Begin implements db.Engine: BEGIN IMMEDIATE (see NewEngine).
func (e *Engine) Begin(ctx context.Context) (*sql.Tx, error) {
	tx, err := e.db.BeginTx(ctx, nil)
	return tx, interpretError(err)
}

// Commit implements db.Engine.
func (e *Engine) Commit(_ context.Context, tx *sql.Tx) error { return interpretError(tx.Commit()) }

// Rollback implements db.Engine.
func (e *Engine) Rollback(_ context.Context, tx *sql.Tx) error {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return interpretError(err)
	}
	return nil
}

// Queries implements db.Engine.
func (e *Engine) Queries() db.Queries { return &queries{dbtx: e.traced(e.db)} }

// QueriesTx implements db.Engine.
func (e *Engine) QueriesTx(tx *sql.Tx) db.Queries { return &queries{dbtx: e.traced(tx)} }

// Counters implements db.Engine: on the one connection, like everything else.
func (e *Engine) Counters() db.Counters { return &queries{dbtx: e.db, stmts: e.stmts} }

// InterpretError implements db.Engine.
func (e *Engine) InterpretError(err error) error { return interpretError(err) }

// GooseDB implements db.Engine: the engine's own *sql.DB. Goose runs SQL migrations on one
// *sql.Conn it holds, so it never waits on itself for the single connection.
func (e *Engine) GooseDB() (*sql.DB, goose.Dialect, func()) {
	return e.db, goose.DialectSQLite3, func() {}
}

// TableExists implements db.Engine.
func (e *Engine) TableExists(ctx context.Context, sqlDB *sql.DB, name string) (bool, error) {
	var exists bool
	err := sqlDB.QueryRowContext(ctx, tableExistsSQL, name).Scan(&exists)
	return exists, interpretError(err)
}

// LockMigrations implements db.Engine. The single connection serialises migrations within the
// process, and the embedded engine has one process per file: there is nothing to lock.
func (e *Engine) LockMigrations(context.Context) (func(), error) { return func() {}, nil }

// MayRetry implements db.Engine: never. The engine's one connection is a file in the process,
// not a session that can be lost; a busy or failing database is answered as such.
func (e *Engine) MayRetry(ctx context.Context, _ error, _ bool) (context.Context, bool) {
	return ctx, false
}

// Ready implements db.Engine: a write, in two transactions. It commits the heartbeat row: a
// database another process holds past the busy timeout, or whose writes fail with an I/O error,
// fails here. Then it asks for readinessRoomBytes more in the same row and rolls that back: that
// needs a free page or room to grow the file, so a full database fails here even while the small
// heartbeat still fits in the pages it has. Each error wraps db.ErrUnavailable.
func (e *Engine) Ready(ctx context.Context) error {
	if err := dbsqlc.New().ReadinessHeartbeatUpsert(ctx, e.db, time.Now().UnixMicro()); err != nil {
		return fmt.Errorf("error writing the readiness heartbeat: %w", interpretError(err))
	}

	tx, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("error checking the database has room: %w", interpretError(err))
	}
	defer func() {
		_ = tx.Rollback() // always: the room was only asked for
	}()
	if err := dbsqlc.New().ReadinessHeartbeatFillRoom(ctx, tx, readinessRoomBytes); err != nil {
		return fmt.Errorf("error checking the database has room: %w", interpretError(err))
	}
	return nil
}

// Close implements db.Engine: it closes the database, unless the engine was made on the caller's
// *sql.DB (NewEngineFromDB).
func (e *Engine) Close() error {
	e.stmts.close()
	if !e.ownsDB {
		return nil
	}
	if err := e.db.Close(); err != nil {
		return fmt.Errorf("error closing SQLite database: %w", err)
	}
	return nil
}

// DB is the engine's *sql.DB (one connection): River's too, in postguard's server
// (riversqlite.New(DB())).
func (e *Engine) DB() *sql.DB { return e.db }
