package jobs

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
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

func TestEmailWorkers_ProviderAnswers(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore func(t *testing.T) db.Store) {
		t.Run("Accepted", func(t *testing.T) {
			t.Parallel()

			bundle := setupWorker(t, newStore(t), nil)
			user := createUser(t, bundle.store)
			job := bundle.insert(t, VerificationEmailArgs{UserID: user.ID}, nil)
			bundle.start(t)

			event := bundle.wait(t, job.ID, river.EventKindJobCompleted)
			require.Equal(t, 1, event.Job.Attempt)

			deliveries := bundle.fake.Deliveries()
			require.Len(t, deliveries, 1)
			require.Equal(t, []string{user.Email}, deliveries[0].To)
			require.Regexp(t, keyPattern("verification_email", user.ID), deliveries[0].IdempotencyKey)
			require.Equal(t, float64(1), bundle.deliveries(t, "verification_email", OutcomeSent))

			// The job's message row keeps the key, the provider's id and the acceptance.
			message, err := bundle.store.EmailMessageGetByJob(t.Context(), job.ID)
			require.NoError(t, err)
			require.Equal(t, deliveries[0].IdempotencyKey, message.IdempotencyKey)
			require.Equal(t, db.EmailStatusSent, message.Status)
			require.Equal(t, deliveries[0].ID, *message.ProviderID)
			require.NotNil(t, message.AcceptedAt)
		})

		t.Run("ServerErrorRetriesAfterOneMinute", func(t *testing.T) {
			t.Parallel()

			clock := newTestClock()
			bundle := setupWorker(t, newStore(t), &workerOpts{clock: clock})
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusInternalServerError, Name: "internal_server_error"})
			user := createUser(t, bundle.store)
			job := bundle.insert(t, VerificationEmailArgs{UserID: user.ID}, nil)

			bundle.start(t)
			event := bundle.wait(t, job.ID, river.EventKindJobFailed)

			require.Equal(t, rivertype.JobStateRetryable, event.Job.State)
			require.Equal(t, 1, event.Job.Attempt)
			require.Len(t, event.Job.Errors, 1)
			require.Contains(t, event.Job.Errors[0].Error, "500")
			// 1 minute after the first failure (jitter is RetryPolicy's own test).
			require.Equal(t, clock.Now().Add(time.Minute), event.Job.ScheduledAt.UTC())
			require.Empty(t, bundle.fake.Deliveries())
			require.Equal(t, float64(1), bundle.deliveries(t, "verification_email", OutcomeRetried))
		})

		t.Run("LastAttemptFailureDiscards", func(t *testing.T) {
			t.Parallel()

			bundle := setupWorker(t, newStore(t), nil)
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusBadGateway})
			user := createUser(t, bundle.store)
			job := bundle.insert(t, PasswordResetEmailArgs{UserID: user.ID}, &river.InsertOpts{MaxAttempts: 1})
			bundle.start(t)

			event := bundle.wait(t, job.ID, river.EventKindJobFailed)
			require.Equal(t, rivertype.JobStateDiscarded, event.Job.State)
			require.Equal(t, float64(1), bundle.deliveries(t, "password_reset_email", OutcomeDiscarded))
			require.Zero(t, bundle.deliveries(t, "password_reset_email", OutcomeRetried))
		})

		t.Run("ValidationErrorCancels", func(t *testing.T) {
			t.Parallel()

			bundle := setupWorker(t, newStore(t), nil)
			bundle.fake.Enqueue(resendfake.Response{
				Status:  http.StatusUnprocessableEntity,
				Name:    resendfake.NameValidationError,
				Message: "Invalid `to` field: quoting the recipient",
			})
			user := createUser(t, bundle.store)
			job := bundle.insert(t, VerificationEmailArgs{UserID: user.ID}, nil)
			bundle.start(t)

			event := bundle.wait(t, job.ID, river.EventKindJobCancelled)
			require.Equal(t, rivertype.JobStateCancelled, event.Job.State)
			require.Equal(t, 1, event.Job.Attempt)
			require.Len(t, event.Job.Errors, 1)
			require.Contains(t, event.Job.Errors[0].Error, "422 validation_error")
			// The provider's free-form message is not kept on the job.
			require.NotContains(t, event.Job.Errors[0].Error, "quoting the recipient")
			require.Len(t, bundle.fake.Requests(), 1)
			require.Equal(t, float64(1), bundle.deliveries(t, "verification_email", OutcomeCancelled))
		})

		t.Run("RateLimitedSnoozesWithoutSpendingAttempt", func(t *testing.T) {
			t.Parallel()

			clock := newTestClock()
			bundle := setupWorker(t, newStore(t), &workerOpts{clock: clock})
			bundle.fake.Enqueue(resendfake.Response{
				Status:     http.StatusTooManyRequests,
				Name:       resendfake.NameRateLimitExceeded,
				RetryAfter: time.Second,
			})
			user := createUser(t, bundle.store)
			job := bundle.insert(t, VerificationEmailArgs{UserID: user.ID}, nil)
			bundle.start(t)

			snoozed := bundle.wait(t, job.ID, river.EventKindJobSnoozed)
			require.Equal(t, 0, snoozed.Job.Attempt) // attempt given back
			require.Empty(t, snoozed.Job.Errors)
			require.Equal(t, int64(1), parseJobMetadata(snoozed.Job.Metadata).Snoozes)
			require.Equal(t, clock.Now().Add(time.Second), snoozed.Job.ScheduledAt.UTC()) // the Retry-After
			require.Len(t, bundle.fake.Requests(), 1)

			// Not before its time: the clock stands still until the test moves it.
			clock.Advance(time.Second)
			completed := bundle.wait(t, job.ID, river.EventKindJobCompleted)
			require.Equal(t, 1, completed.Job.Attempt)
			require.Empty(t, completed.Job.Errors)
			require.Len(t, bundle.fake.Requests(), 2)
			require.Len(t, bundle.fake.Deliveries(), 1)
			require.Equal(t, float64(1), bundle.deliveries(t, "verification_email", OutcomeSnoozed))
			require.Equal(t, float64(1), bundle.deliveries(t, "verification_email", OutcomeSent))
		})

		t.Run("ConcurrentIdempotentRequestSnoozes", func(t *testing.T) {
			t.Parallel()

			clock := newTestClock()
			bundle := setupWorker(t, newStore(t), &workerOpts{clock: clock})
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusConflict, Name: resendfake.NameConcurrentIdempotentRequests})
			user := createUser(t, bundle.store)
			job := bundle.insert(t, WelcomeEmailArgs{UserID: user.ID}, nil)
			bundle.start(t)

			snoozed := bundle.wait(t, job.ID, river.EventKindJobSnoozed)
			require.Equal(t, 0, snoozed.Job.Attempt)
			require.Empty(t, snoozed.Job.Errors)
			// A short snooze, and no more.
			require.Equal(t, clock.Now().Add(mail.ConcurrentIdempotencySnooze), snoozed.Job.ScheduledAt.UTC())
		})

		t.Run("InvalidIdempotentRequestCancels", func(t *testing.T) {
			t.Parallel()

			bundle := setupWorker(t, newStore(t), nil)
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusConflict, Name: resendfake.NameInvalidIdempotentRequest})
			user := createUser(t, bundle.store)
			job := bundle.insert(t, VerificationEmailArgs{UserID: user.ID}, nil)
			bundle.start(t)

			event := bundle.wait(t, job.ID, river.EventKindJobCancelled)
			require.Equal(t, 1, event.Job.Attempt)
			require.Contains(t, event.Job.Errors[0].Error, "invalid_idempotent_request")
		})

		t.Run("NetworkErrorRetries", func(t *testing.T) {
			t.Parallel()

			clock := newTestClock()
			bundle := setupWorker(t, newStore(t), &workerOpts{clock: clock})
			bundle.fake.Enqueue(resendfake.Response{Drop: true})
			user := createUser(t, bundle.store)
			job := bundle.insert(t, VerificationEmailArgs{UserID: user.ID}, nil)
			bundle.start(t)

			event := bundle.wait(t, job.ID, river.EventKindJobFailed)
			require.Equal(t, rivertype.JobStateRetryable, event.Job.State)
			require.Equal(t, 1, event.Job.Attempt)
			require.Len(t, event.Job.Errors, 1)
			require.Equal(t, clock.Now().Add(time.Minute), event.Job.ScheduledAt.UTC())
		})

		t.Run("SnoozeCapFails", func(t *testing.T) {
			t.Parallel()

			bundle := setupWorker(t, newStore(t), nil)
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusTooManyRequests, Name: resendfake.NameRateLimitExceeded, RetryAfter: time.Second})
			user := createUser(t, bundle.store)
			// As if River had snoozed it MaxSnoozes times already.
			job := bundle.insert(t, VerificationEmailArgs{UserID: user.ID}, &river.InsertOpts{
				Metadata: []byte(`{"snoozes": ` + strconv.Itoa(MaxSnoozes) + `}`),
			})
			bundle.start(t)

			event := bundle.wait(t, job.ID, river.EventKindJobFailed)
			require.Equal(t, rivertype.JobStateRetryable, event.Job.State)
			require.Equal(t, 1, event.Job.Attempt)
			require.Contains(t, event.Job.Errors[0].Error, "snoozed 10 times already")
			require.Zero(t, bundle.deliveries(t, "verification_email", OutcomeSnoozed))
		})

		t.Run("PacerSnoozesDoNotCountAgainstCap", func(t *testing.T) {
			t.Parallel()

			bundle := setupWorker(t, newStore(t), nil)
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusTooManyRequests, Name: resendfake.NameRateLimitExceeded, RetryAfter: time.Second})
			user := createUser(t, bundle.store)
			job := bundle.insert(t, VerificationEmailArgs{UserID: user.ID}, &river.InsertOpts{
				Metadata: []byte(`{"snoozes": ` + strconv.Itoa(MaxSnoozes) + `, "pacer_snoozes": 1}`),
			})
			bundle.start(t)

			snoozed := bundle.wait(t, job.ID, river.EventKindJobSnoozed, river.EventKindJobFailed)
			require.Equal(t, river.EventKindJobSnoozed, snoozed.Kind)
		})

		t.Run("SnoozePastKeyLifetimeFails", func(t *testing.T) {
			t.Parallel()

			bundle := setupWorker(t, newStore(t), &workerOpts{configure: func(config *Config) {
				// A day has passed since the job was created (say, the provider answered 429s
				// for a day): a snooze would carry it past its idempotency key's life.
				config.NowFunc = func() time.Time { return time.Now().Add(IdempotencyKeyLifetime - time.Second) }
			}})
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusTooManyRequests, Name: resendfake.NameRateLimitExceeded, RetryAfter: 5 * time.Second})
			user := createUser(t, bundle.store)
			job := bundle.insert(t, VerificationEmailArgs{UserID: user.ID}, nil)
			bundle.start(t)

			event := bundle.wait(t, job.ID, river.EventKindJobFailed)
			require.Equal(t, rivertype.JobStateRetryable, event.Job.State)
			require.Contains(t, event.Job.Errors[0].Error, "outlive the idempotency key")
		})

		t.Run("DeletedUserCompletesWithoutSend", func(t *testing.T) {
			t.Parallel()

			bundle := setupWorker(t, newStore(t), nil)
			job := bundle.insert(t, PasswordResetEmailArgs{UserID: 987654321}, nil)
			bundle.start(t)

			event := bundle.wait(t, job.ID, river.EventKindJobCompleted)
			require.Equal(t, rivertype.JobStateCompleted, event.Job.State)
			require.Empty(t, bundle.fake.Requests())
			require.Contains(t, bundle.logs.String(), "user not found")
			require.Equal(t, float64(1), bundle.deliveries(t, "password_reset_email", OutcomeSkipped))
		})
	})
}

