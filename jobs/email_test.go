package jobs

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/email"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/jobs/mail/resendfake"
	"github.com/postguard/postguard/tokens"
)

// requireAt checks a time River recorded against the stubbed clock: exactly, to River's
// precision (its SQLite driver keeps milliseconds).
func requireAt(t *testing.T, want, got time.Time) {
	t.Helper()

	require.WithinDuration(t, want, got, time.Millisecond, "want %s, got %s", want, got)
}

func TestEmailWorkers_ProviderAnswers(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		t.Run("Accepted", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, nil)
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)
			require.Equal(t, 1, res.Job.Attempt)

			deliveries := bundle.fake.Deliveries()
			require.Len(t, deliveries, 1)
			require.Equal(t, []string{user.Email}, deliveries[0].To)
			require.Regexp(t, keyPattern("verification_email", user.ID), deliveries[0].IdempotencyKey)
			require.Equal(t, float64(1), bundle.deliveries(t, "verification_email", OutcomeSent))

			// The job's message row keeps the key, the provider's id and the acceptance.
			message, err := bundle.store.EmailMessageGetByJob(t.Context(), res.Job.ID)
			require.NoError(t, err)
			require.Equal(t, deliveries[0].IdempotencyKey, message.IdempotencyKey)
			require.Equal(t, email.StatusSent, message.Status)
			require.Equal(t, deliveries[0].ID, *message.ProviderID)
			require.True(t, bundle.clock.Now().Equal(*message.AcceptedAt))
		})

		t.Run("ServerErrorRetriesAfterOneMinute", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, nil)
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusInternalServerError, Name: "internal_server_error"})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.ErrorContains(t, err, "500")

			require.Equal(t, rivertype.JobStateRetryable, res.Job.State)
			require.Equal(t, 1, res.Job.Attempt)
			require.Len(t, res.Job.Errors, 1)
			require.Contains(t, res.Job.Errors[0].Error, "500")
			// RetryPolicy: 1 minute after the first failure (jitter stubbed to none).
			requireAt(t, bundle.clock.Now().Add(time.Minute), res.Job.ScheduledAt)
			require.Empty(t, bundle.fake.Deliveries())
			require.Equal(t, float64(1), bundle.deliveries(t, "verification_email", OutcomeRetried))
		})

		t.Run("LastAttemptFailureDiscards", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, nil)
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusBadGateway})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, PasswordResetEmailArgs{UserID: user.ID}, &river.InsertOpts{MaxAttempts: 1})
			require.Error(t, err)

			require.Equal(t, rivertype.JobStateDiscarded, res.Job.State)
			require.Equal(t, float64(1), bundle.deliveries(t, "password_reset_email", OutcomeDiscarded))
			require.Zero(t, bundle.deliveries(t, "password_reset_email", OutcomeRetried))
		})

		t.Run("ValidationErrorCancels", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, nil)
			bundle.fake.Enqueue(resendfake.Response{
				Status:  http.StatusUnprocessableEntity,
				Name:    resendfake.NameValidationError,
				Message: "Invalid `to` field: quoting the recipient",
			})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)

			require.Equal(t, river.EventKindJobCancelled, res.EventKind)
			require.Equal(t, rivertype.JobStateCancelled, res.Job.State)
			require.Equal(t, 1, res.Job.Attempt)
			require.Len(t, res.Job.Errors, 1)
			require.Contains(t, res.Job.Errors[0].Error, "422 validation_error")
			// The provider's free-form message is not kept on the job.
			require.NotContains(t, res.Job.Errors[0].Error, "quoting the recipient")
			require.Len(t, bundle.fake.Requests(), 1)
			require.Equal(t, float64(1), bundle.deliveries(t, "verification_email", OutcomeCancelled))
		})

		t.Run("RateLimitedSnoozesWithoutSpendingAttempt", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, nil)
			bundle.fake.Enqueue(resendfake.Response{
				Status:     http.StatusTooManyRequests,
				Name:       resendfake.NameRateLimitExceeded,
				RetryAfter: 3 * time.Second,
			})
			user := createUser(t, bundle.store)
			snoozed, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)

			require.Equal(t, river.EventKindJobSnoozed, snoozed.EventKind)
			require.Equal(t, 0, snoozed.Job.Attempt) // attempt given back
			require.Empty(t, snoozed.Job.Errors)
			require.Equal(t, int64(1), parseJobMetadata(snoozed.Job.Metadata).Snoozes)
			requireAt(t, bundle.clock.Now().Add(3*time.Second), snoozed.Job.ScheduledAt)

			completed, err := bundle.workAgain(t, snoozed.Job)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, completed.EventKind)
			require.Equal(t, 1, completed.Job.Attempt)
			require.Empty(t, completed.Job.Errors)
			require.Len(t, bundle.fake.Requests(), 2)
			require.Len(t, bundle.fake.Deliveries(), 1)
			require.Equal(t, float64(1), bundle.deliveries(t, "verification_email", OutcomeSnoozed))
			require.Equal(t, float64(1), bundle.deliveries(t, "verification_email", OutcomeSent))
		})

		t.Run("ConcurrentIdempotentRequestSnoozesBriefly", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, nil)
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusConflict, Name: resendfake.NameConcurrentIdempotentRequests})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, WelcomeEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)

			require.Equal(t, river.EventKindJobSnoozed, res.EventKind)
			require.Equal(t, 0, res.Job.Attempt)
			require.Empty(t, res.Job.Errors)
			requireAt(t, bundle.clock.Now().Add(mail.ConcurrentIdempotencySnooze), res.Job.ScheduledAt)
		})

		t.Run("InvalidIdempotentRequestCancels", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, nil)
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusConflict, Name: resendfake.NameInvalidIdempotentRequest})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)

			require.Equal(t, rivertype.JobStateCancelled, res.Job.State)
			require.Equal(t, 1, res.Job.Attempt)
			require.Contains(t, res.Job.Errors[0].Error, "invalid_idempotent_request")
		})

		t.Run("NetworkErrorRetries", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, nil)
			bundle.fake.Enqueue(resendfake.Response{Drop: true})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.Error(t, err)

			require.Equal(t, rivertype.JobStateRetryable, res.Job.State)
			require.Equal(t, 1, res.Job.Attempt)
			require.Len(t, res.Job.Errors, 1)
			requireAt(t, bundle.clock.Now().Add(time.Minute), res.Job.ScheduledAt)
		})

		t.Run("SnoozeCapFails", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, nil)
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusTooManyRequests, Name: resendfake.NameRateLimitExceeded, RetryAfter: time.Second})
			user := createUser(t, bundle.store)
			// As if River had snoozed it MaxSnoozes times already.
			res, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, &river.InsertOpts{
				Metadata: []byte(`{"snoozes": ` + strconv.Itoa(MaxSnoozes) + `}`),
			})
			require.ErrorContains(t, err, "snoozed 10 times already")

			require.Equal(t, rivertype.JobStateRetryable, res.Job.State)
			require.Equal(t, 1, res.Job.Attempt)
			require.Zero(t, bundle.deliveries(t, "verification_email", OutcomeSnoozed))
		})

		t.Run("PacerSnoozesDoNotCountAgainstCap", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, nil)
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusTooManyRequests, Name: resendfake.NameRateLimitExceeded, RetryAfter: time.Second})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, &river.InsertOpts{
				Metadata: []byte(`{"snoozes": ` + strconv.Itoa(MaxSnoozes) + `, "pacer_snoozes": 1}`),
			})
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobSnoozed, res.EventKind)
		})

		t.Run("SnoozePastKeyLifetimeFails", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, nil)
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusTooManyRequests, Name: resendfake.NameRateLimitExceeded, RetryAfter: 5 * time.Second})
			user := createUser(t, bundle.store)
			// A day has passed since the job was created (say, the provider answered 429s for a
			// day): a snooze would carry it past its idempotency key's life.
			res, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, &river.InsertOpts{
				ScheduledAt: bundle.clock.Now(),
				Metadata:    []byte(`{}`),
			})
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobSnoozed, res.EventKind, "a first snooze, well within the key's life")

			bundle.clock.advance(IdempotencyKeyLifetime - time.Second)
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusTooManyRequests, Name: resendfake.NameRateLimitExceeded, RetryAfter: 5 * time.Second})
			res, err = bundle.workAgain(t, res.Job)
			require.ErrorContains(t, err, "outlive the idempotency key")
			require.Equal(t, rivertype.JobStateRetryable, res.Job.State)
		})

		t.Run("DeletedUserCompletesWithoutSend", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, nil)
			res, err := bundle.work(t, PasswordResetEmailArgs{UserID: 987654321}, nil)
			require.NoError(t, err)

			require.Equal(t, rivertype.JobStateCompleted, res.Job.State)
			require.Empty(t, bundle.fake.Requests())
			require.Contains(t, bundle.logs.String(), "the user was deleted")
			require.Equal(t, float64(1), bundle.deliveries(t, "password_reset_email", OutcomeSkipped))
		})
	})
}

