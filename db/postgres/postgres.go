// Package postgres is the PostgreSQL engine of db: a pgx pool, a second pool whose connections
// commit without waiting for their WAL flush (the rate limiter's counters), and the app's sqlc
// queries (dbsqlc) over both, with their errors converted to db's. db.NewTables builds
// postguard's tables on it; River, when an app runs it, goes on the same pool (riverpgxv5 on
// Pool), never through this package.
package postgres

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/postgres/dbsqlc"
)

// RateLimitMaxConnsDefault is the size of the rate-limit pool when Config.RateLimitMaxConns is
// zero. Each check is one short statement, so a few connections serve many requests.
const RateLimitMaxConnsDefault = 4

// Config configures an Engine. The zero value (or nil) is fine.
type Config struct {
	// Logger receives migration logs. Defaults to slog.Default().
	Logger *slog.Logger

	// MaxConns caps the main pool. Defaults to pgxpool's default (pool_max_conns in the URL, or
	// the larger of 4 and the number of CPUs).
	MaxConns int32

	// RateLimitMaxConns caps the second pool, the one whose connections run with
	// synchronous_commit off for the rate limiter's counters. Defaults to
	// RateLimitMaxConnsDefault.
	RateLimitMaxConns int32

	// ConnectTimeout bounds each new connection when the URL sets no connect_timeout. Defaults
	// to ConnectTimeoutDefault.
	ConnectTimeout time.Duration

	// RateLimitPool, with NewEngineFromPool, is the pool the rate limiter's counters run on,
	// the caller's to close. nil makes one like the main pool, with synchronous_commit off and
	// RateLimitMaxConns connections, closed by Close. Give the main pool itself to make no
	// second pool (the counters' commits then wait for their WAL flush, as everything else's).
	RateLimitPool *pgxpool.Pool

	// Tracer, with NewEngine, is told of every statement on both pools (pgx's QueryTracer; a
	// pgxpool.AcquireTracer too, if it is one): an OpenTelemetry tracer such as otelpgx's, to time
	// them in the trace of the request or job that runs them. nil traces none.
	Tracer pgx.QueryTracer
}

// Engine is the PostgreSQL db.Engine.
type Engine struct {
	logger *slog.Logger
	pool   *pgxpool.Pool

	// rateLimitPool's connections carry synchronous_commit=off as a runtime parameter: a
	// counter's commit does not wait for its WAL flush. A crash may forget the last instant of
	// counts, nothing else; users, tokens and jobs never go through this pool.
	rateLimitPool *pgxpool.Pool

	// ownsPool and ownsRateLimitPool say Close closes them: not a host app's (NewEngineFromPool).
	ownsPool, ownsRateLimitPool bool
}

var _ db.Engine[pgx.Tx] = (*Engine)(nil)

// NewEngine opens an Engine on databaseURL (a postgres:// URL or a key=value DSN). Its tables are
// those the connection's search_path finds first, so a schema is chosen in the URL, e.g.
// `options=-c%20search_path%3Dmyschema`. Connections are made lazily, so NewEngine succeeds
// while the database is down. Each connection attempt gives up after connect_timeout from the
// URL, else Config.ConnectTimeout; see the retry rule (retry.go) for which failed calls run
// again.
func NewEngine(ctx context.Context, databaseURL string, config *Config) (*Engine, error) {
	if config == nil {
		config = &Config{}
	}

	poolConfig, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("error parsing database URL: %w", err)
	}
	if config.MaxConns > 0 {
		poolConfig.MaxConns = config.MaxConns
	}
	if poolConfig.ConnConfig.ConnectTimeout == 0 {
		// What pgconn does for connect_timeout: the whole attempt (dial, TLS, start-up) shares it.
		poolConfig.ConnConfig.ConnectTimeout = cmp.Or(config.ConnectTimeout, ConnectTimeoutDefault)
	}
	if config.Tracer != nil {
		poolConfig.ConnConfig.Tracer = config.Tracer // the counters' pool is a copy of this one
	}
	poolConfig.AfterConnect = scanTimesInUTC
	poolConfig.PrepareConn = checkConn
	poolConfig.ShouldPing = shouldPing

	pool, err := pgxpool.NewWithConfig(ctx, poolConfig)
	if err != nil {
		return nil, fmt.Errorf("error creating pool: %w", err)
	}
	rateLimitPool, err := newRateLimitPool(ctx, poolConfig, config)
	if err != nil {
		pool.Close()
		return nil, err
	}

	return &Engine{
		logger:            cmp.Or(config.Logger, slog.Default()),
		pool:              pool,
		rateLimitPool:     rateLimitPool,
		ownsPool:          true,
		ownsRateLimitPool: true,
	}, nil
}

