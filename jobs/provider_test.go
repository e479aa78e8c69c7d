package jobs

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
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
	"github.com/postguard/postguard/jobs/mail/smtpfake"
)

// requireMessage reads job's message row.
func requireMessage(t *testing.T, store riverstore.Store, jobID int64) *db.EmailMessage {
	t.Helper()

	message, err := store.EmailMessageGetByJob(t.Context(), jobID)
	require.NoError(t, err)
	return message
}

// parsed reads a message the smtpfake received.
func parsed(t *testing.T, m smtpfake.Message) *smtpfake.Parsed {
	t.Helper()

	p, err := m.Parse()
	require.NoError(t, err)
	return p
}

func TestEmailWorkers_SMTP(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		smtpOnly := &setupOpts{providers: []string{"smtp"}}

		t.Run("AcceptedOverSTARTTLSWithAuth", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, smtpOnly)
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)

			messages := bundle.smtp.Messages()
			require.Len(t, messages, 1)
			require.Equal(t, []string{user.Email}, messages[0].To)
			require.True(t, messages[0].TLS)
			require.Equal(t, smtpUser, messages[0].User)
			p := parsed(t, messages[0])
			require.Contains(t, p.Text, testAppURL+"/v1/auth/verify-email?token=")

			// The row says SMTP took it, under the Message-ID it was sent with.
			message := requireMessage(t, bundle.store, res.Job.ID)
			require.Equal(t, email.StatusSent, message.Status)
			require.Equal(t, "smtp", *message.Provider)
			require.Equal(t, p.Header.Get("Message-Id"), *message.ProviderID)
			require.Equal(t, mail.MessageID(message.IdempotencyKey, "example.com"), *message.ProviderID)
			require.Nil(t, message.ProviderInDoubt)
			require.Equal(t, float64(1), bundle.counter(t, "postguard_email_deliveries_total", map[string]string{"provider": "smtp", "outcome": OutcomeSent}))
			require.Empty(t, bundle.fake.Requests(), "Resend is not configured")
		})

		t.Run("ImplicitTLS", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, &setupOpts{
				providers:  []string{"smtp"},
				smtp:       &smtpfake.Config{ImplicitTLS: true, Username: smtpUser, Password: smtpPassword},
				smtpScheme: mail.SMTPSchemeTLS,
			})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, WelcomeEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)
			messages := bundle.smtp.Messages()
			require.Len(t, messages, 1)
			require.True(t, messages[0].TLS)
			require.Equal(t, smtpUser, messages[0].User)
		})

		t.Run("NoSTARTTLSRetriesNothingSent", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, &setupOpts{
				providers: []string{"smtp"},
				smtp:      &smtpfake.Config{NoSTARTTLS: true, Username: smtpUser, Password: smtpPassword},
			})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.ErrorContains(t, err, "STARTTLS")
			require.Equal(t, rivertype.JobStateRetryable, res.Job.State)
			requireAt(t, bundle.clock.Now().Add(time.Minute), res.Job.ScheduledAt)
			require.Equal(t, 1, bundle.smtp.Sessions())
			require.Empty(t, bundle.smtp.Received(), "nothing in clear: no mail, no password")
			require.Nil(t, requireMessage(t, bundle.store, res.Job.ID).ProviderInDoubt, "the server cannot have the mail")
		})

		t.Run("TemporaryReplyRetries", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, smtpOnly)
			bundle.smtp.Enqueue(smtpfake.Fault{Phase: smtpfake.PhaseRcptTo, Code: 451, EnhancedCode: [3]int{4, 3, 0}})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.ErrorContains(t, err, "SMTP RCPT TO answered 451 4.3.0")
			require.Equal(t, rivertype.JobStateRetryable, res.Job.State)
			requireAt(t, bundle.clock.Now().Add(time.Minute), res.Job.ScheduledAt)
			require.Equal(t, float64(1), bundle.counter(t, "postguard_email_deliveries_total", map[string]string{"provider": "smtp", "outcome": OutcomeRetried}))

			bundle.clock.advance(time.Minute)
			res, err = bundle.workAgain(t, res.Job)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)
			require.Len(t, bundle.smtp.Messages(), 1)
		})

		t.Run("PermanentRcptRefusalCancelsAndSuppresses", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, smtpOnly)
			bundle.smtp.Enqueue(smtpfake.Fault{Phase: smtpfake.PhaseRcptTo, Code: 550, EnhancedCode: [3]int{5, 1, 1}, Message: "no such user"})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, PasswordResetEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCancelled, res.EventKind)
			require.Contains(t, res.Job.Errors[0].Error, "SMTP RCPT TO answered 550 5.1.1")
			require.NotContains(t, res.Job.Errors[0].Error, user.Email)
			require.Empty(t, bundle.smtp.Received())

			// The address is suppressed, as a permanent bounce's is, and the row says bounced.
			suppression, err := bundle.store.EmailSuppressionGet(t.Context(), email.SuppressionKey(testSecret, user.Email))
			require.NoError(t, err)
			require.Equal(t, email.ReasonBounced, suppression.Reason)
			require.Equal(t, "SMTP 550 5.1.1", suppression.Detail)
			message := requireMessage(t, bundle.store, res.Job.ID)
			require.Equal(t, mail.MessageID(message.IdempotencyKey, "example.com"), suppression.EmailID)
			require.Equal(t, email.StatusBounced, message.Status)
			require.Equal(t, "SMTP 550 5.1.1", *message.BounceSubType)
			require.Nil(t, message.ProviderInDoubt)
			token, err := bundle.store.EmailTokenGetByJob(t.Context(), res.Job.ID)
			require.NoError(t, err)
			require.Nil(t, token.Sealed, "nothing will send the token")
			require.Equal(t, float64(1), bundle.deliveries(t, "password_reset_email", OutcomeCancelled))

			// The next mail to the address is held back, never sent.
			res, err = bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)
			require.Equal(t, float64(1), bundle.deliveries(t, "verification_email", OutcomeSuppressed))
			require.Equal(t, 1, bundle.smtp.Sessions(), "no second session")
		})

		t.Run("RelayDeniedRetriesSuppressingNoOne", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, smtpOnly)
			bundle.smtp.Enqueue(smtpfake.Fault{Phase: smtpfake.PhaseRcptTo, Code: 554, EnhancedCode: [3]int{5, 7, 1}, Message: "Relay access denied"})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.Error(t, err)
			require.Equal(t, rivertype.JobStateRetryable, res.Job.State)
			_, err = bundle.store.EmailSuppressionGet(t.Context(), email.SuppressionKey(testSecret, user.Email))
			require.ErrorIs(t, err, db.ErrNotFound, "a refusal of postguard is no bounce of the address")
		})

		t.Run("PermanentDataRefusalCancels", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, smtpOnly)
			bundle.smtp.Enqueue(smtpfake.Fault{Phase: smtpfake.PhaseEndOfData, Code: 554, EnhancedCode: [3]int{5, 6, 0}})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCancelled, res.EventKind)
			require.Contains(t, res.Job.Errors[0].Error, "SMTP end of data answered 554 5.6.0")
			require.Empty(t, bundle.smtp.Messages())
			_, err = bundle.store.EmailSuppressionGet(t.Context(), email.SuppressionKey(testSecret, user.Email))
			require.ErrorIs(t, err, db.ErrNotFound, "the content was refused, not the address")
			require.Equal(t, email.StatusQueued, requireMessage(t, bundle.store, res.Job.ID).Status)
		})

		t.Run("ConnectionLostAfterDataRetriesWithSameMessageID", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, smtpOnly)
			bundle.smtp.Enqueue(smtpfake.Fault{Phase: smtpfake.PhaseEndOfData, Drop: true})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, WelcomeEmailArgs{UserID: user.ID}, nil)
			require.ErrorContains(t, err, "SMTP end of data: no reply")
			require.Equal(t, rivertype.JobStateRetryable, res.Job.State)
			requireAt(t, bundle.clock.Now().Add(time.Minute), res.Job.ScheduledAt)
			// The server may have the mail: the row keeps it in doubt there.
			require.Equal(t, "smtp", *requireMessage(t, bundle.store, res.Job.ID).ProviderInDoubt)

			bundle.clock.advance(time.Minute)
			res, err = bundle.workAgain(t, res.Job)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)

			// SMTP has no idempotency key: both attempts' content reached the server (the first
			// may have been delivered), with one Message-ID and the same bodies.
			received := bundle.smtp.Received()
			require.Len(t, received, 2)
			first, second := parsed(t, received[0]), parsed(t, received[1])
			require.Equal(t, first.Header.Get("Message-Id"), second.Header.Get("Message-Id"))
			require.Equal(t, first.Text, second.Text)
			require.Equal(t, first.HTML, second.HTML)
			message := requireMessage(t, bundle.store, res.Job.ID)
			require.Equal(t, first.Header.Get("Message-Id"), *message.ProviderID)
			require.Equal(t, "smtp", *message.Provider)
			require.Nil(t, message.ProviderInDoubt)
		})

		t.Run("PacedUnderItsOwnBudget", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, &setupOpts{providers: []string{"smtp"}})
			bundle.deps.Providers[0].MaxRPS = 0.001 // a slot every ~17 minutes
			workers, err := NewWorkers(&Deps{Store: bundle.store, Recipients: UserRecipients(bundle.store), Providers: bundle.deps.Providers}, bundle.config)
			require.NoError(t, err)
			bundle.workers = workers

			user := createUser(t, bundle.store)
			res, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind, "the first slot is now")

			// SMTP's slot is taken, and Resend's budget untouched: the next SMTP slot is one
			// interval away, Resend's is now.
			slot, now, err := bundle.store.SendPacerReserve(t.Context(), "smtp", time.Microsecond)
			require.NoError(t, err)
			require.Greater(t, slot.Sub(now), 10*time.Minute)
			slot, now, err = bundle.store.SendPacerReserve(t.Context(), DefaultProviderName, time.Microsecond)
			require.NoError(t, err)
			require.False(t, slot.After(now))
		})
	})
}

