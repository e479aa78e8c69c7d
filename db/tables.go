package db

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/pressly/goose/v3"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
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

// NewTables returns postguard's tables on engine, without River: for a host app that runs River
// itself and uses postguard's limiter (the Tables are an abuse.Consumer) and mail workers (jobs)
// on its own pool or *sql.DB (postgres.NewEngineFromPool, sqlite.NewEngineFromDB). The Tables own
// engine: closing them closes it (which leaves a host's own pool or *sql.DB open).
func NewTables[TTx any](engine Engine[TTx], config *TablesConfig) Tables {
	return newTables(engine, config)
}

func newTables[TTx any](engine Engine[TTx], config *TablesConfig) *tables[TTx] {
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

// tables are the Tables on an Engine[TTx], and what a Store adds River to.
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
	if err := checkWindows(len(params.Windows), func(i int) []byte { return params.Windows[i].KeyHash }, params.Device); err != nil {
		return nil, err
	}
	if len(params.Windows) > 1 || params.UserEmail != "" || params.Device != nil {
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

// RateLimitCounterGetMany implements Counters: it checks the windows.
func (s *tables[TTx]) RateLimitCounterGetMany(ctx context.Context, params *RateLimitCounterWindowsParams) (*RateLimitCounterGetManyResult, error) {
	if err := checkWindowsParams(params); err != nil {
		return nil, err
	}
	return s.Counters.RateLimitCounterGetMany(ctx, params)
}

// RateLimitCounterDeleteMany implements Counters: it checks the windows.
func (s *tables[TTx]) RateLimitCounterDeleteMany(ctx context.Context, params *RateLimitCounterWindowsParams) (bool, error) {
	if err := checkWindowsParams(params); err != nil {
		return false, err
	}
	return s.Counters.RateLimitCounterDeleteMany(ctx, params)
}

// RateLimitCounterRefund implements Counters: it checks the windows.
func (s *tables[TTx]) RateLimitCounterRefund(ctx context.Context, params *RateLimitCounterWindowsParams) (bool, error) {
	if err := checkWindowsParams(params); err != nil {
		return false, err
	}
	return s.Counters.RateLimitCounterRefund(ctx, params)
}

func checkWindowsParams(params *RateLimitCounterWindowsParams) error {
	return checkWindows(len(params.Windows), func(i int) []byte { return params.Windows[i].KeyHash }, params.Device)
}

// checkWindows checks a request's n windows (keyOf gives each one's key) and its device, for the
// engines, whose statements take them as they are: 1 to RateLimitChainMax windows, each with a
// key, and a device naming one of them with a bucket and a revocation key of its own.
func checkWindows(n int, keyOf func(i int) []byte, device *RateLimitDeviceParams) error {
	if n == 0 || n > RateLimitChainMax {
		return fmt.Errorf("a rate limit chain has 1 to %d windows, got %d", RateLimitChainMax, n)
	}
	for i := range n {
		if len(keyOf(i)) == 0 {
			return fmt.Errorf("rate limit chain window %d has no key", i+1)
		}
	}
	if device == nil {
		return nil
	}
	if device.Window < 0 || device.Window >= n {
		return fmt.Errorf("rate limit device names window %d of %d", device.Window+1, n)
	}
	if len(device.KeyHash) == 0 || len(device.RevocationHash) == 0 {
		return errors.New("rate limit device has no bucket or revocation key")
	}
	return nil
}

// Engine implements Tables.
func (s *tables[TTx]) Engine() string { return s.engine.Name() }

// Transact implements Tables.
func (s *tables[TTx]) Transact(ctx context.Context, fn func(ctx context.Context, q Queries) error) error {
	return s.inTx(ctx, func(ctx context.Context, _ TTx, q Queries) error { return fn(ctx, q) })
}

// inTx runs fn in one engine transaction, given the transaction and its statements. A
// transaction whose connection was lost before its COMMIT was sent runs again, once, on a
// connection the engine verified (Engine.MayRetry): the server rolled it back when its session
// ended. One whose COMMIT was sent and not answered is never run again: it may have committed.
func (s *tables[TTx]) inTx(ctx context.Context, fn func(ctx context.Context, tx TTx, q Queries) error) error {
	committing, err := s.tryTx(ctx, fn)
	if err == nil || committing {
		return err
	}
	if retryCtx, ok := s.engine.MayRetry(ctx, err, true); ok {
		s.logger.InfoContext(ctx, "transaction lost its connection before COMMIT; running it again", slog.String("error", err.Error()))
		_, err = s.tryTx(retryCtx, fn)
	}
	return err
}

// tryTx runs fn in one transaction. committing says COMMIT was sent: a failure then may have
// committed.
func (s *tables[TTx]) tryTx(ctx context.Context, fn func(ctx context.Context, tx TTx, q Queries) error) (committing bool, err error) {
	tx, err := s.engine.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("error beginning transaction: %w", err)
	}
	defer func() {
		// A no-op after Commit; on a panic or an error, the rollback. Its own failure leaves
		// nothing behind: a transaction whose connection fails is rolled back by the server.
		_ = s.engine.Rollback(context.WithoutCancel(ctx), tx)
	}()

	if err := fn(ctx, tx, s.engine.QueriesTx(tx)); err != nil {
		return false, err
	}
	if err := s.engine.Commit(ctx, tx); err != nil {
		// A COMMIT that failed before it was sent is safe to run again with its transaction.
		_, sentNothing := s.engine.MayRetry(ctx, err, false)
		return !sentNothing, fmt.Errorf("error committing transaction: %w", err)
	}
	return true, nil
}

// MigrateTables implements Tables.
func (s *tables[TTx]) MigrateTables(ctx context.Context) error {
	release, err := s.engine.LockMigrations(ctx)
	if err != nil {
		return fmt.Errorf("error taking the migration lock: %w", err)
	}
	defer release()
	return s.gooseUp(ctx)
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

// riverJobs is a Store's River client as Jobs, resolved at each call: the workers take it inside
// RiverConfigFunc, before NewStore has built the client.
type riverJobs[TTx any] struct{ s *store[TTx] }

func (j riverJobs[TTx]) Start(ctx context.Context) error { return j.s.client.Start(ctx) }
func (j riverJobs[TTx]) Stop(ctx context.Context) error  { return j.s.client.Stop(ctx) }
func (j riverJobs[TTx]) StopAndCancel(ctx context.Context) error {
	return j.s.client.StopAndCancel(ctx)
}
func (j riverJobs[TTx]) Stopped() <-chan struct{} { return j.s.client.Stopped() }
func (j riverJobs[TTx]) Subscribe(kinds ...river.EventKind) (<-chan *river.Event, func()) {
	return j.s.client.Subscribe(kinds...)
}

func (j riverJobs[TTx]) SubscribeConfig(config *river.SubscribeConfig) (<-chan *river.Event, func()) {
	return j.s.client.SubscribeConfig(config)
}

func (j riverJobs[TTx]) JobGet(ctx context.Context, id int64) (*rivertype.JobRow, error) {
	return j.s.client.JobGet(ctx, id)
}

func (j riverJobs[TTx]) JobList(ctx context.Context, params *river.JobListParams) (*river.JobListResult, error) {
	return j.s.client.JobList(ctx, params)
}

func (j riverJobs[TTx]) JobDeleteMany(ctx context.Context, params *river.JobDeleteManyParams) (*river.JobDeleteManyResult, error) {
	return j.s.client.JobDeleteMany(ctx, params)
}

func (j riverJobs[TTx]) JobRetry(ctx context.Context, id int64) (*rivertype.JobRow, error) {
	return j.s.client.JobRetry(ctx, id)
}

func (j riverJobs[TTx]) JobCancel(ctx context.Context, id int64) (*rivertype.JobRow, error) {
	return j.s.client.JobCancel(ctx, id)
}
