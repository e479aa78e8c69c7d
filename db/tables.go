package db

import (
	"context"
	"fmt"
	"log/slog"
)

// TablesConfig configures NewTables. A nil *TablesConfig takes every default.
type TablesConfig struct {
	// Logger receives the migrations' lines; slog.Default() when nil.
	Logger *slog.Logger
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
		Queries:  engine.Queries(),
		Counters: engine.Counters(),
		engine:   engine,
		logger:   config.Logger,
	}
	if t.logger == nil {
		t.logger = slog.Default()
	}
	return t
}

// tables are the Tables on an Engine[TTx].
type tables[TTx any] struct {
	Queries
	Counters

	engine Engine[TTx]
	logger *slog.Logger
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

// Ready implements Tables.
func (s *tables[TTx]) Ready(ctx context.Context) error { return s.engine.Ready(ctx) }

// Close implements Tables.
func (s *tables[TTx]) Close() error { return s.engine.Close() }
