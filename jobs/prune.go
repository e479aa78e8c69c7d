package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverlog"
	"github.com/riverqueue/river/rivertype"

	"github.com/postguard/postguard/db"
)

// WebhookEventRetention is how long the svix-id of an applied webhook delivery is kept, so that
// its replay changes nothing: a week, well past the last retry of a delivery Resend could not
// make (its retries end about a day after the first attempt). A replay after that applies
// again, which only repeats what it did (statuses and times merge the same way, and an address
// suppressed once is suppressed again, even if it was taken off the list since).
const WebhookEventRetention = 7 * 24 * time.Hour

const (
	// pruneBatchSize bounds each delete, so no statement holds many locks or runs long.
	pruneBatchSize = 1000
	// pruneBatchPause is the breath between two full batches, leaving room to other writers.
	pruneBatchPause = 100 * time.Millisecond
)

// PruneArgs are the args of the periodic prune job.
type PruneArgs struct{}

// Kind implements river.JobArgs.
func (PruneArgs) Kind() string { return "prune" }

// InsertOpts implements river.JobArgsWithInsertOpts: queue maintenance, and unique while one is in
// flight so that a stalled queue does not pile prunes up. (Two at once would still be safe.)
func (PruneArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		MaxAttempts: 3,
		Queue:       QueueMaintenance,
		UniqueOpts: river.UniqueOpts{
			ByArgs:  true,
			ByState: inFlightStates(),
		},
	}
}

// inFlightStates are the states of a job not finished yet.
func inFlightStates() []rivertype.JobState {
	return []rivertype.JobState{
		rivertype.JobStateAvailable,
		rivertype.JobStatePending,
		rivertype.JobStateRetryable,
		rivertype.JobStateRunning,
		rivertype.JobStateScheduled,
	}
}

// finishedStates are the states prune deletes jobs from.
func finishedStates() []rivertype.JobState {
	return []rivertype.JobState{
		rivertype.JobStateCompleted,
		rivertype.JobStateCancelled,
		rivertype.JobStateDiscarded,
	}
}

// PruneWorker deletes, in bounded batches: revocations of trusted devices older than
// DeviceTokenTTL (and DeviceRevocationMargin), email tokens that expired more than CounterRetention ago, the sealed
// copies of tokens older than IdempotencyKeyLifetime, email message rows and, given Deps.Jobs,
// finished jobs (completed, cancelled, discarded) older than JobRetention, and the ids of
// webhook deliveries older than WebhookEventRetention. Rate-limit counters are
// PruneCountersWorker's, every minute. The suppression list is never pruned: an
// address leaves it only through the admin API. Jobs go through
// River's public JobList and JobDeleteMany (no SQL on River's tables, whose times SQLite keeps as
// text); without Deps.Jobs (a host app's River, whose own job cleaner keeps its retention) they
// are left alone. Every delete is idempotent, so two prunes at once only share the work.
type PruneWorker struct {
	river.WorkerDefaults[PruneArgs]

	batchPause       time.Duration
	batchSize        int
	counterRetention time.Duration // of email tokens, past their expiry
	deviceTokenTTL   time.Duration
	jobRetention     time.Duration
	jobs             RiverClient // nil: finished jobs are not this worker's to delete
	logger           *slog.Logger
	nowFunc          func() time.Time
	store            db.Tables
	timeout          time.Duration
}

func newPruneWorker(store db.Tables, jobs RiverClient, logger *slog.Logger, config *Config) *PruneWorker {
	return &PruneWorker{
		batchPause:       pruneBatchPause,
		batchSize:        pruneBatchSize,
		counterRetention: config.CounterRetention,
		deviceTokenTTL:   config.DeviceTokenTTL,
		jobRetention:     config.JobRetention,
		jobs:             jobs,
		logger:           logger,
		nowFunc:          config.NowFunc,
		store:            store,
		timeout:          pruneTimeout(config),
	}
}

// pruneTimeout is the timeout of both prunes: longer than an email's attempt, still well under
// RescueAfter (which exceeds JobTimeout), so a long prune is never rescued while it runs. Cut
// short, the next run carries on where it stopped.
func pruneTimeout(config *Config) time.Duration {
	return max(config.JobTimeout, config.RescueAfter/2)
}

// Timeout implements river.Worker.
func (w *PruneWorker) Timeout(*river.Job[PruneArgs]) time.Duration { return w.timeout }