func TestEmailJobs_Uniqueness(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		insert := func(t *testing.T, store riverstore.Store, args river.JobArgs) *rivertype.JobInsertResult {
			t.Helper()
			res, err := store.JobInsert(t.Context(), args, nil)
			require.NoError(t, err)
			return res
		}

		t.Run("WelcomeOncePerUserEvenAfterItFinished", func(t *testing.T) {
			t.Parallel()

			store := newStore(t)
			first := insert(t, store, WelcomeEmailArgs{UserID: 1})
			require.True(t, insert(t, store, WelcomeEmailArgs{UserID: 1}).UniqueSkippedAsDuplicate)

			_, err := store.Jobs().JobCancel(t.Context(), first.Job.ID)
			require.NoError(t, err)
			again := insert(t, store, WelcomeEmailArgs{UserID: 1})
			require.True(t, again.UniqueSkippedAsDuplicate, "unique in every state, a finished one's too")
			require.Equal(t, first.Job.ID, again.Job.ID)

			// Another user gets their own.
			require.False(t, insert(t, store, WelcomeEmailArgs{UserID: 2}).UniqueSkippedAsDuplicate)
		})

		for name, args := range map[string]func(userID int64) river.JobArgs{
			"Verification":  func(userID int64) river.JobArgs { return VerificationEmailArgs{UserID: userID} },
			"PasswordReset": func(userID int64) river.JobArgs { return PasswordResetEmailArgs{UserID: userID} },
		} {
			t.Run(name+"AgainOnceFinished", func(t *testing.T) {
				t.Parallel()

				store := newStore(t)
				first := insert(t, store, args(1))
				// While the first is in flight, a second is absorbed.
				require.True(t, insert(t, store, args(1)).UniqueSkippedAsDuplicate)

				_, err := store.Jobs().JobCancel(t.Context(), first.Job.ID)
				require.NoError(t, err)
				second := insert(t, store, args(1))
				require.False(t, second.UniqueSkippedAsDuplicate)
				require.NotEqual(t, first.Job.ID, second.Job.ID)
			})
		}
	})
}