// NewEngineFromPool returns an Engine on a pool a host app made itself, for postguard's tables
// beside its own (db.NewTables): its statements and transactions run on pool, found by pool's
// search_path. The caller keeps pool: Close leaves it open. The rate limiter's counters run on
// Config.RateLimitPool, or on a small pool of the engine's own made from pool's configuration
// with synchronous_commit off (see Config.RateLimitPool). The hooks NewEngine installs on its own
// pools are not added to pool: times are read in pool's time zone (they compare the same), and
// a connection the server closed while it sat idle is found at its next use rather than before.
func NewEngineFromPool(ctx context.Context, pool *pgxpool.Pool, config *Config) (*Engine, error) {
	if pool == nil {
		return nil, errors.New("postgres.NewEngineFromPool: nil pool")
	}
	if config == nil {
		config = &Config{}
	}
	e := &Engine{
		logger:        cmp.Or(config.Logger, slog.Default()),
		pool:          pool,
		rateLimitPool: config.RateLimitPool,
	}
	if e.rateLimitPool == nil {
		rateLimitPool, err := newRateLimitPool(ctx, pool.Config(), config)
		if err != nil {
			return nil, err
		}
		e.rateLimitPool, e.ownsRateLimitPool = rateLimitPool, true
	}
	return e, nil
}

// newRateLimitPool makes the pool of the rate limiter's counters: like poolConfig, with
// synchronous_commit off and config.RateLimitMaxConns connections.
func newRateLimitPool(ctx context.Context, poolConfig *pgxpool.Config, config *Config) (*pgxpool.Pool, error) {
	rateLimitPoolConfig := poolConfig.Copy()
	rateLimitPoolConfig.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	rateLimitPoolConfig.MaxConns = cmp.Or(config.RateLimitMaxConns, RateLimitMaxConnsDefault)
	rateLimitPoolConfig.MinConns = min(rateLimitPoolConfig.MinConns, rateLimitPoolConfig.MaxConns)
	if rateLimitPoolConfig.PrepareConn == nil {
		rateLimitPoolConfig.PrepareConn = checkConn
	}
	if rateLimitPoolConfig.ShouldPing == nil {
		rateLimitPoolConfig.ShouldPing = shouldPing
	}
	pool, err := pgxpool.NewWithConfig(ctx, rateLimitPoolConfig)
	if err != nil {
		return nil, fmt.Errorf("error creating rate limit pool: %w", err)
	}
	return pool, nil
}

// scanTimesInUTC makes a connection read timestamptz values in UTC, as SQLite's are, whatever
// the process's time zone.
func scanTimesInUTC(_ context.Context, conn *pgx.Conn) error {
	conn.TypeMap().RegisterType(&pgtype.Type{
		Name:  "timestamptz",
		OID:   pgtype.TimestamptzOID,
		Codec: &pgtype.TimestamptzCodec{ScanLocation: time.UTC},
	})
	return nil
}

// Name implements db.Engine.
func (e *Engine) Name() string { return "postgres" }

// Begin implements db.Engine.
func (e *Engine) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return nil, interpretError(err)
	}
	return tx, nil
}

// Commit implements db.Engine.
func (e *Engine) Commit(ctx context.Context, tx pgx.Tx) error { return interpretError(tx.Commit(ctx)) }

// Rollback implements db.Engine. On failure pgx closes the connection, so it is not reused.
func (e *Engine) Rollback(ctx context.Context, tx pgx.Tx) error {
	return interpretError(tx.Rollback(ctx))
}

