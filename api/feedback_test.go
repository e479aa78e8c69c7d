package api

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertest"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/email"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/jobs/mail/resendfake"
)

// feedbackLoop is the whole delivery loop in one process: the API's router (with the webhook
// and the admin API), and the real email workers sending through the real ResendSender into a
// resendfake, whose webhooks come back through the router. The workers run in the store's River
// client (start), or one job at a time in River's test executor (work).
type feedbackLoop struct {
	*testBundle
	fake        *resendfake.Server
	jobsMetrics *prometheus.Registry
	events      <-chan *river.Event
	dbStore     *dbtest.Store
	workers     *jobs.Workers
	riverConfig *river.Config // of work
}

func newFeedbackLoop(t *testing.T, newStore dbtest.NewStoreFunc) *feedbackLoop {
	t.Helper()
	return newFeedbackLoopOf(t, newStore, nil)
}

// newFeedbackLoopOf is newFeedbackLoop with the workers reading recipients from a host app's
// Recipients instead of postguard's users table (recipients nil).
func newFeedbackLoopOf(t *testing.T, newStore dbtest.NewStoreFunc, recipients jobs.Recipients) *feedbackLoop {
	t.Helper()
	fake := resendfake.New(t, nil)
	sender, err := mail.NewResendSender(&mail.ResendConfig{APIKey: "re_test", BaseURL: fake.URL(), From: "Postguard <no-reply@example.com>"})
	require.NoError(t, err)
	jobsMetrics := prometheus.NewRegistry()
	config := &jobs.Config{Secret: testSecret, AppURL: "http://localhost:8080", FetchCooldown: 5 * time.Millisecond, FetchPollInterval: 50 * time.Millisecond}
	var deps *jobs.Deps
	store := newStore(t, dbtest.WithRiverConfig(func(store riverstore.Store) (*river.Config, error) {
		deps = &jobs.Deps{Store: store, Recipients: cmp.Or(recipients, jobs.UserRecipients(store)), Jobs: store.Jobs(), Sender: sender, Logger: dbtest.Logger(t), Registerer: jobsMetrics}
		riverConfig, err := jobs.NewRiverConfig(deps, config)
		if err == nil {
			riverConfig.PeriodicJobs = nil
		}
		return riverConfig, err
	}))
	// River's test executor takes a config without queues.
	testConfig := *config
	testConfig.InsertOnly = true
	workers, err := jobs.NewWorkers(deps, &testConfig)
	require.NoError(t, err)
	riverConfig, err := jobs.NewRiverConfig(deps, &testConfig)
	require.NoError(t, err)

	bundle := setup(t, store, &setupOpts{configFunc: func(config *Config) {
		config.ResendWebhookSecret = fake.WebhookSecret()
		config.AdminToken = testAdminToken
	}})
	return &feedbackLoop{testBundle: bundle, fake: fake, jobsMetrics: jobsMetrics, dbStore: store, workers: workers, riverConfig: riverConfig}
}

// work works one job of args to its end in River's test executor.
func (l *feedbackLoop) work(t *testing.T, args river.JobArgs) *rivertype.JobRow {
	t.Helper()
	var res *rivertest.WorkResult
	var err error
	switch args := args.(type) {
	case jobs.WelcomeEmailArgs:
		res, err = dbtest.Work(t.Context(), t, l.dbStore, l.riverConfig, l.workers.WelcomeEmail, args, nil)
	case jobs.VerificationEmailArgs:
		res, err = dbtest.Work(t.Context(), t, l.dbStore, l.riverConfig, l.workers.VerificationEmail, args, nil)
	default:
		require.FailNow(t, fmt.Sprintf("no worker for %T", args))
	}
	require.NoError(t, err)
	require.Equal(t, river.EventKindJobCompleted, res.EventKind)
	return res.Job
}

// start starts the store's River client, which works every email job the API inserts.
func (l *feedbackLoop) start(t *testing.T) {
	t.Helper()
	client := l.store.Jobs()
	events, cancel := client.Subscribe(river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled)
	require.NoError(t, client.Start(context.Background()))
	t.Cleanup(func() {
		cancel()
		ctx, cancelStop := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancelStop()
		require.NoError(t, client.Stop(ctx))
	})
	l.events = events
}

func startFeedbackLoop(t *testing.T, newStore dbtest.NewStoreFunc) *feedbackLoop {
	t.Helper()
	loop := newFeedbackLoop(t, newStore)
	loop.start(t)
	return loop
}

// drain waits until n email jobs finished, each completed, and none is left in flight; it
// returns them.
func (l *feedbackLoop) drain(t *testing.T, n int) []*rivertype.JobRow {
	t.Helper()
	timeout := time.NewTimer(20 * time.Second)
	defer timeout.Stop()
	var finished []*rivertype.JobRow
	for len(finished) < n {
		select {
		case event := <-l.events:
			require.Equal(t, river.EventKindJobCompleted, event.Kind, "job %d (%s)", event.Job.ID, event.Job.Kind)
			finished = append(finished, event.Job)
		case <-timeout.C:
			require.FailNow(t, fmt.Sprintf("%d of %d email jobs finished", len(finished), n))
		}
	}
	result, err := l.store.Jobs().JobList(t.Context(), river.NewJobListParams().Queues(jobs.QueueEmail).States(
		rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRetryable,
		rivertype.JobStateRunning, rivertype.JobStateScheduled))
	require.NoError(t, err)
	require.Empty(t, result.Jobs, "no email job left in flight")
	return finished
}