func TestWelcomeEmailWorker(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		t.Run("CarriesOneClickUnsubscribe", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, nil)
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, WelcomeEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)

			deliveries := bundle.fake.Deliveries()
			require.Len(t, deliveries, 1)
			delivery := deliveries[0]
			unsubscribeURL := testAppURL + "/v1/unsubscribe?token=" + tokens.Unsubscribe(testSecret, user.ID)
			require.Equal(t, "<"+unsubscribeURL+">", delivery.Headers["List-Unsubscribe"])
			require.Equal(t, "List-Unsubscribe=One-Click", delivery.Headers["List-Unsubscribe-Post"])
			require.Regexp(t, keyPattern("welcome_email", user.ID), delivery.IdempotencyKey)
			require.Contains(t, delivery.Text, unsubscribeURL)

			_, tok, _ := strings.Cut(unsubscribeURL, "token=")
			userID, ok := tokens.ParseUnsubscribe(testSecret, tok)
			require.True(t, ok)
			require.Equal(t, user.ID, userID)

			// Neither the unsubscribe token nor the address shows in logs or on the job.
			for _, secret := range []string{tok, user.Email} {
				require.NotContains(t, bundle.logs.String(), secret)
				require.NotContains(t, string(res.Job.EncodedArgs), secret)
				require.NotContains(t, string(res.Job.Metadata), secret)
			}
		})

		t.Run("ButtonGoesToLogin", func(t *testing.T) {
			t.Parallel()

			// APP_LOGIN_URL: the welcome's button goes to the app's sign-in, not APP_URL (the
			// service's own origin, which has no page at /).
			bundle := setup(t, newStore, &setupOpts{configure: func(config *Config) { config.LoginURL = "https://acme.example/login" }})
			user := createUser(t, bundle.store)
			_, err := bundle.work(t, WelcomeEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)
			delivery := bundle.fake.Deliveries()[0]
			require.Contains(t, delivery.Text, "Get started: https://acme.example/login\n")
			require.Contains(t, delivery.HTML, `<a href="https://acme.example/login" style="display:inline-block;`)

			// Without it, APP_URL as before.
			bundle = setup(t, newStore, nil)
			user = createUser(t, bundle.store)
			_, err = bundle.work(t, WelcomeEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)
			require.Contains(t, bundle.fake.Deliveries()[0].Text, "Get started: "+testAppURL+"\n")
		})

		t.Run("UnsubscribedUserIsNotSent", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, nil)
			user := createUser(t, bundle.store)
			_, err := bundle.store.UserUnsubscribe(t.Context(), user.ID, time.Now())
			require.NoError(t, err)
			res, err := bundle.work(t, WelcomeEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)

			require.Equal(t, rivertype.JobStateCompleted, res.Job.State)
			require.Empty(t, bundle.fake.Requests())
			require.Equal(t, float64(1), bundle.deliveries(t, "welcome_email", OutcomeSkipped))
		})
	})
}