// Queries implements db.Engine: on the main pool, each call under the retry rule.
func (e *Engine) Queries() db.Queries { return &queries{dbtx: e.pool, retry: true} }

// QueriesTx implements db.Engine. Calls in a transaction never run again alone: InTx runs the
// whole transaction again when it may.
func (e *Engine) QueriesTx(tx pgx.Tx) db.Queries { return &queries{dbtx: tx} }

// Counters implements db.Engine: on the rate-limit pool.
func (e *Engine) Counters() db.Counters { return &counters{pool: e.rateLimitPool} }

// InterpretError implements db.Engine.
func (e *Engine) InterpretError(err error) error { return interpretError(err) }

// MayRetry implements db.Engine with the retry rule of retry.go: the retry's context makes the
// pools verify the connection it runs on.
func (e *Engine) MayRetry(ctx context.Context, err error, lossIsSafe bool) (context.Context, bool) {
	if !mayRetry(ctx, err, lossIsSafe) {
		return ctx, false
	}
	return retryContext(ctx), true
}

// GooseDB implements db.Engine: a *sql.DB on the main pool (closing it leaves the pool open).
func (e *Engine) GooseDB() (*sql.DB, goose.Dialect, func()) {
	sqlDB := stdlib.OpenDBFromPool(e.pool)
	return sqlDB, goose.DialectPostgres, func() { sqlDB.Close() }
}

// TableExists implements db.Engine, with the check goose itself runs for its version table, on
// the same search_path.
func (e *Engine) TableExists(ctx context.Context, sqlDB *sql.DB, name string) (bool, error) {
	versionStore, err := database.NewStore(goose.DialectPostgres, name)
	if err != nil {
		return false, fmt.Errorf("error creating goose store: %w", err)
	}
	exists, err := versionStore.(database.StoreExtender).TableExists(ctx, sqlDB)
	return exists, interpretError(err)
}

// LockMigrations implements db.Engine with a session-level advisory lock keyed on the current
// schema (stores in other schemas do not wait on it), held on a connection of its own so that it
// never starves River or goose of theirs. Ending the session releases the lock too, should the
// unlock fail.
func (e *Engine) LockMigrations(ctx context.Context) (func(), error) {
	conn, err := pgx.ConnectConfig(ctx, e.pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("error connecting to take the migration lock: %w", interpretError(err))
	}
	if err := dbsqlc.New().MigrationLock(ctx, conn); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, interpretError(err)
	}
	return func() {
		ctx := context.WithoutCancel(ctx)
		if err := dbsqlc.New().MigrationUnlock(ctx, conn); err != nil {
			e.logger.WarnContext(ctx, "error releasing the migration lock", slog.String("error", err.Error()))
		}
		conn.Close(ctx)
	}, nil
}

// Ready implements db.Engine: it updates the one-row heartbeat on the main pool, the pool users,
// tokens and jobs are written through. A read-only server (25006: a demoted primary, a standby,
// default_transaction_read_only) fails it, as does one that cannot commit in time (a synchronous
// standby gone).
func (e *Engine) Ready(ctx context.Context) error {
	_, err := retryOnce(ctx, true, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, dbsqlc.New().ReadinessHeartbeatUpsert(ctx, e.pool)
	})
	if err != nil {
		return fmt.Errorf("error writing the readiness heartbeat: %w", interpretError(err))
	}
	return nil
}

// Close implements db.Engine: both pools, but those the caller gave (NewEngineFromPool).
func (e *Engine) Close() error {
	if e.ownsPool {
		e.pool.Close()
	}
	if e.ownsRateLimitPool {
		e.rateLimitPool.Close()
	}
	return nil
}

// Pool is the engine's main pool: River's too, in postguard's server (riverpgxv5.New(Pool())).
func (e *Engine) Pool() *pgxpool.Pool { return e.pool }

// RateLimitPool is the pool of the rate limiter's counters.
func (e *Engine) RateLimitPool() *pgxpool.Pool { return e.rateLimitPool }
