package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverlog"

	"github.com/postguard/postguard/db"
)

const (
	// counterPruneBatchSize bounds each delete of the counters' prune. Expired counters are rows
	// nobody writes any more, so a batch locks nothing a check waits for on PostgreSQL; on SQLite
	// it holds the one connection while it runs, about 45 ms for 10,000 rows on an idle database
	// (this project's 2-core machine), the longest a check waits behind it.
	counterPruneBatchSize = 10_000
	// counterPruneBatchPause is the breath between two full batches, for the other writers.
	// Measured under a 60 s fresh-key flood (cmd/postguard-load -scenarios flood), the prune
	// deleted 33k–50k counters a second on PostgreSQL and, with as many clients as the service
	// could serve, 77k on SQLite: several times the 10k a second that 5k fresh requests a second
	// create. On SQLite each batch waits its turn for the one connection behind the checks
	// queued for it, so the batch must be large; even so, under a flood of far more clients than
	// it serves, the prune fell behind (docs/operations.md, Sizing the counters table).
	counterPruneBatchPause = 20 * time.Millisecond
)

// PruneCountersArgs are the args of the periodic job that deletes expired rate-limit counters:
// every Config.CounterPruneInterval (a minute), apart from prune, so that a flood of fresh keys
// (a row each) is deleted as fast as its windows expire.
type PruneCountersArgs struct{}

// Kind implements river.JobArgs.
func (PruneCountersArgs) Kind() string { return "prune_counters" }

// InsertOpts implements river.JobArgsWithInsertOpts: queue maintenance, and unique while one is in
// flight, as prune's, so that a run longer than the interval is never doubled.
func (PruneCountersArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		MaxAttempts: 3,
		Queue:       QueueMaintenance,
		UniqueOpts: river.UniqueOpts{
			ByArgs:  true,
			ByState: inFlightStates(),
		},
	}
}

// PruneCountersWorker deletes rate-limit counters whose window ended more than CounterRetention
// ago, in batches of counterPruneBatchSize with a pause between them, until a batch comes back
// short. A run that has worked half its timeout with counters still to delete (a backlog: every
// counter of a window expires at once) snoozes for no time and goes on as a new attempt at once,
// never cut short by its timeout nor rescued. Every delete is idempotent, so two at once only
// share the work (PostgreSQL skips the rows another holds).
type PruneCountersWorker struct {
	river.WorkerDefaults[PruneCountersArgs]

	batchPause       time.Duration
	batchSize        int
	budget           time.Duration // how long one attempt deletes before it snoozes
	counterRetention time.Duration
	logger           *slog.Logger
	nowFunc          func() time.Time
	store            db.Tables
	timeout          time.Duration
}

func newPruneCountersWorker(store db.Tables, logger *slog.Logger, config *Config) *PruneCountersWorker {
	timeout := pruneTimeout(config)
	return &PruneCountersWorker{
		batchPause:       counterPruneBatchPause,
		batchSize:        counterPruneBatchSize,
		budget:           timeout / 2,
		counterRetention: config.CounterRetention,
		logger:           logger,
		nowFunc:          config.NowFunc,
		store:            store,
		timeout:          timeout,
	}
}

// Timeout implements river.Worker.
func (w *PruneCountersWorker) Timeout(*river.Job[PruneCountersArgs]) time.Duration { return w.timeout }

// Work implements river.Worker.
func (w *PruneCountersWorker) Work(ctx context.Context, job *river.Job[PruneCountersArgs]) error {
	handler := w.logger.Handler()
	if jobLogger, ok := riverlog.LoggerSafely(ctx); ok {
		handler = slog.NewMultiHandler(handler, jobLogger.Handler())
	}
	logger := slog.New(handler).With(slog.Int64("job_id", job.ID), slog.String("kind", job.Kind))

	start := w.nowFunc()
	cutoff := start.Add(-w.counterRetention)
	var deleted int64
	var batches int
	for {
		n, err := w.store.RateLimitCounterDeleteExpired(ctx, cutoff, w.batchSize)
		if err != nil {
			return fmt.Errorf("error pruning rate limit counters: %w", err)
		}
		deleted += n
		batches++
		if n < int64(w.batchSize) {
			break
		}
		if w.nowFunc().Sub(start) >= w.budget {
			logger.InfoContext(ctx, "counters pruned, more to go: going on at once",
				slog.Int64("counters_deleted", deleted), slog.Int("batches", batches))
			return river.JobSnooze(0)
		}
		if err := sleepContext(ctx, w.batchPause); err != nil {
			return fmt.Errorf("error pruning rate limit counters: %w", err)
		}
	}

	// Every minute, so a quiet run says nothing at info level.
	level := slog.LevelInfo
	if deleted == 0 {
		level = slog.LevelDebug
	}
	logger.Log(ctx, level, "counters pruned", slog.Int64("counters_deleted", deleted), slog.Int("batches", batches))
	return nil
}