func TestEmailWorkers_Tokens(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		for _, tt := range []struct {
			name    string
			args    func(userID int64) river.JobArgs
			purpose db.TokenPurpose
			path    string
			ttl     time.Duration
		}{
			{"Verification", func(id int64) river.JobArgs { return VerificationEmailArgs{UserID: id} }, db.TokenPurposeVerify, "/v1/auth/verify-email?token=", VerifyTokenTTL},
			{"PasswordReset", func(id int64) river.JobArgs { return PasswordResetEmailArgs{UserID: id} }, db.TokenPurposeReset, "/v1/auth/reset-password?token=", ResetTokenTTL},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()

				bundle := setup(t, newStore, nil)
				user := createUser(t, bundle.store)
				res, err := bundle.work(t, tt.args(user.ID), nil)
				require.NoError(t, err)
				require.Equal(t, river.EventKindJobCompleted, res.EventKind)

				deliveries := bundle.fake.Deliveries()
				require.Len(t, deliveries, 1)
				raw := linkToken(t, deliveries[0].Text, testAppURL+tt.path)
				require.True(t, tokens.Plausible(raw), "a random 256-bit token: %q", raw)
				require.Contains(t, deliveries[0].HTML, raw)

				// The database keeps the token's hash, never the token; its sealed copy is erased
				// once the provider accepted the mail.
				stored, err := bundle.store.EmailTokenGetByJob(t.Context(), res.Job.ID)
				require.NoError(t, err)
				require.Equal(t, tokens.Hash(raw), stored.TokenHash)
				require.Nil(t, stored.Sealed, "sealed copy erased after delivery")
				require.Equal(t, tt.purpose, stored.Purpose)
				require.True(t, bundle.clock.Now().Add(tt.ttl).Equal(stored.ExpiresAt))

				// The token is not in the job's args, metadata or errors, nor in any log line.
				row := res.Job
				require.NotContains(t, string(row.EncodedArgs), raw)
				require.NotContains(t, string(row.Metadata), raw)
				require.NotContains(t, string(row.EncodedArgs), user.Email)
				require.NotContains(t, string(row.Metadata), user.Email)
				require.Contains(t, string(row.Metadata), "river:log") // riverlog did record lines
				logs := bundle.logs.String()
				require.Contains(t, logs, "job_id="+strconv.FormatInt(row.ID, 10))
				require.NotContains(t, logs, raw)
				require.NotContains(t, logs, user.Email)

				// The mailed link carries a usable token of the right purpose, and only it.
				other := db.TokenPurposeReset
				if tt.purpose == db.TokenPurposeReset {
					other = db.TokenPurposeVerify
				}
				now := bundle.clock.Now()
				_, err = bundle.store.EmailTokenConsume(t.Context(), tokens.Hash(raw), other, now)
				require.ErrorIs(t, err, db.ErrNotFound)
				_, err = bundle.store.EmailTokenConsume(t.Context(), tokens.Hash(raw), tt.purpose, now.Add(tt.ttl))
				require.ErrorIs(t, err, db.ErrNotFound, "expired at its TTL")
				userID, err := bundle.store.EmailTokenConsume(t.Context(), tokens.Hash(raw), tt.purpose, now)
				require.NoError(t, err)
				require.Equal(t, user.ID, userID)
			})
		}
	})
}

