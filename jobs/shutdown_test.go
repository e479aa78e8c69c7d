package jobs

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/jobs/mail/resendfake"
)

// TestEmailWorkers_InterruptedDelivery cuts an attempt short in the middle of its send, as a
// shutdown past SHUTDOWN_TIMEOUT does: River puts the job back without spending the attempt, and
// the next process sends the same request, which the provider delivers once.
func TestEmailWorkers_InterruptedDelivery(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		received := make(chan struct{})
		release := make(chan struct{})
		var first atomic.Bool
		bundle := newClientBundle(t, newStore, &clientOpts{fake: &resendfake.Config{
			BeforeAnswerFunc: func(*resendfake.Request) {
				if first.CompareAndSwap(false, true) {
					close(received)
					<-release // the POST arrived; hold the answer while the worker is cut short
				}
			},
		}})
		var releaseOnce sync.Once
		releaseHold := func() { releaseOnce.Do(func() { close(release) }) }
		t.Cleanup(releaseHold) // before the fake closes, which waits for the held request
		user := createUser(t, bundle.store)
		job := bundle.insert(t, VerificationEmailArgs{UserID: user.ID}, nil)

		client := bundle.store.Jobs()
		bundle.start(t)

		select {
		case <-received:
		case <-time.After(eventTimeout):
			require.FailNow(t, "the fake never received the POST")
		}

		// Shutdown cuts the attempt short: the worker's context is cancelled mid-request.
		require.NoError(t, client.StopAndCancel(t.Context()))
		interrupted := bundle.job(t, job.ID)
		require.Equal(t, rivertype.JobStateAvailable, interrupted.State)
		require.Equal(t, 0, interrupted.Attempt) // given back
		require.Empty(t, interrupted.Errors)

		// The provider finishes processing the first request anyway.
		releaseHold()
		require.Eventually(t, func() bool { return len(bundle.fake.Deliveries()) == 1 }, eventTimeout, 10*time.Millisecond)

		// A new process works the job again.
		bundle.start(t)
		completed := bundle.wait(t, job.ID, river.EventKindJobCompleted)
		require.Equal(t, 1, completed.Job.Attempt)

		require.Len(t, bundle.fake.Deliveries(), 1)
		requests := bundle.fake.Requests()
		require.Len(t, requests, 2)
		require.Equal(t, requests[0].Header.Get("Idempotency-Key"), requests[1].Header.Get("Idempotency-Key"))
		require.Equal(t, requests[0].Body, requests[1].Body)
		require.Equal(t, http.StatusOK, requests[1].Status)
	})
}
