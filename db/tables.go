package db

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/postguard/postguard/internal/batch"
)

// TablesConfig configures NewTables. A nil *TablesConfig takes every default.
type TablesConfig struct {
	// Logger receives the migrations' lines; slog.Default() when nil.
	Logger *slog.Logger

	// CounterBatchMax bounds how many requests' checks share one statement (see NewTables);
	// DefaultCounterBatchMax when 0. 1 gives every request a statement of its own.
	CounterBatchMax int

	// CounterBatchInFlight is how many statements of checks may run at once; when 0, as many as
	// the engine's counters have connections (on PostgreSQL the rate-limit pool's size, on
	// SQLite 1).
	CounterBatchInFlight int

	// batchQueued and batchGate are the tests' hooks (export_test.go): told of each check that
	// waits for a batch, and run before each batch's statement.
	batchQueued func(n int)
	batchGate   func(ctx context.Context, n int)
}

// DefaultCounterBatchMax is TablesConfig.CounterBatchMax's default: enough requests per statement
// to take the round trips out of a busy process's cost, few enough that a statement stays short
// (a batch of 128 forgot-password checks is one statement of a few hundred rows).
const DefaultCounterBatchMax = 128

// counterConns is implemented by an engine's Counters that knows how many connections its
// statements may take at once.
type counterConns interface {
	RateLimitCounterConns() int
}

// NewTables returns postguard's tables on engine: for a host app that uses postguard's limiter
// (the Tables are an abuse.Consumer) and mail workers (jobs) on its own pool or *sql.DB
// (postgres.NewEngineFromPool, sqlite.NewEngineFromDB), and for postguard's own server. The
// Tables own engine: closing them closes it (which leaves a host's own pool or *sql.DB open).
//
// The Tables batch the rate limiter's checks (RateLimitCounterConsumeChain) naturally: a check
// that finds a connection free goes at once, alone, in the statement it always had; checks that
// arrive while every connection runs one wait, and go together in the next statement
// (RateLimitCounterConsumeBatch), up to TablesConfig.CounterBatchMax of them. A key is in one
// check of a statement at most, and a check never overtakes an earlier one of its keys, so each
// key's checks run in arrival order and every limit stays exact; each check's windows are still
// spent in order, IP first, each only when the ones before it admitted.
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
	inFlight := config.CounterBatchInFlight
	if conns, ok := t.Counters.(counterConns); ok && inFlight <= 0 {
		inFlight = conns.RateLimitCounterConns()
	}
	run := t.consumeBatch
	if gate := config.batchGate; gate != nil {
		run = func(ctx context.Context, chains []*RateLimitCounterChainParams) ([]*RateLimitCounterChainResult, error) {
			gate(ctx, len(chains))
			return t.consumeBatch(ctx, chains)
		}
	}
	t.checks = batch.New(batch.Config[*RateLimitCounterChainParams, *RateLimitCounterChainResult]{
		Run:         run,
		Queued:      config.batchQueued,
		Keys:        chainKeys,
		MaxInFlight: max(inFlight, 1),
		MaxSize:     max(cmp.Or(config.CounterBatchMax, DefaultCounterBatchMax), 1),
	})
	return t
}

// tables are the Tables on an Engine[TTx].
type tables[TTx any] struct {
	Queries
	Counters

	engine Engine[TTx]
	logger *slog.Logger
	checks *batch.Batcher[*RateLimitCounterChainParams, *RateLimitCounterChainResult]
}

// RateLimitCounterConsumeChain implements Counters: it checks the chain and has it spent in the
// next batch of checks (see NewTables). When ctx ends while the chain waits for its batch, it is
// never spent; when it ends while the batch runs, the call returns at once and the chain may have
// been spent, as a request cut off after reaching the database may be.
func (s *tables[TTx]) RateLimitCounterConsumeChain(ctx context.Context, params *RateLimitCounterChainParams) (*RateLimitCounterChainResult, error) {
	if err := checkChain(params); err != nil {
		return nil, err
	}
	return s.checks.Do(ctx, params)
}

// RateLimitCounterConsumeBatch implements Counters: it checks the chains, and that no key is in
// two of them.
func (s *tables[TTx]) RateLimitCounterConsumeBatch(ctx context.Context, chains []*RateLimitCounterChainParams) ([]*RateLimitCounterChainResult, error) {
	seen := make(map[string]struct{})
	for i, chain := range chains {
		if err := checkChain(chain); err != nil {
			return nil, fmt.Errorf("chain %d of a batch: %w", i+1, err)
		}
		for _, key := range chainKeys(chain) {
			if _, ok := seen[string(key)]; ok {
				return nil, fmt.Errorf("chain %d of a batch: a key of an earlier chain", i+1)
			}
			seen[string(key)] = struct{}{}
		}
	}
	return s.consumeBatch(ctx, chains)
}

// consumeBatch spends a batch of checked chains: a batch of one in the statement a lone check
// always had (a chain of one window in the single statement, so that a one-rule check costs what
// it did before chains), several in the engine's batch statement.
func (s *tables[TTx]) consumeBatch(ctx context.Context, chains []*RateLimitCounterChainParams) ([]*RateLimitCounterChainResult, error) {
	if len(chains) > 1 {
		return s.Counters.RateLimitCounterConsumeBatch(ctx, chains)
	}
	params := chains[0]
	if len(params.Windows) > 1 || params.UserEmail != "" || params.Device != nil {
		result, err := s.Counters.RateLimitCounterConsumeChain(ctx, params)
		if err != nil {
			return nil, err
		}
		return []*RateLimitCounterChainResult{result}, nil
	}
	count, ok, err := s.Counters.RateLimitCounterConsume(ctx, &params.Windows[0])
	switch {
	case err != nil:
		return nil, err
	case !ok:
		return []*RateLimitCounterChainResult{{}}, nil
	}
	return []*RateLimitCounterChainResult{{Counts: []int64{count}}}, nil
}