func TestEmailWorkers_Delivery(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		// A 5xx after the provider delivered (the answer was lost): the retry sends the same
		// bytes under the same key, and the provider delivers once.
		t.Run("RetrySendsSameBytesUnderSameKey", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, nil)
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusInternalServerError, Deliver: true})
			user := createUser(t, bundle.store)
			failed, err := bundle.work(t, PasswordResetEmailArgs{UserID: user.ID}, nil)
			require.Error(t, err)
			require.Equal(t, rivertype.JobStateRetryable, failed.Job.State)

			bundle.clock.advance(time.Minute)
			completed, err := bundle.workAgain(t, failed.Job)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, completed.EventKind)
			require.Equal(t, 2, completed.Job.Attempt)

			key, _ := bundle.requireRetrySentSameMail(t)
			require.Regexp(t, keyPattern("password_reset_email", user.ID), key)

			stored, err := bundle.store.EmailTokenGetByJob(t.Context(), completed.Job.ID)
			require.NoError(t, err)
			require.Nil(t, stored.Sealed, "sealed copy erased once accepted")
		})

		// A job past its key's life, or whose sealed copy is gone, does not send another token
		// under the old key: it starts over with a new key and a new token.
		for _, tt := range []struct {
			name string
			// between happens after the first (failed) attempt, before the next.
			between func(t *testing.T, bundle *testBundle)
		}{
			{"PastKeyLifetime", func(_ *testing.T, bundle *testBundle) {
				bundle.clock.advance(IdempotencyKeyLifetime + time.Minute)
			}},
			{"SealedCopyGone", func(t *testing.T, bundle *testBundle) {
				erased, err := bundle.store.EmailTokenEraseSealedBefore(t.Context(), bundle.clock.Now().Add(time.Hour), 10)
				require.NoError(t, err)
				require.Equal(t, int64(1), erased)
			}},
		} {
			t.Run("StartsOver"+tt.name, func(t *testing.T) {
				t.Parallel()

				bundle := setup(t, newStore, nil)
				bundle.fake.Enqueue(resendfake.Response{Status: http.StatusInternalServerError})
				user := createUser(t, bundle.store)
				failed, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
				require.Error(t, err)
				tt.between(t, bundle)
				completed, err := bundle.workAgain(t, failed.Job)
				require.NoError(t, err)
				require.Equal(t, river.EventKindJobCompleted, completed.EventKind)

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

				now := bundle.clock.Now()
				_, err = bundle.store.EmailTokenConsume(t.Context(), tokens.Hash(firstToken), db.TokenPurposeVerify, now)
				require.ErrorIs(t, err, db.ErrNotFound, "the old token is gone")
				userID, err := bundle.store.EmailTokenConsume(t.Context(), tokens.Hash(secondToken), db.TokenPurposeVerify, now)
				require.NoError(t, err)
				require.Equal(t, user.ID, userID)

				message, err := bundle.store.EmailMessageGetByJob(t.Context(), completed.Job.ID)
				require.NoError(t, err)
				require.Equal(t, secondKey, message.IdempotencyKey)
			})
		}

		// A job that started over past its first key's life is paced like any other: its new
		// key's life, not the job's age, bounds how long it may wait for its slot.
		t.Run("StartsOverPastKeyLifetimePaced", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, &setupOpts{configure: func(config *Config) { config.MaxRPS = 1 }})
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusInternalServerError})
			user := createUser(t, bundle.store)
			failed, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.Error(t, err)

			bundle.clock.advance(IdempotencyKeyLifetime + time.Minute)
			completed, err := bundle.workAgain(t, failed.Job)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, completed.EventKind)
			require.Len(t, bundle.fake.Deliveries(), 1)
		})

		// The same guarantee for mail in the user's locale, from a templates directory: the
		// retry renders the same French bytes under the same key.
		t.Run("RetryInUsersLocaleSendsSameBytes", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, &setupOpts{renderer: newRenderer(t, frenchTemplates)})
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusInternalServerError, Deliver: true})
			user := createUserIn(t, bundle.store, "fr-CA")
			failed, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.Error(t, err)

			bundle.clock.advance(time.Minute)
			completed, err := bundle.workAgain(t, failed.Job)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, completed.EventKind)

			_, delivery := bundle.requireRetrySentSameMail(t)
			require.Equal(t, "Confirmez votre adresse", delivery.Subject)
			require.Contains(t, delivery.Text, "(valable 24 heures)")
		})

		// The locale is the job's from its first attempt: templates that would match the user
		// better, deployed between two attempts, do not change what the retry sends.
		t.Run("LocaleFixedAtFirstAttempt", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, &setupOpts{renderer: newRenderer(t, frenchTemplates)})
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusInternalServerError, Deliver: true})
			user := createUserIn(t, bundle.store, "fr-CA")
			failed, err := bundle.work(t, WelcomeEmailArgs{UserID: user.ID}, nil)
			require.Error(t, err)
			message, err := bundle.store.EmailMessageGetByJob(t.Context(), failed.Job.ID)
			require.NoError(t, err)
			require.Equal(t, "fr", message.Locale)

			canadian := maps.Clone(frenchTemplates)
			canadian["welcome.fr-CA.txt"] = strings.ReplaceAll(frenchTemplates["welcome.fr.txt"], "Bienvenue", "Bienvenue au Canada")
			canadian["welcome.fr-CA.html"] = frenchTemplates["welcome.fr.html"]
			renderer := newRenderer(t, canadian)
			require.Equal(t, "fr-CA", renderer.Match(user.Locale))
			bundle.deploy(t, renderer)

			bundle.clock.advance(time.Minute)
			completed, err := bundle.workAgain(t, failed.Job)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, completed.EventKind)

			_, delivery := bundle.requireRetrySentSameMail(t)
			require.Equal(t, "Bienvenue sur postguard", delivery.Subject)
		})

		// A deploy that changes the templates between two attempts: the retry renders other
		// bytes, which the provider would refuse under the first key (409
		// invalid_idempotent_request, and the job cancelled). It sends them under a new key, with
		// the same token, and records the new digest.
		t.Run("TemplatesChangedSendUnderNewKey", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, &setupOpts{renderer: newRenderer(t, frenchTemplates)})
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusInternalServerError, Deliver: true})
			user := createUserIn(t, bundle.store, "fr")
			failed, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.Error(t, err)
			first, err := bundle.store.EmailMessageGetByJob(t.Context(), failed.Job.ID)
			require.NoError(t, err)

			changed := maps.Clone(frenchTemplates)
			changed["verification.fr.txt"] = strings.ReplaceAll(frenchTemplates["verification.fr.txt"], "Confirmez votre adresse", "Merci de confirmer votre adresse")
			bundle.deploy(t, newRenderer(t, changed))

			bundle.clock.advance(time.Minute)
			completed, err := bundle.workAgain(t, failed.Job)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, completed.EventKind)

			requests := bundle.fake.Requests()
			require.Len(t, requests, 2)
			firstKey, secondKey := requests[0].Header.Get("Idempotency-Key"), requests[1].Header.Get("Idempotency-Key")
			require.NotEqual(t, firstKey, secondKey, "a new key for other bytes")
			require.Regexp(t, keyPattern("verification_email", user.ID), secondKey)
			link := testAppURL + "/v1/auth/verify-email?token="
			require.Equal(t, linkToken(t, string(requests[0].Body), link), linkToken(t, string(requests[1].Body), link), "the same token")

			// The first attempt had reached the provider: that mail and this one, both with a
			// working link.
			deliveries := bundle.fake.Deliveries()
			require.Len(t, deliveries, 2)
			require.Equal(t, "Merci de confirmer votre adresse", deliveries[1].Subject)

			second, err := bundle.store.EmailMessageGetByJob(t.Context(), failed.Job.ID)
			require.NoError(t, err)
			require.Equal(t, secondKey, second.IdempotencyKey)
			require.Equal(t, "fr", second.Locale)
			require.NotEqual(t, first.PayloadSHA256, second.PayloadSHA256)
			require.Len(t, second.PayloadSHA256, 32)
			require.Contains(t, bundle.logs.String(), "renders other bytes than at its first attempt")
		})

		// A job whose mail the provider accepted in an earlier attempt (its process died before
		// River recorded the completion, and it was rescued) completes without sending.
		t.Run("AcceptedEarlierCompletesWithoutSending", func(t *testing.T) {
			t.Parallel()

			// The first attempt's send reaches the provider, and the attempt dies before River
			// hears of it (here: the sender fails after the provider accepted).
			bundle := setup(t, newStore, &setupOpts{sender: func(inner mail.Sender) mail.Sender {
				return senderFunc(func(ctx context.Context, msg *mail.Message) (string, error) {
					if _, err := inner.Send(ctx, msg); err != nil {
						return "", err
					}
					return "", errors.New("the process died")
				})
			}})
			user := createUser(t, bundle.store)
			died, err := bundle.work(t, WelcomeEmailArgs{UserID: user.ID}, nil)
			require.Error(t, err)
			require.Len(t, bundle.fake.Deliveries(), 1)
			// What the dead attempt had recorded: the acceptance.
			require.NoError(t, bundle.store.EmailMessageMarkAccepted(t.Context(), &db.EmailMessageMarkAcceptedParams{JobID: died.Job.ID, Provider: "resend", ProviderID: bundle.fake.Deliveries()[0].ID, Now: bundle.clock.Now()}))

			// Rescued: the same job, attempted again.
			rescued, err := bundle.workAgain(t, died.Job)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, rescued.EventKind)
			require.Len(t, bundle.fake.Requests(), 1, "no second send")
			require.Contains(t, bundle.logs.String(), "not sending again")
			require.Equal(t, float64(1), bundle.deliveries(t, "welcome_email", OutcomeSkipped))
		})
	})
}