func TestEmailWorkers_Uniqueness(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore func(t *testing.T) db.Store) {
		t.Run("WelcomeOncePerUserEvenAfterCompletion", func(t *testing.T) {
			t.Parallel()

			bundle := setupWorker(t, newStore(t), nil)
			user := createUser(t, bundle.store)

			first := bundle.insert(t, WelcomeEmailArgs{UserID: user.ID}, nil)
			res, err := bundle.store.JobInsert(t.Context(), WelcomeEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)
			require.True(t, res.UniqueSkippedAsDuplicate)
			require.Equal(t, first.ID, res.Job.ID)

			bundle.start(t)
			bundle.wait(t, first.ID, river.EventKindJobCompleted)

			res, err = bundle.store.JobInsert(t.Context(), WelcomeEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)
			require.True(t, res.UniqueSkippedAsDuplicate)
			require.Equal(t, first.ID, res.Job.ID)
			require.Len(t, bundle.fake.Deliveries(), 1)

			// Another user gets their own.
			other := createUser(t, bundle.store)
			bundle.insert(t, WelcomeEmailArgs{UserID: other.ID}, nil)
		})

		for _, args := range []struct {
			name string
			args func(userID int64) river.JobArgs
		}{
			{"Verification", func(userID int64) river.JobArgs { return VerificationEmailArgs{UserID: userID} }},
			{"PasswordReset", func(userID int64) river.JobArgs { return PasswordResetEmailArgs{UserID: userID} }},
		} {
			t.Run(args.name+"AgainAfterCompletion", func(t *testing.T) {
				t.Parallel()

				bundle := setupWorker(t, newStore(t), nil)
				user := createUser(t, bundle.store)

				first := bundle.insert(t, args.args(user.ID), nil)
				// While the first is in flight, a second is absorbed.
				res, err := bundle.store.JobInsert(t.Context(), args.args(user.ID), nil)
				require.NoError(t, err)
				require.True(t, res.UniqueSkippedAsDuplicate)

				bundle.start(t)
				bundle.wait(t, first.ID, river.EventKindJobCompleted)

				second := bundle.insert(t, args.args(user.ID), nil)
				require.NotEqual(t, first.ID, second.ID)
				bundle.wait(t, second.ID, river.EventKindJobCompleted)

				deliveries := bundle.fake.Deliveries()
				require.Len(t, deliveries, 2)
				require.NotEqual(t, deliveries[0].IdempotencyKey, deliveries[1].IdempotencyKey)
				require.NotEqual(t, deliveries[0].Text, deliveries[1].Text) // another token
			})
		}
	})
}