// chainKeys are the rows a chain may touch: its windows' keys, and its device's bucket.
func chainKeys(params *RateLimitCounterChainParams) [][]byte {
	keys := make([][]byte, 0, len(params.Windows)+1)
	for _, w := range params.Windows {
		keys = append(keys, w.KeyHash)
	}
	if params.Device != nil {
		keys = append(keys, params.Device.KeyHash)
	}
	return keys
}

func checkChain(params *RateLimitCounterChainParams) error {
	return checkWindows(len(params.Windows), func(i int) window { return params.Windows[i].window() }, params.Device)
}

// RateLimitCounterConsume implements Counters: it checks the window.
func (s *tables[TTx]) RateLimitCounterConsume(ctx context.Context, params *RateLimitCounterConsumeParams) (int64, bool, error) {
	if err := params.window().check(); err != nil {
		return 0, false, fmt.Errorf("rate limit window: %w", err)
	}
	return s.Counters.RateLimitCounterConsume(ctx, params)
}

// RateLimitCounterGet implements Counters: it checks the window.
func (s *tables[TTx]) RateLimitCounterGet(ctx context.Context, params *RateLimitCounterGetParams) (int64, error) {
	if err := params.window().check(); err != nil {
		return 0, fmt.Errorf("rate limit window: %w", err)
	}
	return s.Counters.RateLimitCounterGet(ctx, params)
}

// RateLimitCounterDelete implements Counters: it checks the window.
func (s *tables[TTx]) RateLimitCounterDelete(ctx context.Context, params *RateLimitCounterDeleteParams) error {
	if err := params.window().check(); err != nil {
		return fmt.Errorf("rate limit window: %w", err)
	}
	return s.Counters.RateLimitCounterDelete(ctx, params)
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
	return checkWindows(len(params.Windows), func(i int) window { return params.Windows[i].window() }, params.Device)
}

// window is one fixed window of one key, as the statements take it.
type window struct {
	key        []byte
	start, end time.Time
}

func (p *RateLimitCounterConsumeParams) window() window {
	return window{p.KeyHash, p.WindowStart, p.WindowEnd}
}

func (p *RateLimitCounterGetParams) window() window {
	return window{p.KeyHash, p.WindowStart, p.WindowEnd}
}

func (p *RateLimitCounterDeleteParams) window() window {
	return window{p.KeyHash, p.WindowStart, p.WindowEnd}
}

// check says what is wrong with w for the engines: no key, or an end that is not after its start
// (SQLite finds a counter by its window's end, so a window named without one would never be
// found).
func (w window) check() error {
	if len(w.key) == 0 {
		return errors.New("no key")
	}
	if !w.end.After(w.start) {
		return fmt.Errorf("its end %s is not after its start %s", w.end.Format(time.RFC3339Nano), w.start.Format(time.RFC3339Nano))
	}
	return nil
}

// checkWindows checks a request's n windows (windowOf gives each one) and its device, for the
// engines, whose statements take them as they are: 1 to RateLimitChainMax windows, each with a
// key and an end after its start, and a device naming one of them with a bucket and a revocation
// key of its own.
func checkWindows(n int, windowOf func(i int) window, device *RateLimitDeviceParams) error {
	if n == 0 || n > RateLimitChainMax {
		return fmt.Errorf("a rate limit chain has 1 to %d windows, got %d", RateLimitChainMax, n)
	}
	for i := range n {
		if err := windowOf(i).check(); err != nil {
			return fmt.Errorf("rate limit chain window %d: %w", i+1, err)
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
	return TransactTx(ctx, s.engine, s.logger, func(ctx context.Context, _ TTx, q Queries) error { return fn(ctx, q) })
}

// TransactTx runs fn in one transaction of engine as Tables.Transact does, and gives fn the
// engine's transaction beside postguard's statements on it: for code that adds statements of its
// own to the transaction, such as River's InsertTx. logger receives the line about running
// again; slog.Default() when nil.
//
// A transaction whose connection was lost before its COMMIT was sent runs again, once, on a
// connection the engine verified (Engine.MayRetry): the server rolled it back when its session
// ended. One whose COMMIT was sent and not answered is never run again: it may have committed.
func TransactTx[TTx any](ctx context.Context, engine Engine[TTx], logger *slog.Logger, fn func(ctx context.Context, tx TTx, q Queries) error) error {
	committing, err := tryTx(ctx, engine, fn)
	if err == nil || committing {
		return err
	}
	if retryCtx, ok := engine.MayRetry(ctx, err, true); ok {
		if logger == nil {
			logger = slog.Default()
		}
		logger.InfoContext(ctx, "transaction lost its connection before COMMIT; running it again", slog.String("error", err.Error()))
		_, err = tryTx(retryCtx, engine, fn)
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
		_, sentNothing := engine.MayRetry(ctx, err, false)
		return !sentNothing, fmt.Errorf("error committing transaction: %w", err)
	}
	return true, nil
}

// Ready implements Tables.
func (s *tables[TTx]) Ready(ctx context.Context) error { return s.engine.Ready(ctx) }

// Close implements Tables.
func (s *tables[TTx]) Close() error { return s.engine.Close() }