func TestEmailWorkers_Locale(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		for _, tt := range []struct {
			name, userLocale, wantLocale, wantSubject string
		}{
			{"French", "fr", "fr", "Bienvenue sur postguard"},
			{"FrenchRegion", "fr-CA", "fr", "Bienvenue sur postguard"},
			{"NoTemplates", "de-DE", "en", "Welcome to postguard"},
			{"Unknown", "", "en", "Welcome to postguard"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()

				bundle := setup(t, newStore, &setupOpts{renderer: newRenderer(t, frenchTemplates)})
				user := createUserIn(t, bundle.store, tt.userLocale)
				res, err := bundle.work(t, WelcomeEmailArgs{UserID: user.ID}, nil)
				require.NoError(t, err)
				require.Equal(t, river.EventKindJobCompleted, res.EventKind)

				deliveries := bundle.fake.Deliveries()
				require.Len(t, deliveries, 1)
				require.Equal(t, tt.wantSubject, deliveries[0].Subject)
				require.Contains(t, deliveries[0].HTML, `<html lang="`+tt.wantLocale+`">`)

				// The message row keeps the locale and the digest of what was sent, not the bytes.
				message, err := bundle.store.EmailMessageGetByJob(t.Context(), res.Job.ID)
				require.NoError(t, err)
				require.Equal(t, tt.wantLocale, message.Locale)
				require.Len(t, message.PayloadSHA256, 32)
			})
		}
	})
}

func TestPayloadDigest(t *testing.T) {
	t.Parallel()

	base := &mail.Message{To: "a@example.com", Subject: "s", HTML: "<p>h</p>", Text: "t", Headers: map[string]string{"A": "1", "B": "2"}}
	digest := payloadDigest(base)
	require.Len(t, digest, 32)

	same := *base
	same.Headers = map[string]string{"B": "2", "A": "1"}
	same.IdempotencyKey, same.Kind = "other key", "other kind" // not sent as payload
	require.Equal(t, digest, payloadDigest(&same))

	for name, change := range map[string]func(m *mail.Message){
		"To":       func(m *mail.Message) { m.To = "b@example.com" },
		"Subject":  func(m *mail.Message) { m.Subject = "S" },
		"HTML":     func(m *mail.Message) { m.HTML = "<p>H</p>" },
		"Text":     func(m *mail.Message) { m.Text = "T" },
		"Header":   func(m *mail.Message) { m.Headers = map[string]string{"A": "1", "B": "3"} },
		"Boundary": func(m *mail.Message) { m.Subject, m.HTML = "s<p>", "h</p>" },
	} {
		other := *base
		change(&other)
		require.NotEqual(t, digest, payloadDigest(&other), name)
	}
}
