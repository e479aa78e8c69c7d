package jobs

import (
	"net/http"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/email"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs/mail/resendfake"
)

// suppress puts user's address on the suppression list, as a webhook event would.
func suppress(t *testing.T, store riverstore.Store, user *db.User, reason string) {
	t.Helper()

	require.NoError(t, store.EmailSuppressionInsert(t.Context(), &db.EmailSuppressionInsertParams{
		AddressHash:  email.SuppressionKey(testSecret, user.Email),
		Reason:       reason,
		EmailID:      "re_earlier",
		SuppressedAt: time.Now(),
		Now:          time.Now(),
	}))
}

func TestEmailWorkers_Suppression(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		// Every kind is held back, verification and reset mail included.
		for _, tt := range []struct {
			name string
			args func(userID int64) river.JobArgs
		}{
			{"Welcome", func(id int64) river.JobArgs { return WelcomeEmailArgs{UserID: id} }},
			{"Verification", func(id int64) river.JobArgs { return VerificationEmailArgs{UserID: id} }},
			{"PasswordReset", func(id int64) river.JobArgs { return PasswordResetEmailArgs{UserID: id} }},
		} {
			t.Run(tt.name+"NotSent", func(t *testing.T) {
				t.Parallel()

				bundle := setup(t, newStore, nil)
				user, other := createUser(t, bundle.store), createUser(t, bundle.store)
				suppress(t, bundle.store, user, email.ReasonBounced)

				res, err := bundle.work(t, tt.args(user.ID), nil)
				require.NoError(t, err)
				require.Equal(t, river.EventKindJobCompleted, res.EventKind)
				require.Equal(t, rivertype.JobStateCompleted, res.Job.State)
				require.Zero(t, len(bundle.fake.Requests()), "no provider call")
				kind := res.Job.Kind
				require.Equal(t, float64(1), bundle.deliveries(t, kind, OutcomeSuppressed))
				require.Zero(t, bundle.deliveries(t, kind, OutcomeSent))

				message, err := bundle.store.EmailMessageGetByJob(t.Context(), res.Job.ID)
				require.NoError(t, err)
				require.Equal(t, email.StatusSuppressed, message.Status)
				require.True(t, bundle.clock.Now().Equal(*message.SuppressedAt))
				require.Nil(t, message.ProviderID)
				// No link token was made for a mail that does not go out.
				_, err = bundle.store.EmailTokenGetByJob(t.Context(), res.Job.ID)
				require.ErrorIs(t, err, db.ErrNotFound)
				require.Contains(t, bundle.logs.String(), "the address is on the suppression list (bounced)")
				require.NotContains(t, bundle.logs.String(), user.Email)

				// Another address is sent as ever.
				res, err = bundle.work(t, tt.args(other.ID), nil)
				require.NoError(t, err)
				require.Equal(t, river.EventKindJobCompleted, res.EventKind)
				require.Len(t, bundle.fake.Deliveries(), 1)
				require.Equal(t, []string{other.Email}, bundle.fake.Deliveries()[0].To)
			})
		}

		t.Run("SuppressedBetweenAttempts", func(t *testing.T) {
			t.Parallel()

			// The first attempt fails after the job made its token; the address is suppressed
			// before the next: that one sends nothing, and the sealed copy goes.
			bundle := setup(t, newStore, nil)
			user := createUser(t, bundle.store)
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusInternalServerError})
			failed, err := bundle.work(t, PasswordResetEmailArgs{UserID: user.ID}, nil)
			require.Error(t, err)
			token, err := bundle.store.EmailTokenGetByJob(t.Context(), failed.Job.ID)
			require.NoError(t, err)
			require.NotNil(t, token.Sealed)

			suppress(t, bundle.store, user, email.ReasonComplained)
			bundle.clock.advance(time.Minute)
			res, err := bundle.workAgain(t, failed.Job)
			require.NoError(t, err)
			require.Equal(t, rivertype.JobStateCompleted, res.Job.State)
			require.Len(t, bundle.fake.Requests(), 1, "only the first attempt's")
			require.Zero(t, len(bundle.fake.Deliveries()))

			message, err := bundle.store.EmailMessageGetByJob(t.Context(), res.Job.ID)
			require.NoError(t, err)
			require.Equal(t, email.StatusSuppressed, message.Status)
			token, err = bundle.store.EmailTokenGetByJob(t.Context(), res.Job.ID)
			require.NoError(t, err)
			require.Nil(t, token.Sealed, "sealed copy erased: nothing will send it")
			require.Equal(t, float64(1), bundle.deliveries(t, "password_reset_email", OutcomeSuppressed))
		})

		t.Run("AcceptedBeforeSuppressed", func(t *testing.T) {
			t.Parallel()

			// The provider accepted the mail but the attempt died before River heard of it; the
			// address is suppressed meanwhile (this very mail bounced). The rescued attempt
			// completes as sent, which it was, and leaves the message's status alone.
			bundle := setup(t, newStore, nil)
			user := createUser(t, bundle.store)
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusInternalServerError, Deliver: true})
			failed, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.Error(t, err)
			require.Len(t, bundle.fake.Deliveries(), 1)
			require.NoError(t, bundle.store.EmailMessageMarkAccepted(t.Context(), &db.EmailMessageMarkAcceptedParams{JobID: failed.Job.ID, Provider: "resend", ProviderID: bundle.fake.Deliveries()[0].ID, Now: bundle.clock.Now()}))

			suppress(t, bundle.store, user, email.ReasonBounced)
			res, err := bundle.workAgain(t, failed.Job)
			require.NoError(t, err)
			require.Equal(t, rivertype.JobStateCompleted, res.Job.State)
			require.Equal(t, float64(1), bundle.deliveries(t, "verification_email", OutcomeSkipped))
			require.Zero(t, bundle.deliveries(t, "verification_email", OutcomeSuppressed))

			message, err := bundle.store.EmailMessageGetByJob(t.Context(), res.Job.ID)
			require.NoError(t, err)
			require.Equal(t, email.StatusSent, message.Status)
			require.Nil(t, message.SuppressedAt)
		})

		t.Run("RemovedSuppressionSendsAgain", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, nil)
			user := createUser(t, bundle.store)
			suppress(t, bundle.store, user, email.ReasonBounced)
			_, err := bundle.work(t, PasswordResetEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)
			require.Zero(t, len(bundle.fake.Requests()))

			deleted, err := bundle.store.EmailSuppressionDelete(t.Context(), email.SuppressionKey(testSecret, user.Email))
			require.NoError(t, err)
			require.True(t, deleted)
			res, err := bundle.work(t, PasswordResetEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)
			require.Len(t, bundle.fake.Deliveries(), 1)
			require.Equal(t, float64(1), bundle.deliveries(t, "password_reset_email", OutcomeSent))
		})
	})
}
