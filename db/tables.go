package db

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/pressly/goose/v3"
)

// TablesConfig configures NewTables. A nil *TablesConfig takes every default.
type TablesConfig struct {
	// Logger receives the migrations' lines; slog.Default() when nil.
	Logger *slog.Logger

	// GooseTable is the table goose records postguard's migrations in; goose's default
	// (goose_db_version) when "". A host app that runs goose for its own migrations in the same
	// schema gives another name (postguard_db_version, say), or the two sets of versions would
	// be read as one.
	GooseTable string
}

// MigrateOpts are MigrateTables' and MigrationsBehind's. A nil *MigrateOpts takes every default.
type MigrateOpts struct {
	// BeforeFunc, when set, runs under the migration lock before postguard's migrations, and an
	// error it returns stops them: postguard's server applies River's migrations there, so that
	// one lock covers both. MigrationsBehind ignores it.
	BeforeFunc func(ctx context.Context) error
}

// NewTables returns postguard's tables on engine: for a host app that uses postguard's limiter
// (the Tables are an abuse.Consumer) and mail workers (jobs) on its own pool or *sql.DB
// (postgres.NewEngineFromPool, sqlite.NewEngineFromDB), and for postguard's own server. The
// Tables own engine: closing them closes it (which leaves a host's own pool or *sql.DB open).
func NewTables[TTx any](engine Engine[TTx], config *TablesConfig) Tables {
	if config == nil {
		config = &TablesConfig{}
	}
	t := &tables[TTx]{
		Queries:    engine.Queries(),
		Counters:   engine.Counters(),
		engine:     engine,
		logger:     config.Logger,
		gooseTable: config.GooseTable,
	}
	if t.logger == nil {
		t.logger = slog.Default()
	}
	if t.gooseTable == "" {
		t.gooseTable = goose.DefaultTablename
	}
	return t
}

// tables are the Tables on an Engine[TTx].
type tables[TTx any] struct {
	Queries
	Counters

	engine     Engine[TTx]
	logger     *slog.Logger
	gooseTable string
}

// RateLimitCounterConsumeChain implements Counters: it checks the chain, and spends a chain of
// one window with the single statement (the engines' chains are for several: on PostgreSQL a
// statement of three CTEs and thirteen parameters, on SQLite a connection held across
// statements), so that a one-rule check costs what it did before chains.
func (s *tables[TTx]) RateLimitCounterConsumeChain(ctx context.Context, params *RateLimitCounterChainParams) (*RateLimitCounterChainResult, error) {
	if n := len(params.Windows); n == 0 || n > RateLimitChainMax {
		return nil, fmt.Errorf("a rate limit chain has 1 to %d windows, got %d", RateLimitChainMax, n)
	}
	for i := range params.Windows {
		if len(params.Windows[i].KeyHash) == 0 {
			return nil, fmt.Errorf("rate limit chain window %d has no key", i+1)
		}
	}
	if len(params.Windows) > 1 || params.UserEmail != "" {
		return s.Counters.RateLimitCounterConsumeChain(ctx, params)
	}
	count, ok, err := s.RateLimitCounterConsume(ctx, &params.Windows[0])
	switch {
	case err != nil:
		return nil, err
	case !ok:
		return &RateLimitCounterChainResult{}, nil
	}
	return &RateLimitCounterChainResult{Counts: []int64{count}}, nil
}

// Engine implements Tables.
func (s *tables[TTx]) Engine() string { return s.engine.Name() }

// Transact implements Tables.
func (s *tables[TTx]) Transact(ctx context.Context, fn func(ctx context.Context, q Queries) error) error {
	return TransactTx(ctx, s.engine, s.logger, func(ctx context.Context, _ TTx, q Queries) error { return fn(ctx, q) })
}

// TransactTx runs fn in one transaction of engine as Tables.Transact does, and gives fn the
// engine's transaction beside postguard's statements on it: for code that adds statements of its
// own to the transaction, such as River's InsertTx. logger receives the line about running
// again; slog.Default() when nil.
//
// A transaction whose connection was lost before its COMMIT was sent runs again, once, on
// another connection (Engine.MayRetry): the server rolled it back when its session ended. One
// whose COMMIT was sent and not answered is never run again: it may have committed.
func TransactTx[TTx any](ctx context.Context, engine Engine[TTx], logger *slog.Logger, fn func(ctx context.Context, tx TTx, q Queries) error) error {
	committing, err := tryTx(ctx, engine, fn)
	if err != nil && !committing && engine.MayRetry(ctx, err, true) {
		if logger == nil {
			logger = slog.Default()
		}
		logger.InfoContext(ctx, "transaction lost its connection before COMMIT; running it again", slog.String("error", err.Error()))
		_, err = tryTx(ctx, engine, fn)
	}
	return err
}