// Work implements river.Worker.
func (w *PruneWorker) Work(ctx context.Context, job *river.Job[PruneArgs]) error {
	handler := w.logger.Handler()
	if jobLogger, ok := riverlog.LoggerSafely(ctx); ok {
		handler = slog.NewMultiHandler(handler, jobLogger.Handler())
	}
	logger := slog.New(handler).With(slog.Int64("job_id", job.ID), slog.String("kind", job.Kind))

	now := w.nowFunc()

	// A revocation of an account's devices revokes tokens issued before it; once every one of
	// them has expired, it revokes nothing and goes (a token issued after it carries its time,
	// and stands whether the row is there or not).
	revocations, err := w.deleteLoop(ctx, func(ctx context.Context) (int64, error) {
		return w.store.RateLimitDeviceRevocationDeleteBefore(ctx, now.Add(-w.deviceTokenTTL-DeviceRevocationMargin), w.batchSize)
	})
	if err != nil {
		return fmt.Errorf("error pruning device revocations: %w", err)
	}

	tokens, err := w.deleteLoop(ctx, func(ctx context.Context) (int64, error) {
		return w.store.EmailTokenDeleteExpired(ctx, now.Add(-w.counterRetention), w.batchSize)
	})
	if err != nil {
		return fmt.Errorf("error pruning email tokens: %w", err)
	}

	// A sealed copy is kept only while its job may send it; past the idempotency key's life a job
	// starts over with a new token (emailDeliverer.prepare), so an older one is of no use.
	sealed, err := w.deleteLoop(ctx, func(ctx context.Context) (int64, error) {
		return w.store.EmailTokenEraseSealedBefore(ctx, now.Add(-IdempotencyKeyLifetime), w.batchSize)
	})
	if err != nil {
		return fmt.Errorf("error erasing old sealed tokens: %w", err)
	}

	messages, err := w.deleteLoop(ctx, func(ctx context.Context) (int64, error) {
		return w.store.EmailMessageDeleteBefore(ctx, now.Add(-w.jobRetention), w.batchSize)
	})
	if err != nil {
		return fmt.Errorf("error pruning email messages: %w", err)
	}

	webhookEvents, err := w.deleteLoop(ctx, func(ctx context.Context) (int64, error) {
		return w.store.WebhookEventDeleteBefore(ctx, now.Add(-WebhookEventRetention), w.batchSize)
	})
	if err != nil {
		return fmt.Errorf("error pruning webhook events: %w", err)
	}

	jobs, err := w.pruneJobs(ctx, now.Add(-w.jobRetention))
	if err != nil {
		return fmt.Errorf("error pruning jobs: %w", err)
	}

	logger.InfoContext(ctx, "prune done",
		slog.Int64("device_revocations_deleted", revocations),
		slog.Int64("tokens_deleted", tokens),
		slog.Int64("sealed_tokens_erased", sealed),
		slog.Int64("messages_deleted", messages),
		slog.Int64("webhook_events_deleted", webhookEvents),
		slog.Int64("jobs_deleted", jobs),
	)
	return nil
}

// deleteLoop runs deleteBatch until a batch comes back short, pausing between batches.
func (w *PruneWorker) deleteLoop(ctx context.Context, deleteBatch func(ctx context.Context) (int64, error)) (int64, error) {
	var total int64
	for {
		n, err := deleteBatch(ctx)
		if err != nil {
			return total, err
		}
		total += n
		if n < int64(w.batchSize) {
			return total, nil
		}
		if err := sleepContext(ctx, w.batchPause); err != nil {
			return total, err
		}
	}
}

// pruneJobs deletes finished jobs finalized before cutoff. JobDeleteMany has no time filter that
// works on both engines, so each batch lists the oldest finished jobs of a state (ordered by
// finalized_at), keeps those before cutoff, and deletes them by id, still filtered by the state:
// a job retried by hand between the list and the delete is left alone.
func (w *PruneWorker) pruneJobs(ctx context.Context, cutoff time.Time) (int64, error) {
	client := w.jobs
	if client == nil {
		return 0, nil
	}
	var total int64
	for _, state := range finishedStates() {
		for {
			res, err := client.JobList(ctx, river.NewJobListParams().
				States(state).
				OrderBy(river.JobListOrderByFinalizedAt, river.SortOrderAsc).
				First(w.batchSize))
			if err != nil {
				return total, fmt.Errorf("error listing %s jobs: %w", state, err)
			}

			ids := make([]int64, 0, len(res.Jobs))
			for _, job := range res.Jobs {
				if job.FinalizedAt == nil || !job.FinalizedAt.Before(cutoff) {
					break // ordered by finalized_at: the rest are newer
				}
				ids = append(ids, job.ID)
			}
			if len(ids) == 0 {
				break
			}

			deleted, err := client.JobDeleteMany(ctx, river.NewJobDeleteManyParams().
				IDs(ids...).
				States(state).
				First(len(ids)))
			if err != nil {
				return total, fmt.Errorf("error deleting %s jobs: %w", state, err)
			}
			total += int64(len(deleted.Jobs))

			// A short batch means the list is drained; an empty delete means another prune
			// holds these rows (PostgreSQL skips locked ones) and will delete them.
			if len(ids) < w.batchSize || len(deleted.Jobs) == 0 {
				break
			}
			if err := sleepContext(ctx, w.batchPause); err != nil {
				return total, err
			}
		}
	}
	return total, nil
}