func TestEmailWorkers_Failover(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		both := &setupOpts{providers: []string{"resend", "smtp"}}
		failovers := func(t *testing.T, bundle *testBundle) float64 {
			t.Helper()
			return bundle.counter(t, "postguard_email_failovers_total", map[string]string{"from": "resend", "to": "smtp"})
		}

		t.Run("ResendServerErrorGoesOutBySMTPOnce", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, both)
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusInternalServerError, Name: "internal_server_error"})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)
			require.Equal(t, 1, res.Job.Attempt, "in the same attempt")

			require.Len(t, bundle.fake.Requests(), 1)
			require.Empty(t, bundle.fake.Deliveries())
			require.Len(t, bundle.smtp.Messages(), 1)
			message := requireMessage(t, bundle.store, res.Job.ID)
			require.Equal(t, "smtp", *message.Provider)
			require.Nil(t, message.ProviderInDoubt)
			require.Equal(t, float64(1), failovers(t, bundle))
			require.Equal(t, float64(1), bundle.counter(t, "postguard_email_deliveries_total", map[string]string{"provider": "smtp", "outcome": OutcomeSent}))
			require.Contains(t, bundle.logs.String(), "email failing over to the next provider")
			require.Contains(t, bundle.logs.String(), "from=resend to=smtp")
			require.NotContains(t, bundle.logs.String(), user.Email)
			require.Equal(t, map[string]float64{"resend": 1, "smtp": 0}, gatherCircuits(t, bundle))

			// Resend's circuit is open: the next mail goes to SMTP first, Resend not tried.
			other := createUser(t, bundle.store)
			res, err = bundle.work(t, VerificationEmailArgs{UserID: other.ID}, nil)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)
			require.Len(t, bundle.fake.Requests(), 1, "Resend is not retried")
			require.Len(t, bundle.smtp.Messages(), 2)
			require.Equal(t, float64(1), failovers(t, bundle), "no failover: SMTP came first")

			// After the cool-down Resend is tried in its turn again, and takes the mail.
			bundle.clock.advance(DefaultCircuitCooldown)
			res, err = bundle.work(t, VerificationEmailArgs{UserID: createUser(t, bundle.store).ID}, nil)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)
			require.Len(t, bundle.fake.Deliveries(), 1)
			require.Equal(t, "resend", *requireMessage(t, bundle.store, res.Job.ID).Provider)
			require.Equal(t, map[string]float64{"resend": 0, "smtp": 0}, gatherCircuits(t, bundle))
		})

		t.Run("ResendRefusingConnectionsGoesOutBySMTPOnce", func(t *testing.T) {
			t.Parallel()

			dead := httptest.NewServer(http.NotFoundHandler())
			dead.Close() // its port now refuses connections
			bundle := setup(t, newStore, &setupOpts{
				providers: []string{"resend", "smtp"},
				sender: func(mail.Sender) mail.Sender {
					sender, err := mail.NewResendSender(&mail.ResendConfig{APIKey: "re_test_key", BaseURL: dead.URL, From: "no-reply@example.com"})
					require.NoError(t, err)
					return sender
				},
			})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, WelcomeEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)
			require.Len(t, bundle.smtp.Messages(), 1)
			require.Equal(t, "smtp", *requireMessage(t, bundle.store, res.Job.ID).Provider)
			require.Equal(t, float64(1), failovers(t, bundle))
		})

		t.Run("ResendRefusalCancelsNothingSentBySMTP", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, both)
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusUnprocessableEntity, Name: resendfake.NameValidationError})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCancelled, res.EventKind)
			require.Len(t, bundle.fake.Requests(), 1)
			require.Zero(t, bundle.smtp.Sessions(), "a permanent refusal never fails over")
			require.Zero(t, failovers(t, bundle))
			require.Equal(t, float64(1), bundle.counter(t, "postguard_email_deliveries_total", map[string]string{"provider": "resend", "outcome": OutcomeCancelled}))
		})

		t.Run("ResendAnswerLostStaysWithResend", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, both)
			// Resend delivers and its answer is lost: it may have the mail.
			bundle.fake.Enqueue(resendfake.Response{Deliver: true, Drop: true})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.Error(t, err)
			require.Equal(t, rivertype.JobStateRetryable, res.Job.State)
			require.Zero(t, bundle.smtp.Sessions(), "not handed to SMTP in the same attempt")
			require.Equal(t, "resend", *requireMessage(t, bundle.store, res.Job.ID).ProviderInDoubt)

			// Resend's circuit is still open (the clock has not passed its cool-down): any other
			// mail would go to SMTP first, but this one goes back to Resend, whose key answers it
			// as the mail it already has.
			res, err = bundle.workAgain(t, res.Job)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)
			require.Zero(t, bundle.smtp.Sessions())
			bundle.requireRetrySentSameMail(t)
			message := requireMessage(t, bundle.store, res.Job.ID)
			require.Equal(t, "resend", *message.Provider)
			require.Nil(t, message.ProviderInDoubt)
		})

		t.Run("BothDownRetriedThenSentByTheFirstToRecover", func(t *testing.T) {
			t.Parallel()

			for _, recovers := range []string{"smtp", "resend"} {
				t.Run(recovers, func(t *testing.T) {
					t.Parallel()

					bundle := setup(t, newStore, both)
					bundle.fake.Enqueue(resendfake.Response{Status: http.StatusServiceUnavailable})
					bundle.smtp.Enqueue(smtpfake.Fault{Phase: smtpfake.PhaseHello, Code: 421, EnhancedCode: [3]int{4, 3, 2}})
					user := createUser(t, bundle.store)
					res, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
					require.ErrorContains(t, err, "SMTP connect answered 421")
					require.Equal(t, rivertype.JobStateRetryable, res.Job.State)
					requireAt(t, bundle.clock.Now().Add(time.Minute), res.Job.ScheduledAt)
					require.Nil(t, requireMessage(t, bundle.store, res.Job.ID).ProviderInDoubt)
					require.Equal(t, float64(1), bundle.counter(t, "postguard_email_deliveries_total", map[string]string{"provider": "smtp", "outcome": OutcomeRetried}))

					// A minute on, by the retry schedule: the circuits' cool-down is over, and
					// the provider still down refuses again.
					bundle.clock.advance(time.Minute)
					if recovers == "smtp" {
						bundle.fake.Enqueue(resendfake.Response{Status: http.StatusServiceUnavailable})
					}
					res, err = bundle.workAgain(t, res.Job)
					require.NoError(t, err)
					require.Equal(t, river.EventKindJobCompleted, res.EventKind)
					require.Equal(t, 2, res.Job.Attempt)
					require.Equal(t, recovers, *requireMessage(t, bundle.store, res.Job.ID).Provider)

					if recovers == "smtp" {
						require.Len(t, bundle.smtp.Messages(), 1)
						require.Empty(t, bundle.fake.Deliveries())
					} else {
						require.Len(t, bundle.fake.Deliveries(), 1)
						require.Empty(t, bundle.smtp.Messages())
						require.Equal(t, 1, bundle.smtp.Sessions(), "SMTP not tried once Resend took it")
					}
				})
			}
		})

		t.Run("SameBytesAsResend", func(t *testing.T) {
			t.Parallel()

			// Resend refuses with a 500 after it has read the request, then SMTP takes the
			// mail: what each was given for the same job, in the same attempt.
			bundle := setup(t, newStore, both)
			bundle.fake.Enqueue(resendfake.Response{Status: http.StatusInternalServerError})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, WelcomeEmailArgs{UserID: user.ID}, nil)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)

			var resend struct {
				From    string            `json:"from"`
				To      []string          `json:"to"`
				Subject string            `json:"subject"`
				HTML    string            `json:"html"`
				Text    string            `json:"text"`
				Headers map[string]string `json:"headers"`
			}
			require.NoError(t, json.Unmarshal(bundle.fake.Requests()[0].Body, &resend))
			messages := bundle.smtp.Messages()
			require.Len(t, messages, 1)
			got := parsed(t, messages[0])
			require.Equal(t, resend.To, messages[0].To)
			require.Equal(t, resend.Subject, got.Subject())
			require.Equal(t, resend.Text, got.Text)
			require.Equal(t, resend.HTML, got.HTML)
			require.Contains(t, resend.Headers, "List-Unsubscribe")
			require.Contains(t, resend.Headers, "List-Unsubscribe-Post")
			for name, value := range resend.Headers {
				require.Equal(t, value, got.Header.Get(name), name)
			}
		})

		t.Run("InDoubtAtAProviderNoLongerConfigured", func(t *testing.T) {
			t.Parallel()

			bundle := setup(t, newStore, &setupOpts{providers: []string{"smtp"}})
			bundle.smtp.Enqueue(smtpfake.Fault{Phase: smtpfake.PhaseMailFrom, Code: 451})
			user := createUser(t, bundle.store)
			res, err := bundle.work(t, VerificationEmailArgs{UserID: user.ID}, nil)
			require.Error(t, err)
			gone := "mailgun"
			require.NoError(t, bundle.store.EmailMessageSetProviderInDoubt(t.Context(), &db.EmailMessageSetProviderInDoubtParams{JobID: res.Job.ID, Provider: &gone, Now: bundle.clock.Now()}))

			res, err = bundle.workAgain(t, res.Job)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)
			require.Len(t, bundle.smtp.Messages(), 1)
			require.Contains(t, bundle.logs.String(), "may deliver it twice")
		})
	})
}

// gatherCircuits reads postguard_email_circuit_open by provider.
func gatherCircuits(t *testing.T, bundle *testBundle) map[string]float64 {
	t.Helper()

	families, err := bundle.registry.Gather()
	require.NoError(t, err)
	values := map[string]float64{}
	for _, family := range families {
		if family.GetName() != "postguard_email_circuit_open" {
			continue
		}
		for _, metric := range family.GetMetric() {
			for _, label := range metric.GetLabel() {
				if label.GetName() == "provider" {
					values[label.GetValue()] = metric.GetGauge().GetValue()
				}
			}
		}
	}
	return values
}