// tryTx runs fn in one transaction. committing says COMMIT was sent: a failure then may have
// committed.
func tryTx[TTx any](ctx context.Context, engine Engine[TTx], fn func(ctx context.Context, tx TTx, q Queries) error) (committing bool, err error) {
	tx, err := engine.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("error beginning transaction: %w", err)
	}
	defer func() {
		// A no-op after Commit; on a panic or an error, the rollback. Its own failure leaves
		// nothing behind: a transaction whose connection fails is rolled back by the server.
		_ = engine.Rollback(context.WithoutCancel(ctx), tx)
	}()

	if err := fn(ctx, tx, engine.QueriesTx(tx)); err != nil {
		return false, err
	}
	if err := engine.Commit(ctx, tx); err != nil {
		// A COMMIT that failed before it was sent is safe to run again with its transaction.
		return !engine.MayRetry(ctx, err, false), fmt.Errorf("error committing transaction: %w", err)
	}
	return true, nil
}

// MigrateTables implements Tables.
func (s *tables[TTx]) MigrateTables(ctx context.Context, opts *MigrateOpts) error {
	if opts == nil {
		opts = &MigrateOpts{}
	}
	release, err := s.engine.LockMigrations(ctx)
	if err != nil {
		return fmt.Errorf("error taking the migration lock: %w", err)
	}
	defer release()
	if opts.BeforeFunc != nil {
		if err := opts.BeforeFunc(ctx); err != nil {
			return err
		}
	}
	return s.gooseUp(ctx)
}

// MigrationsBehind implements Tables.
func (s *tables[TTx]) MigrationsBehind(ctx context.Context, _ *MigrateOpts) ([]string, error) {
	behind, err := s.gooseBehind(ctx)
	if err != nil || behind == "" {
		return nil, err
	}
	return []string{behind}, nil
}

// gooseUp applies the app's migrations; the caller holds the migration lock.
func (s *tables[TTx]) gooseUp(ctx context.Context) error {
	provider, release, err := s.goose()
	if err != nil {
		return err
	}
	defer release()
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("error applying the app's migrations: %w", err)
	}
	return nil
}

// Ready implements Tables.
func (s *tables[TTx]) Ready(ctx context.Context) error { return s.engine.Ready(ctx) }

// Close implements Tables.
func (s *tables[TTx]) Close() error { return s.engine.Close() }

// gooseBehind says how far behind the app's migrations are, or "" when all are applied. Unlike
// goose's own checks, it does not create goose's version table when there is none.
func (s *tables[TTx]) gooseBehind(ctx context.Context) (string, error) {
	provider, release, err := s.goose()
	if err != nil {
		return "", err
	}
	defer release()

	sqlDB, _, releaseDB := s.engine.GooseDB()
	defer releaseDB()
	exists, err := s.engine.GooseTableExists(ctx, sqlDB)
	if err != nil {
		return "", fmt.Errorf("error checking goose's version table: %w", err)
	}
	if !exists {
		return "the app's migrations are not applied", nil
	}

	pending, err := provider.HasPending(ctx)
	if err != nil {
		return "", fmt.Errorf("error checking the app's migrations: %w", err)
	}
	if !pending {
		return "", nil
	}
	current, target, err := provider.GetVersions(ctx)
	if err != nil {
		return "", fmt.Errorf("error reading the app's migration version: %w", err)
	}
	return fmt.Sprintf("the app's schema is at version %d of %d", current, target), nil
}

// goose is goose with the engine's migrations, on the engine's connections.
func (s *tables[TTx]) goose() (*goose.Provider, func(), error) {
	migrations, err := fs.Sub(Migrations, "migrations/"+s.engine.Name())
	if err != nil {
		return nil, nil, fmt.Errorf("error opening migrations: %w", err)
	}
	sqlDB, dialect, release := s.engine.GooseDB()
	provider, err := goose.NewProvider(dialect, sqlDB, migrations,
		goose.WithDisableGlobalRegistry(true),
		goose.WithTableName(s.gooseTable),
		goose.WithSlog(s.logger),
	)
	if err != nil {
		release()
		return nil, nil, fmt.Errorf("error creating goose provider: %w", err)
	}
	return provider, release, nil
}
