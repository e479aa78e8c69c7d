package jobs

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/dbtest"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/jobs/mail/resendfake"
	"github.com/postguard/postguard/jobs/tokens"
)

// retryNow retries a failed job at once, so a test sees its next attempt without waiting out
// RetryPolicy's minute.
type retryNow struct{}

func (retryNow) NextRetry(*rivertype.JobRow) time.Time { return time.Now() }

// senderFunc is a mail.Sender that calls a function.
type senderFunc func(ctx context.Context, msg *mail.Message) (string, error)

func (f senderFunc) Send(ctx context.Context, msg *mail.Message) (string, error) { return f(ctx, msg) }

func TestEmailWorkers_Delivery(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore func(t *testing.T) db.Store) {
		// A 5xx after the provider delivered (the answer was lost): the retry sends the same
		// bytes under the same key, and the provider delivers once.
		t.Run("RetrySendsSameBytesUnderSameKey", func(t *testing.T) {
			t.Parallel()

			bundle := setupWorker(t, newStore(t), &workerOpts{configureRiver: func(riverConfig *river.Config) {
				riverConfig.RetryPolicy = retryNow{}
			}})
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusInternalServerError, Deliver: true})
			user := createUser(t, bundle.store)
			job := bundle.insert(t, PasswordResetEmailArgs{UserID: user.ID}, nil)
			bundle.start(t)

			completed := bundle.wait(t, job.ID, river.EventKindJobCompleted)
			require.Equal(t, 2, completed.Job.Attempt)

			requests := bundle.fake.Requests()
			require.Len(t, requests, 2)
			require.Equal(t, requests[0].Header.Get("Idempotency-Key"), requests[1].Header.Get("Idempotency-Key"))
			require.Regexp(t, keyPattern("password_reset_email", user.ID), requests[0].Header.Get("Idempotency-Key"))
			require.Equal(t, requests[0].Body, requests[1].Body, "byte-identical payloads")
			require.Len(t, bundle.fake.Deliveries(), 1)

			stored, err := bundle.store.EmailTokenGetByJob(t.Context(), job.ID)
			require.NoError(t, err)
			require.Nil(t, stored.Sealed, "sealed copy erased once accepted")
		})

		// A job past its key's life, or whose sealed copy is gone, does not send another token
		// under the old key: it starts over with a new key and a new token.
		for _, tt := range []struct {
			name string
			// between runs inside the first (failing) send, before the next attempt.
			between func(t *testing.T, store db.Store, clock *atomic.Int64)
		}{
			{"PastKeyLifetime", func(_ *testing.T, _ db.Store, clock *atomic.Int64) {
				clock.Store(int64(IdempotencyKeyLifetime + time.Minute))
			}},
			{"SealedCopyGone", func(t *testing.T, store db.Store, _ *atomic.Int64) {
				erased, err := store.EmailTokenEraseSealedBefore(context.Background(), time.Now().Add(time.Hour), 10)
				require.NoError(t, err)
				require.Equal(t, int64(1), erased)
			}},
		} {
			t.Run("StartsOver"+tt.name, func(t *testing.T) {
				t.Parallel()

				var clock atomic.Int64 // offset of the workers' clock from the real one
				var sends atomic.Int64
				var store db.Store
				bundle := setupWorker(t, newStore(t), &workerOpts{
					configure: func(config *Config) {
						config.NowFunc = func() time.Time { return time.Now().Add(time.Duration(clock.Load())) }
					},
					configureRiver: func(riverConfig *river.Config) { riverConfig.RetryPolicy = retryNow{} },
					sender: func(inner mail.Sender) mail.Sender {
						return senderFunc(func(ctx context.Context, msg *mail.Message) (string, error) {
							id, err := inner.Send(ctx, msg)
							if sends.Add(1) == 1 {
								tt.between(t, store, &clock)
							}
							return id, err
						})
					},
				})
				store = bundle.store
				bundle.fake.Enqueue(resendfake.Response{Status: http.StatusInternalServerError})
				user := createUser(t, bundle.store)
				job := bundle.insert(t, VerificationEmailArgs{UserID: user.ID}, nil)
				bundle.start(t)
				bundle.wait(t, job.ID, river.EventKindJobCompleted)

				requests := bundle.fake.Requests()
				require.Len(t, requests, 2)
				firstKey, secondKey := requests[0].Header.Get("Idempotency-Key"), requests[1].Header.Get("Idempotency-Key")
				require.Regexp(t, keyPattern("verification_email", user.ID), secondKey)
				require.NotEqual(t, firstKey, secondKey, "a new key")

				link := testAppURL + "/v1/auth/verify-email?token="
				firstToken := linkToken(t, string(requests[0].Body), link)
				deliveries := bundle.fake.Deliveries()
				require.Len(t, deliveries, 1)
				secondToken := linkToken(t, deliveries[0].Text, link)
				require.NotEqual(t, firstToken, secondToken, "a new token")

				now := time.Now().Add(time.Duration(clock.Load()))
				_, err := store.EmailTokenConsume(t.Context(), tokens.Hash(firstToken), db.TokenPurposeVerify, now)
				require.ErrorIs(t, err, db.ErrNotFound, "the old token is gone")
				userID, err := store.EmailTokenConsume(t.Context(), tokens.Hash(secondToken), db.TokenPurposeVerify, now)
				require.NoError(t, err)
				require.Equal(t, user.ID, userID)

				message, err := store.EmailMessageGetByJob(t.Context(), job.ID)
				require.NoError(t, err)
				require.Equal(t, secondKey, message.IdempotencyKey)
			})
		}

		// A job whose mail the provider accepted in an earlier attempt (its process died before
		// River recorded the completion, and it was rescued) completes without sending.
		t.Run("AcceptedEarlierCompletesWithoutSending", func(t *testing.T) {
			t.Parallel()

			bundle := setupWorker(t, newStore(t), nil)
			user := createUser(t, bundle.store)
			job := bundle.insert(t, WelcomeEmailArgs{UserID: user.ID}, nil)
			_, err := bundle.store.EmailMessageInsert(t.Context(), &db.EmailMessageInsertParams{
				JobID: job.ID, Kind: job.Kind, UserID: user.ID,
				IdempotencyKey: tokens.IdempotencyKey(job.Kind, user.ID), Now: time.Now(),
			})
			require.NoError(t, err)
			require.NoError(t, bundle.store.EmailMessageMarkAccepted(t.Context(), job.ID, "re_earlier", time.Now()))

			bundle.start(t)
			bundle.wait(t, job.ID, river.EventKindJobCompleted)
			require.Zero(t, len(bundle.fake.Requests()), "no send")
			require.Contains(t, bundle.logs.String(), "not sending again")
		})
	})
}
