package jobs

import (
	"context"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/internal/dbtest"
)

func TestPacer_Interval(t *testing.T) {
	t.Parallel()

	require.Equal(t, 525*time.Millisecond, pacerInterval(2))
	require.Equal(t, 21*time.Millisecond, pacerInterval(50))
	require.Nil(t, newPacer(nil, DefaultProviderName, 0))
	require.Nil(t, newPacer(nil, DefaultProviderName, math.NaN()))
	require.Nil(t, newPacer(nil, DefaultProviderName, math.Inf(1)), "slots no time apart are no pace")
	require.Nil(t, newPacer(nil, DefaultProviderName, 2e6))
	require.NotNil(t, newPacer(nil, DefaultProviderName, 1e4))
}

func TestEmailWorkers_Pacing(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		t.Run("SpacesSendsAcrossWorkers", func(t *testing.T) {
			t.Parallel()

			const (
				sends  = 8
				maxRPS = 10.0
			)
			bundle := newClientBundle(t, newStore, &clientOpts{configure: func(config *Config) {
				config.EmailWorkers = sends // all at once, were it not for the pacer
				config.MaxRPS = maxRPS
			}})
			jobIDs := make([]int64, 0, sends)
			for range sends {
				user := createUser(t, bundle.store)
				jobIDs = append(jobIDs, bundle.insert(t, VerificationEmailArgs{UserID: user.ID}, nil).ID)
			}
			// Every slot is at or after the database's now at its reservation, which is after
			// this (the database runs on this machine's clock).
			started, err := bundle.store.Now(t.Context())
			require.NoError(t, err)
			bundle.start(t)
			for _, id := range jobIDs {
				bundle.wait(t, id, river.EventKindJobCompleted)
			}

			requests := bundle.fake.Requests()
			require.Len(t, requests, sends)
			times := make([]time.Time, 0, sends)
			for _, req := range requests {
				times = append(times, req.ReceivedAt)
			}
			slices.SortFunc(times, time.Time.Compare)
			// The slots are one interval apart and each send waits for its own, so the k-th send
			// cannot arrive before k intervals have passed: at most k+1 sends in any k intervals,
			// however fast or slow the machine.
			interval := pacerInterval(maxRPS)
			for k, at := range times {
				require.False(t, at.Before(started.Add(time.Duration(k)*interval)), "send %d arrived %s after the start, before its %s", k, at.Sub(started), time.Duration(k)*interval)
			}
		})

		t.Run("SnoozesForAFarSlotAndKeepsIt", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			bundle := newClientBundle(t, newStore, &clientOpts{configure: func(config *Config) {
				config.MaxRPS = 1
			}})
			// Someone took the schedule ten minutes ahead: the next slot is that far, much
			// further than half of JobTimeout.
			taken, _, err := bundle.store.SendPacerReserve(ctx, DefaultProviderName, 10*time.Minute)
			require.NoError(t, err)
			wantSlot := taken.Add(10 * time.Minute)

			user := createUser(t, bundle.store)
			job := bundle.insert(t, VerificationEmailArgs{UserID: user.ID}, nil)
			bundle.start(t)

			event := bundle.wait(t, job.ID, river.EventKindJobSnoozed)
			require.Equal(t, 0, event.Job.Attempt) // a pacer snooze spends no attempt
			require.Empty(t, event.Job.Errors)
			meta := parseJobMetadata(event.Job.Metadata)
			require.NotNil(t, meta.PacerSlotUS)
			require.Equal(t, wantSlot.UnixMicro(), *meta.PacerSlotUS, "the slot is kept for the job's return")
			require.Equal(t, int64(1), meta.PacerSnoozes)
			// Snoozed until about the slot: River adds the wait to its own now, read after the
			// database's.
			require.False(t, event.Job.ScheduledAt.Before(wantSlot.Add(-time.Millisecond)), "scheduled %s, slot %s", event.Job.ScheduledAt, wantSlot)
			require.Empty(t, bundle.fake.Requests())
			require.Equal(t, float64(1), bundle.deliveries(t, "verification_email", OutcomeSnoozed))
		})

		t.Run("ComesBackToItsKeptSlot", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			bundle := newClientBundle(t, newStore, &clientOpts{configure: func(config *Config) {
				config.MaxRPS = 0.01 // one slot every 105 s: a second reservation would show
			}})
			// A job back from a pacer snooze, to a slot a moment from now.
			dbNow, err := bundle.store.Now(ctx)
			require.NoError(t, err)
			slot := dbNow.Add(200 * time.Millisecond)
			user := createUser(t, bundle.store)
			job := bundle.insert(t, VerificationEmailArgs{UserID: user.ID}, &river.InsertOpts{
				Metadata: []byte(`{"snoozes": 1, "pacer_snoozes": 1, "pacer_slot_us": ` + strconv.FormatInt(slot.UnixMicro(), 10) + `}`),
			})
			bundle.start(t)

			event := bundle.wait(t, job.ID, river.EventKindJobCompleted)
			require.Nil(t, parseJobMetadata(event.Job.Metadata).PacerSlotUS, "the slot is spent")
			requests := bundle.fake.Requests()
			require.Len(t, requests, 1)
			require.False(t, requests[0].ReceivedAt.Before(slot), "sent at %s, before its slot %s", requests[0].ReceivedAt, slot)

			// It reserved nothing more: the schedule is empty, so the next slot is now.
			next, nextNow, err := bundle.store.SendPacerReserve(ctx, DefaultProviderName, pacerInterval(0.01))
			require.NoError(t, err)
			require.Equal(t, nextNow, next)
		})

		t.Run("NotPastTheKeysLife", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			bundle := newClientBundle(t, newStore, &clientOpts{configure: func(config *Config) {
				config.MaxRPS = 1
			}})
			// A backlog so deep that the next slot is a day and an hour away: past the life of
			// the idempotency key the job's first attempt makes.
			_, _, err := bundle.store.SendPacerReserve(ctx, DefaultProviderName, IdempotencyKeyLifetime+time.Hour)
			require.NoError(t, err)

			user := createUser(t, bundle.store)
			job := bundle.insert(t, VerificationEmailArgs{UserID: user.ID}, nil)
			bundle.start(t)

			// Fails like any error (as a provider snooze past the key's life does), to be
			// retried on the usual schedule: no snooze, no slot kept, nothing sent.
			event := bundle.wait(t, job.ID, river.EventKindJobFailed, river.EventKindJobSnoozed)
			require.Equal(t, river.EventKindJobFailed, event.Kind)
			require.Equal(t, rivertype.JobStateRetryable, event.Job.State)
			require.Equal(t, 1, event.Job.Attempt)
			require.Contains(t, event.Job.Errors[0].Error, "outlive the idempotency key")
			require.Nil(t, parseJobMetadata(event.Job.Metadata).PacerSlotUS)
			require.Empty(t, bundle.fake.Requests())
			require.Equal(t, float64(1), bundle.deliveries(t, "verification_email", OutcomeRetried))
		})

	})
}