func TestEmailWorkers_InterruptedDelivery(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore func(t *testing.T) db.Store) {
		received := make(chan struct{})
		release := make(chan struct{})
		var first atomicOnce
		bundle := setupWorker(t, newStore(t), &workerOpts{fake: &resendfake.Config{
			BeforeAnswerFunc: func(*resendfake.Request) {
				if first.do() {
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

		client := bundle.store.River()
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

func TestWelcomeEmailWorker(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore func(t *testing.T) db.Store) {
		t.Run("CarriesOneClickUnsubscribe", func(t *testing.T) {
			t.Parallel()

			bundle := setupWorker(t, newStore(t), nil)
			user := createUser(t, bundle.store)
			job := bundle.insert(t, WelcomeEmailArgs{UserID: user.ID}, nil)
			bundle.start(t)
			bundle.wait(t, job.ID, river.EventKindJobCompleted)

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
			row := bundle.job(t, job.ID)
			for _, secret := range []string{tok, user.Email} {
				require.NotContains(t, bundle.logs.String(), secret)
				require.NotContains(t, string(row.EncodedArgs), secret)
				require.NotContains(t, string(row.Metadata), secret)
			}
		})

		t.Run("UnsubscribedUserIsNotSent", func(t *testing.T) {
			t.Parallel()

			bundle := setupWorker(t, newStore(t), nil)
			user := createUser(t, bundle.store)
			require.NoError(t, bundle.store.UserUnsubscribe(t.Context(), user.ID, time.Now()))
			job := bundle.insert(t, WelcomeEmailArgs{UserID: user.ID}, nil)
			bundle.start(t)

			event := bundle.wait(t, job.ID, river.EventKindJobCompleted)
			require.Equal(t, rivertype.JobStateCompleted, event.Job.State)
			require.Empty(t, bundle.fake.Requests())
			require.Equal(t, float64(1), bundle.deliveries(t, "welcome_email", OutcomeSkipped))
		})
	})
}

func TestEmailWorkers_Tokens(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore func(t *testing.T) db.Store) {
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

				bundle := setupWorker(t, newStore(t), nil)
				user := createUser(t, bundle.store)
				job := bundle.insert(t, tt.args(user.ID), nil)
				bundle.start(t)
				bundle.wait(t, job.ID, river.EventKindJobCompleted)

				deliveries := bundle.fake.Deliveries()
				require.Len(t, deliveries, 1)
				raw := linkToken(t, deliveries[0].Text, testAppURL+tt.path)
				require.True(t, tokens.Plausible(raw), "a random 256-bit token: %q", raw)
				require.Contains(t, deliveries[0].HTML, raw)

				// The database keeps the token's hash, never the token; its sealed copy is erased
				// once the provider accepted the mail.
				stored, err := bundle.store.EmailTokenGetByJob(t.Context(), job.ID)
				require.NoError(t, err)
				require.Equal(t, tokens.Hash(raw), stored.TokenHash)
				require.Nil(t, stored.Sealed, "sealed copy erased after delivery")
				require.Equal(t, tt.purpose, stored.Purpose)
				require.NotContains(t, string(stored.TokenHash), raw)

				// The token is not in the job's args, metadata or errors, nor in any log line.
				row := bundle.job(t, job.ID)
				require.NotContains(t, string(row.EncodedArgs), raw)
				require.NotContains(t, string(row.Metadata), raw)
				require.NotContains(t, string(row.EncodedArgs), user.Email)
				require.NotContains(t, string(row.Metadata), user.Email)
				require.Contains(t, string(row.Metadata), "river:log") // riverlog did record lines
				for _, attemptErr := range row.Errors {
					require.NotContains(t, attemptErr.Error, raw)
					require.NotContains(t, attemptErr.Error, user.Email)
				}
				logs := bundle.logs.String()
				require.Contains(t, logs, "job_id="+strconv.FormatInt(job.ID, 10))
				require.NotContains(t, logs, raw)
				require.NotContains(t, logs, user.Email)

				// The mailed link carries a usable token of the right purpose, and only it.
				other := db.TokenPurposeReset
				if tt.purpose == db.TokenPurposeReset {
					other = db.TokenPurposeVerify
				}
				_, err = bundle.store.EmailTokenConsume(t.Context(), tokens.Hash(raw), other, time.Now())
				require.ErrorIs(t, err, db.ErrNotFound)
				// Expired after its TTL.
				_, err = bundle.store.EmailTokenConsume(t.Context(), tokens.Hash(raw), tt.purpose, time.Now().Add(tt.ttl+time.Minute))
				require.ErrorIs(t, err, db.ErrNotFound)
				userID, err := bundle.store.EmailTokenConsume(t.Context(), tokens.Hash(raw), tt.purpose, time.Now())
				require.NoError(t, err)
				require.Equal(t, user.ID, userID)
			})
		}
	})
}
