package jobs

import (
	"context"
	"crypto/sha256"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/dbtest"
)

func TestPruneCountersWorker_Work(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		// setup is a store and a counters prune on it whose clock says now, with batches of
		// batchSize; the counters of ends are spent once each.
		type testBundle struct {
			store   *deleteRecorder
			now     time.Time
			cutoff  time.Time
			config  *Config
			expired []*db.RateLimitCounterConsumeParams
			kept    []*db.RateLimitCounterConsumeParams
		}
		setup := func(t *testing.T, expired int) *testBundle {
			t.Helper()

			now := time.Now().UTC().Truncate(time.Microsecond)
			cutoff := now.Add(-DefaultCounterRetention)
			bundle := &testBundle{
				store:  &deleteRecorder{Tables: newStore(t)},
				now:    now,
				cutoff: cutoff,
				config: (&Config{NowFunc: func() time.Time { return now }}).withDefaults(),
			}
			for i := range expired {
				// From an hour before the cutoff to a microsecond before it.
				end := cutoff.Add(-time.Microsecond - time.Duration(i)*time.Hour/time.Duration(expired))
				bundle.expired = append(bundle.expired, counterParams("expired"+string(rune('a'+i)), end))
			}
			// Kept: a window that ended at the cutoff exactly, and one after it.
			bundle.kept = []*db.RateLimitCounterConsumeParams{
				counterParams("at cutoff", cutoff),
				counterParams("within retention", cutoff.Add(time.Minute)),
			}
			for _, p := range append(append([]*db.RateLimitCounterConsumeParams{}, bundle.expired...), bundle.kept...) {
				consumeCounter(t, bundle.store.Tables, p, 1)
			}
			bundle.store.reset()
			return bundle
		}
		newWorker := func(t *testing.T, bundle *testBundle, batchSize int) *PruneCountersWorker {
			t.Helper()

			worker := newPruneCountersWorker(bundle.store, dbtest.Logger(t), bundle.config)
			require.Equal(t, counterPruneBatchSize, worker.batchSize)
			worker.batchSize = batchSize
			worker.batchPause = time.Millisecond
			return worker
		}
		work := func(ctx context.Context, worker *PruneCountersWorker, id int64) error {
			return worker.Work(ctx, &river.Job[PruneCountersArgs]{JobRow: &rivertype.JobRow{ID: id, Kind: PruneCountersArgs{}.Kind()}})
		}
		// requirePruned checks that every expired counter was deleted (it starts again at 1) and
		// every kept one was not (it goes on to 2).
		requirePruned := func(t *testing.T, bundle *testBundle) {
			t.Helper()

			for _, p := range bundle.expired {
				consumeCounter(t, bundle.store.Tables, p, 1)
			}
			for _, p := range bundle.kept {
				consumeCounter(t, bundle.store.Tables, p, 2)
			}
		}

		t.Run("DeletesExactlyWhatIsPastRetention", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, 5)
			worker := newWorker(t, bundle, 2)
			require.NoError(t, work(t.Context(), worker, 1))
			requirePruned(t, bundle)
		})

		t.Run("BatchesBounded", func(t *testing.T) {
			t.Parallel()

			// 7 expired counters in batches of 3: two full batches, a short one, and done.
			bundle := setup(t, 7)
			worker := newWorker(t, bundle, 3)
			require.NoError(t, work(t.Context(), worker, 1))
			require.Equal(t, []deleteCall{
				{before: bundle.cutoff, max: 3, deleted: 3},
				{before: bundle.cutoff, max: 3, deleted: 3},
				{before: bundle.cutoff, max: 3, deleted: 1},
			}, bundle.store.calls())
			requirePruned(t, bundle)
		})

		t.Run("TwoAtOnceShareTheWork", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, 9)
			worker := newWorker(t, bundle, 2)
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i := range errs {
				wg.Go(func() { errs[i] = work(t.Context(), worker, int64(i)) })
			}
			wg.Wait()
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			var deleted int64
			for _, call := range bundle.store.calls() {
				require.LessOrEqual(t, call.deleted, int64(2))
				deleted += call.deleted
			}
			require.Equal(t, int64(9), deleted, "each counter deleted once")
			requirePruned(t, bundle)
		})

		t.Run("SnoozesOnceItsBudgetIsSpent", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, 5)
			// A clock that moves on by the budget at every reading: after its first full batch,
			// the attempt has worked its budget.
			worker := newWorker(t, bundle, 2)
			var readings atomic.Int64
			worker.nowFunc = func() time.Time {
				return bundle.now.Add(time.Duration(readings.Add(1)-1) * worker.budget)
			}
			require.Equal(t, pruneTimeout(bundle.config)/2, worker.budget)

			err := work(t.Context(), worker, 1)
			var snooze *rivertype.JobSnoozeError
			require.ErrorAs(t, err, &snooze, "a snooze, so that River works it again at once without spending an attempt")
			require.Zero(t, snooze.Duration)
			require.Equal(t, []deleteCall{{before: bundle.cutoff, max: 2, deleted: 2}}, bundle.store.calls(), "one batch, then the snooze")

			// The next attempt goes on where it stopped.
			worker.nowFunc = bundle.config.NowFunc
			require.NoError(t, work(t.Context(), worker, 1))
			requirePruned(t, bundle)
		})

		t.Run("ShutdownCutsItShort", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, 5)
			worker := newWorker(t, bundle, 2)
			ctx, cancel := context.WithCancel(t.Context())
			bundle.store.afterDelete = cancel // cancelled during the first batch
			err := work(ctx, worker, 1)
			require.ErrorIs(t, err, context.Canceled, "River puts a job cut short by shutdown back, unspent")
		})

		t.Run("PeriodicRunsOnStartAndEveryInterval", func(t *testing.T) {
			t.Parallel()

			bundle := newClientBundle(t, newStore, &clientOpts{
				keepPeriodicJobs: true,
				configure:        func(config *Config) { config.CounterPruneInterval = 100 * time.Millisecond },
			})
			bundle.start(t)

			first := bundle.waitKind(t, PruneCountersArgs{}.Kind(), river.EventKindJobCompleted)
			require.Equal(t, QueueMaintenance, first.Job.Queue)
			second := bundle.waitKind(t, PruneCountersArgs{}.Kind(), river.EventKindJobCompleted)
			require.NotEqual(t, first.Job.ID, second.Job.ID, "run again, CounterPruneInterval later")
			bundle.waitKind(t, PruneArgs{}.Kind(), river.EventKindJobCompleted)
		})
	})
}