// TestEmailWorkers_PacingOnTheDatabasesClock: a worker process whose clock runs an hour ahead
// sends a mail, then a worker with the right time sends another. The schedule runs on the
// database's clock, so the first worker's hour moved nothing: the second mail goes out at once,
// not snoozed for an hour. PostgreSQL only: two processes share a database there.
func TestEmailWorkers_PacingOnTheDatabasesClock(t *testing.T) {
	t.Parallel()

	databaseURL := dbtest.PostgresURL(t)
	openStore := func(t testing.TB, opts ...dbtest.Option) *dbtest.Store {
		return dbtest.OpenPostgres(t, databaseURL, opts...)
	}

	ahead := newClientBundle(t, openStore, &clientOpts{
		configure: func(config *Config) {
			config.MaxRPS = 1
			config.NowFunc = func() time.Time { return time.Now().Add(time.Hour) }
		},
		configureRiver: func(riverConfig *river.Config) { riverConfig.Test.Time = aheadClock{time.Hour} },
	})
	user := createUser(t, ahead.store)
	first := ahead.insert(t, VerificationEmailArgs{UserID: user.ID}, nil)
	ahead.start(t)
	ahead.wait(t, first.ID, river.EventKindJobCompleted)
	stopCtx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, ahead.store.Jobs().Stop(stopCtx))

	onTime := newClientBundle(t, openStore, &clientOpts{configure: func(config *Config) {
		config.MaxRPS = 1
	}})
	second := onTime.insert(t, VerificationEmailArgs{UserID: createUser(t, onTime.store).ID}, nil)
	onTime.start(t)
	event := onTime.wait(t, second.ID, river.EventKindJobCompleted, river.EventKindJobSnoozed)
	require.Equal(t, river.EventKindJobCompleted, event.Kind, "snoozed until %s", event.Job.ScheduledAt)
	require.Zero(t, parseJobMetadata(event.Job.Metadata).PacerSnoozes)
	require.Len(t, onTime.fake.Requests(), 1)
}

// aheadClock is River's clock in a process whose clock runs offset ahead.
type aheadClock struct{ offset time.Duration }

func (c aheadClock) Now() time.Time { return time.Now().Add(c.offset) }

func (c aheadClock) NowOrNil() *time.Time {
	now := c.Now()
	return &now
}