// deliveryTo is the fake's last delivery of kind to email.
func (l *feedbackLoop) deliveryTo(t *testing.T, email, kind string) resendfake.Delivery {
	t.Helper()
	deliveries := l.fake.Deliveries()
	for i := len(deliveries) - 1; i >= 0; i-- {
		if deliveries[i].To[0] == email && strings.HasPrefix(deliveries[i].IdempotencyKey, kind+":") {
			return deliveries[i]
		}
	}
	require.FailNow(t, "no "+kind+" delivered to "+email)
	return resendfake.Delivery{}
}

func (l *feedbackLoop) sendsTo(email string) int {
	n := 0
	for _, req := range l.fake.Requests() {
		if strings.Contains(string(req.Body), `"to":["`+email+`"]`) {
			n++
		}
	}
	return n
}

// outcome reads postguard_email_deliveries_total{kind,outcome}.
func (l *feedbackLoop) outcome(t *testing.T, kind, outcome string) float64 {
	t.Helper()
	families, err := l.jobsMetrics.Gather()
	require.NoError(t, err)
	for _, family := range families {
		if family.GetName() != "postguard_email_deliveries_total" {
			continue
		}
		for _, metric := range family.GetMetric() {
			labels := map[string]string{}
			for _, label := range metric.GetLabel() {
				labels[label.GetName()] = label.GetValue()
			}
			if labels["kind"] == kind && labels["outcome"] == outcome {
				return metric.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// statusOf is the status of the message of job.
func (l *feedbackLoop) statusOf(t *testing.T, job *rivertype.JobRow) string {
	t.Helper()
	message, err := l.store.EmailMessageGetByJob(t.Context(), job.ID)
	require.NoError(t, err)
	return message.Status
}

func (l *feedbackLoop) webhook(t *testing.T, delivery resendfake.Delivery, eventType string, opts *resendfake.EventOpts) {
	t.Helper()
	rec := postWebhook(t, l.router, l.fake, l.fake.Event(delivery, eventType, opts))
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
}

func (l *feedbackLoop) forgotPassword(t *testing.T, email string) {
	t.Helper()
	rec := serve(t, l.router, jsonRequest(t, "/v1/auth/forgot-password", map[string]string{"email": email}))
	require.Equal(t, http.StatusAccepted, rec.Code)
}

func jobOfKind(t *testing.T, finished []*rivertype.JobRow, kind string) *rivertype.JobRow {
	t.Helper()
	for _, job := range finished {
		if job.Kind == kind {
			return job
		}
	}
	require.FailNow(t, "no "+kind+" job finished")
	return nil
}

func TestDeliveryFeedback_Loop(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		t.Run("PermanentBounceStopsResetUntilRemoved", func(t *testing.T) {
			t.Parallel()

			loop := startFeedbackLoop(t, newStore)
			address := strings.ToLower(uniqueEmail("bounce"))
			register(t, loop.router, address)
			finished := loop.drain(t, 2) // welcome and verification, sent
			verification := jobOfKind(t, finished, "verification_email")
			require.Equal(t, email.StatusSent, loop.statusOf(t, verification))

			// Resend reports that the verification mail bounced for good.
			loop.webhook(t, loop.deliveryTo(t, address, "verification_email"), resendfake.EventBounced, nil)
			require.Equal(t, email.StatusBounced, loop.statusOf(t, verification))

			// The next reset mail for that address: the job completes, counted suppressed, and
			// no provider call is made.
			sends := loop.sendsTo(address)
			loop.forgotPassword(t, address)
			reset := jobOfKind(t, loop.drain(t, 1), "password_reset_email")
			require.Equal(t, rivertype.JobStateCompleted, reset.State)
			require.Equal(t, sends, loop.sendsTo(address), "no provider call")
			require.Equal(t, float64(1), loop.outcome(t, "password_reset_email", jobs.OutcomeSuppressed))
			require.Equal(t, email.StatusSuppressed, loop.statusOf(t, reset))

			// Support takes the address off the list: the next reset goes through.
			rec := serve(t, loop.router, adminRequest(http.MethodDelete, "/v1/admin/suppressions/"+url.PathEscape(address)))
			require.Equal(t, http.StatusNoContent, rec.Code)
			loop.forgotPassword(t, address)
			reset = jobOfKind(t, loop.drain(t, 1), "password_reset_email")
			require.Equal(t, sends+1, loop.sendsTo(address))
			require.Equal(t, float64(1), loop.outcome(t, "password_reset_email", jobs.OutcomeSent))
			require.Equal(t, email.StatusSent, loop.statusOf(t, reset))
		})

		t.Run("ComplaintStopsWelcomeAndVerification", func(t *testing.T) {
			t.Parallel()

			// The jobs registration inserted are worked one at a time: the verification mail
			// first, which its recipient marks as spam before the welcome mail goes out.
			loop := newFeedbackLoop(t, newStore)
			address := strings.ToLower(uniqueEmail("complaint"))
			userID := register(t, loop.router, address)
			require.Equal(t, 1, jobCount(t, loop.store, "welcome_email"))
			verification := loop.work(t, jobs.VerificationEmailArgs{UserID: userID})
			require.Equal(t, email.StatusSent, loop.statusOf(t, verification))
			loop.webhook(t, loop.deliveryTo(t, address, "verification_email"), resendfake.EventComplained, nil)
			require.Equal(t, email.StatusComplained, loop.statusOf(t, verification))

			// The welcome mail is held back, and so is a new verification mail (a resend's).
			sends := loop.sendsTo(address)
			welcome := loop.work(t, jobs.WelcomeEmailArgs{UserID: userID})
			again := loop.work(t, jobs.VerificationEmailArgs{UserID: userID})
			for _, job := range []*rivertype.JobRow{welcome, again} {
				require.Equal(t, rivertype.JobStateCompleted, job.State)
				require.Equal(t, email.StatusSuppressed, loop.statusOf(t, job), job.Kind)
			}
			require.Equal(t, sends, loop.sendsTo(address), "no provider call")
			require.Equal(t, float64(1), loop.outcome(t, "verification_email", jobs.OutcomeSuppressed))
			require.Equal(t, float64(1), loop.outcome(t, "welcome_email", jobs.OutcomeSuppressed))
		})

		t.Run("TransientBounceStopsNothing", func(t *testing.T) {
			t.Parallel()

			loop := startFeedbackLoop(t, newStore)
			address := strings.ToLower(uniqueEmail("transient"))
			register(t, loop.router, address)
			verification := jobOfKind(t, loop.drain(t, 2), "verification_email")
			loop.webhook(t, loop.deliveryTo(t, address, "verification_email"), resendfake.EventBounced,
				&resendfake.EventOpts{BounceType: resendfake.BounceTransient, BounceSubType: resendfake.BounceMailboxFull})
			require.Equal(t, email.StatusBounced, loop.statusOf(t, verification))

			sends := loop.sendsTo(address)
			loop.forgotPassword(t, address)
			reset := jobOfKind(t, loop.drain(t, 1), "password_reset_email")
			require.Equal(t, sends+1, loop.sendsTo(address))
			require.Equal(t, email.StatusSent, loop.statusOf(t, reset))
			require.Zero(t, loop.outcome(t, "password_reset_email", jobs.OutcomeSuppressed))

			// Then it is delivered after all.
			loop.webhook(t, loop.deliveryTo(t, address, "password_reset_email"), resendfake.EventDelivered, nil)
			require.Equal(t, email.StatusDelivered, loop.statusOf(t, reset))
		})
	})
}

// A host app's Recipients may keep an address in any spelling. The workers mail and look up its
// normal form, and the webhook suppresses the normal form of what the provider reports, so an
// IDN address is one suppression whichever form the host keeps and the provider reports.
func TestDeliveryFeedback_HostRecipients(t *testing.T) {
	t.Parallel()

	const hostUserID = 42 // an account of the host's own table, not of postguard's users
	for _, tt := range []struct {
		name      string
		hostKeeps string // the address the host's Recipients return
		reported  string // the address the provider's bounce names
	}{
		{"IDNRecipientAfterABounceOfItsASCIIForm", "Ada@Bücher.de", "ada@xn--bcher-kva.de"},
		{"ASCIIRecipientAfterABounceOfItsIDNForm", "ADA@XN--BCHER-KVA.DE", "ada@bücher.de"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
				recipients := jobs.RecipientsFunc(func(_ context.Context, id int64) (*jobs.Recipient, error) {
					require.Equal(t, int64(hostUserID), id)
					return &jobs.Recipient{Email: tt.hostKeeps, Name: "Ada"}, nil
				})
				loop := newFeedbackLoopOf(t, newStore, recipients)

				welcome := loop.work(t, jobs.WelcomeEmailArgs{UserID: hostUserID})
				require.Equal(t, email.StatusSent, loop.statusOf(t, welcome))
				delivery := loop.deliveryTo(t, "ada@xn--bcher-kva.de", "welcome_email") // mailed to the normal form

				// The provider reports the permanent bounce of the address in its own spelling.
				delivery.To = []string{tt.reported}
				loop.webhook(t, delivery, resendfake.EventBounced, nil)
				require.Equal(t, email.StatusBounced, loop.statusOf(t, welcome))

				sends := len(loop.fake.Requests())
				verification := loop.work(t, jobs.VerificationEmailArgs{UserID: hostUserID})
				require.Equal(t, email.StatusSuppressed, loop.statusOf(t, verification), "the host's spelling is the suppressed address")
				require.Len(t, loop.fake.Requests(), sends, "no provider call")
				require.Equal(t, float64(1), loop.outcome(t, "verification_email", jobs.OutcomeSuppressed))
			})
		})
	}
}
