package jobs

import (
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/email"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/jobs/mail/resendfake"
	"github.com/postguard/postguard/tokens"
)

func TestPruneWorker_Work(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		t.Run("DeletesExactlyWhatIsPastRetention", func(t *testing.T) {
			t.Parallel()

			const jobRetention = time.Hour
			bundle := newClientBundle(t, newStore, &clientOpts{configure: func(config *Config) {
				config.JobRetention = jobRetention
			}})
			ctx := t.Context()
			store := bundle.store
			user := createUser(t, store)
			bundle.start(t)

			// Old finished jobs of every finished state: three completed (more than a batch),
			// one cancelled, one discarded.
			var oldIDs []int64
			for i := range 3 {
				job := bundle.insert(t, WelcomeEmailArgs{UserID: 900_000 + int64(i)}, nil) // no such user
				bundle.wait(t, job.ID, river.EventKindJobCompleted)
				oldIDs = append(oldIDs, job.ID)
			}
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusUnprocessableEntity, Name: resendfake.NameValidationError})
			cancelled := bundle.insert(t, VerificationEmailArgs{UserID: user.ID}, nil)
			bundle.wait(t, cancelled.ID, river.EventKindJobCancelled)
			oldIDs = append(oldIDs, cancelled.ID)
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusInternalServerError})
			discarded := bundle.insert(t, PasswordResetEmailArgs{UserID: user.ID}, &river.InsertOpts{MaxAttempts: 1})
			require.Equal(t, rivertype.JobStateDiscarded, bundle.wait(t, discarded.ID, river.EventKindJobFailed).Job.State)
			oldIDs = append(oldIDs, discarded.ID)

			var lastOldFinalized time.Time
			for _, id := range oldIDs {
				job := bundle.job(t, id)
				require.NotNil(t, job.FinalizedAt)
				lastOldFinalized = maxTime(lastOldFinalized, *job.FinalizedAt)
			}

			// The recent jobs must finalize strictly after the old ones, whatever the resolution
			// of the clocks that stamp them: wait for the database's clock to pass the mark.
			require.Eventually(t, func() bool {
				dbNow, err := store.Now(ctx)
				return err == nil && dbNow.After(lastOldFinalized.Add(time.Millisecond))
			}, 10*time.Second, time.Millisecond)

			// Newer ones: a completed job, and one in flight (on a queue nobody works).
			recent := bundle.insert(t, WelcomeEmailArgs{UserID: 900_100}, nil)
			bundle.wait(t, recent.ID, river.EventKindJobCompleted)
			recentRow := bundle.job(t, recent.ID)
			require.True(t, recentRow.FinalizedAt.After(lastOldFinalized))
			inFlight := bundle.insert(t, WelcomeEmailArgs{UserID: 900_101}, &river.InsertOpts{Queue: "held"})

			// "Now" is JobRetention after a point between the old jobs and the recent one.
			cutoff := lastOldFinalized.Add(recentRow.FinalizedAt.Sub(lastOldFinalized) / 2)
			now := cutoff.Add(jobRetention)
			counterCutoff := now.Add(-DefaultCounterRetention)

			// A counter past retention: prune_counters' (TestPruneCountersWorker_Work), not prune's.
			expiredCounter := counterParams("expired", counterCutoff.Add(-time.Hour))
			consumeCounter(t, store, expiredCounter, 1)

			// Tokens: one expired past retention, one expired within it. Sealed copies: one of a
			// token older than the idempotency key's life, one younger.
			oldToken, keptToken := tokens.Hash("old token"), tokens.Hash("kept token")
			oldSealed, youngSealed := tokens.Hash("old sealed"), tokens.Hash("young sealed")
			for i, tok := range []struct {
				hash      []byte
				createdAt time.Time
				expiresAt time.Time
			}{
				{oldToken, counterCutoff.Add(-25 * time.Hour), counterCutoff.Add(-time.Minute)},
				{keptToken, counterCutoff.Add(-23 * time.Hour), counterCutoff.Add(time.Minute)},
				{oldSealed, now.Add(-IdempotencyKeyLifetime - time.Minute), now.Add(time.Hour)},
				{youngSealed, now.Add(-IdempotencyKeyLifetime + time.Minute), now.Add(time.Hour)},
			} {
				require.NoError(t, store.EmailTokenInsert(ctx, &db.EmailTokenInsertParams{
					TokenHash: tok.hash,
					UserID:    user.ID,
					Purpose:   db.TokenPurposeVerify,
					JobID:     int64(1000 + i),
					Sealed:    []byte("sealed"),
					ExpiresAt: tok.expiresAt,
					Now:       tok.createdAt,
				}))
			}

			// Message rows: one older than JOB_RETENTION, one younger.
			for i, createdAt := range []time.Time{cutoff.Add(-time.Minute), cutoff.Add(time.Minute)} {
				_, err := store.EmailMessageInsert(ctx, &db.EmailMessageInsertParams{
					JobID: int64(2000 + i), Kind: "welcome_email", UserID: user.ID,
					IdempotencyKey: tokens.IdempotencyKey("welcome_email", user.ID), Now: createdAt,
				})
				require.NoError(t, err)
			}

			// Webhook delivery ids: three older than their retention (more than a batch), one
			// younger. And a suppression older than everything: the list is never pruned.
			for i, receivedAt := range []time.Time{
				now.Add(-WebhookEventRetention - time.Hour),
				now.Add(-WebhookEventRetention - 2*time.Minute),
				now.Add(-WebhookEventRetention - time.Minute),
				now.Add(-WebhookEventRetention + time.Minute), // kept
			} {
				require.NoError(t, store.WebhookEventInsert(ctx, "msg_"+strconv.Itoa(i), receivedAt))
			}
			suppressionKey := email.SuppressionKey(testSecret, user.Email)
			require.NoError(t, store.EmailSuppressionInsert(ctx, &db.EmailSuppressionInsertParams{
				AddressHash: suppressionKey, Reason: email.ReasonBounced, EmailID: "re_old",
				SuppressedAt: now.Add(-365 * 24 * time.Hour), Now: now.Add(-365 * 24 * time.Hour),
			}))

			config := bundle.config.withDefaults()
			config.NowFunc = func() time.Time { return now }
			// Without Deps.Jobs (a host app's workers: its River keeps its own job retention),
			// prune deletes postguard's rows and leaves every job alone.
			hostPrune := newPruneWorker(store, nil, dbtest.Logger(t), config)
			require.NoError(t, hostPrune.Work(ctx, &river.Job[PruneArgs]{JobRow: &rivertype.JobRow{ID: 99, Kind: PruneArgs{}.Kind()}}))
			for _, id := range oldIDs {
				_, err := store.Jobs().JobGet(ctx, id)
				require.NoError(t, err, "job %d kept", id)
			}
			_, err := store.EmailMessageGetByJob(ctx, 2000)
			require.ErrorIs(t, err, db.ErrNotFound, "postguard's own rows pruned")

			worker := newPruneWorker(store, store.Jobs(), dbtest.Logger(t), config)
			worker.batchSize = 2
			worker.batchPause = time.Millisecond

			// Two prunes at once share the work without error.
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i := range errs {
				wg.Go(func() {
					errs[i] = worker.Work(ctx, &river.Job[PruneArgs]{JobRow: &rivertype.JobRow{ID: int64(i), Kind: PruneArgs{}.Kind()}})
				})
			}
			wg.Wait()
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])

			for _, id := range oldIDs {
				_, err := store.Jobs().JobGet(ctx, id)
				require.ErrorIs(t, err, rivertype.ErrNotFound, "job %d", id)
			}
			require.Equal(t, rivertype.JobStateCompleted, bundle.job(t, recent.ID).State)
			require.Equal(t, rivertype.JobStateAvailable, bundle.job(t, inFlight.ID).State)

			consumeCounter(t, store, expiredCounter, 2) // prune left it

			_, err = store.EmailTokenConsume(ctx, oldToken, db.TokenPurposeVerify, counterCutoff.Add(-2*time.Minute))
			require.ErrorIs(t, err, db.ErrNotFound)

			for jobID, wantSealed := range map[int64]bool{1002: false, 1003: true} {
				tok, err := store.EmailTokenGetByJob(ctx, jobID)
				require.NoError(t, err)
				require.Equal(t, wantSealed, tok.Sealed != nil, "token of job %d", jobID)
			}
			_, err = store.EmailMessageGetByJob(ctx, 2000)
			require.ErrorIs(t, err, db.ErrNotFound)
			_, err = store.EmailMessageGetByJob(ctx, 2001)
			require.NoError(t, err)
			userID, err := store.EmailTokenConsume(ctx, keptToken, db.TokenPurposeVerify, counterCutoff)
			require.NoError(t, err)
			require.Equal(t, user.ID, userID)

			// A pruned delivery id is new again; the kept one is still a replay.
			for i := range 3 {
				require.NoError(t, store.WebhookEventInsert(ctx, "msg_"+strconv.Itoa(i), now), "webhook event %d", i)
			}
			require.ErrorIs(t, store.WebhookEventInsert(ctx, "msg_3", now), db.ErrExists)
			_, err = store.EmailSuppressionGet(ctx, suppressionKey)
			require.NoError(t, err)
		})

		t.Run("DeviceRevocationsOnceEveryTokenTheyRevokedExpired", func(t *testing.T) {
			t.Parallel()

			const ttl = time.Hour
			bundle := newClientBundle(t, newStore, &clientOpts{configure: func(config *Config) { config.DeviceTokenTTL = ttl }})
			ctx := t.Context()
			store := bundle.store
			revoke := func(key string) time.Time {
				t.Helper()
				require.NoError(t, store.RateLimitDeviceRevocationUpsert(ctx, tokens.Hash(key)))
				revokedAt, err := store.RateLimitDeviceRevocationGet(ctx, tokens.Hash(key))
				require.NoError(t, err)
				return revokedAt
			}
			older := revoke("older")
			require.Eventually(t, func() bool {
				dbNow, err := store.Now(ctx)
				return err == nil && dbNow.After(older.Add(time.Millisecond))
			}, 10*time.Second, time.Millisecond)
			newer := revoke("newer")
			require.True(t, newer.After(older.Add(time.Millisecond)))

			prune := func(now time.Time) {
				t.Helper()
				config := bundle.config.withDefaults()
				config.NowFunc = func() time.Time { return now }
				worker := newPruneWorker(store, nil, dbtest.Logger(t), config)
				require.NoError(t, worker.Work(ctx, &river.Job[PruneArgs]{JobRow: &rivertype.JobRow{ID: 1, Kind: PruneArgs{}.Kind()}}))
			}
			revokedAt := func(key string) time.Time {
				t.Helper()
				at, err := store.RateLimitDeviceRevocationGet(ctx, tokens.Hash(key))
				require.NoError(t, err)
				return at
			}

			// A token issued just before "older" lives ttl, and the margin covers clock skew.
			prune(older.Add(ttl + DeviceRevocationMargin))
			require.True(t, older.Equal(revokedAt("older")), "kept while a token it revoked may stand")
			prune(older.Add(ttl + DeviceRevocationMargin + time.Microsecond))
			require.True(t, time.Unix(0, 0).Equal(revokedAt("older")), "pruned")
			require.True(t, newer.Equal(revokedAt("newer")), "the newer one is kept")
		})

		t.Run("PeriodicPruneRunsOnStart", func(t *testing.T) {
			t.Parallel()

			bundle := newClientBundle(t, newStore, &clientOpts{keepPeriodicJobs: true})
			bundle.start(t)

			event := bundle.waitKind(t, PruneArgs{}.Kind(), river.EventKindJobCompleted)
			require.Equal(t, QueueMaintenance, event.Job.Queue)
		})
	})
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