// counterParams is a counter of a 15-minute window ending at windowEnd.
func counterParams(name string, windowEnd time.Time) *db.RateLimitCounterConsumeParams {
	sum := sha256.Sum256([]byte("counter " + name))
	return &db.RateLimitCounterConsumeParams{
		KeyHash:     sum[:],
		WindowStart: windowEnd.Add(-15 * time.Minute),
		WindowEnd:   windowEnd,
		LimitCount:  10,
	}
}

// consumeCounter spends one request of p's counter and wants its count to be want.
func consumeCounter(t *testing.T, store db.Tables, p *db.RateLimitCounterConsumeParams, want int64) {
	t.Helper()

	count, ok, err := store.RateLimitCounterConsume(t.Context(), p)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, want, count, "counter ending %s", p.WindowEnd)
}

// deleteCall is one RateLimitCounterDeleteExpired: its arguments and what it deleted.
type deleteCall struct {
	before  time.Time
	max     int
	deleted int64
}

// deleteRecorder records the counters' deletes of the Tables it wraps.
type deleteRecorder struct {
	db.Tables

	// afterDelete, when set, runs after each delete.
	afterDelete func()

	mu      sync.Mutex
	deletes []deleteCall
}

func (r *deleteRecorder) RateLimitCounterDeleteExpired(ctx context.Context, before time.Time, limit int) (int64, error) {
	n, err := r.Tables.RateLimitCounterDeleteExpired(ctx, before, limit)
	if err != nil {
		return n, err
	}
	r.mu.Lock()
	r.deletes = append(r.deletes, deleteCall{before: before, max: limit, deleted: n})
	r.mu.Unlock()
	if r.afterDelete != nil {
		r.afterDelete()
	}
	return n, nil
}

func (r *deleteRecorder) calls() []deleteCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]deleteCall(nil), r.deletes...)
}

func (r *deleteRecorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deletes = nil
}
