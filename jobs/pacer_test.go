package jobs

import (
	"slices"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db/dbtest"
)

func TestPacer_Interval(t *testing.T) {
	t.Parallel()

	require.Equal(t, 525*time.Millisecond, pacerInterval(2))
	require.Equal(t, 21*time.Millisecond, pacerInterval(50))
	require.Nil(t, newPacer(nil, 0))
}

func TestEmailWorkers_Pacing(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		t.Run("SpacesSendsAcrossWorkers", func(t *testing.T) {
			t.Parallel()

			const (
				sends  = 10
				maxRPS = 50.0
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
			span := times[len(times)-1].Sub(times[0])
			require.GreaterOrEqual(t, span, time.Duration(float64(sends-1)/maxRPS*float64(time.Second)),
				"%d sends at %v/s took %s", sends, maxRPS, span)
		})

		t.Run("SnoozesForAFarSlotAndKeepsIt", func(t *testing.T) {
			t.Parallel()

			const sends = 3
			bundle := newClientBundle(t, newStore, &clientOpts{configure: func(config *Config) {
				config.EmailWorkers = sends
				config.MaxRPS = 1 // a slot every 1.05s
				config.JobTimeout = time.Second
				config.RescueAfter = 30 * time.Second
			}})
			jobIDs := make([]int64, 0, sends)
			for range sends {
				user := createUser(t, bundle.store)
				jobIDs = append(jobIDs, bundle.insert(t, VerificationEmailArgs{UserID: user.ID}, nil).ID)
			}
			bundle.start(t)

			var pacerSnoozes int64
			for _, id := range jobIDs {
				event := bundle.wait(t, id, river.EventKindJobCompleted)
				require.Equal(t, 1, event.Job.Attempt) // a pacer snooze spends no attempt
				require.Empty(t, event.Job.Errors)
				meta := parseJobMetadata(event.Job.Metadata)
				require.Nil(t, meta.PacerSlotUS)
				pacerSnoozes += meta.PacerSnoozes
			}
			// Two of the three waited longer than JobTimeout/2 and snoozed once each, coming back
			// to the slot they held: no slot was reserved twice.
			require.Equal(t, int64(2), pacerSnoozes)

			requests := bundle.fake.Requests()
			require.Len(t, requests, sends)
			times := make([]time.Time, 0, sends)
			for _, req := range requests {
				times = append(times, req.ReceivedAt)
			}
			slices.SortFunc(times, time.Time.Compare)
			// Every send happens at or after its slot, and the slots are 1.05s apart. (Two sends
			// may come closer than that when a snoozed job comes back late to a slot it held:
			// the rate holds over the whole run, see emailDeliverer.pace.)
			span := times[len(times)-1].Sub(times[0])
			require.GreaterOrEqual(t, span, time.Duration(sends-1)*time.Second)
			require.Equal(t, float64(2), bundle.deliveries(t, "verification_email", OutcomeSnoozed))
		})
	})
}
