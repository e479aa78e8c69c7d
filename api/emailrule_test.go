package api

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/internal/uniform"
	"github.com/postguard/postguard/jobs"
	"github.com/postguard/postguard/jobs/mail"
)

// recordingSender is a mail.Sender that keeps the recipient and kind of every mail it is given.
type recordingSender struct {
	mu   sync.Mutex
	sent []string // "kind to"
}

func (r *recordingSender) Send(_ context.Context, msg *mail.Message) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = append(r.sent, msg.Kind+" "+msg.To)
	return fmt.Sprintf("rec_%d", len(r.sent)), nil
}

func (r *recordingSender) mails() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.sent...)
}

// mailWorkers is a store whose River client works the real email jobs, delivering to a
// recordingSender.
type mailWorkers struct {
	store  riverstore.Store
	sender *recordingSender
	events <-chan *river.Event
}

// startMailWorkers builds a store whose River client runs the service's own workers
// (jobs.NewRiverConfig), and starts it, stopped when t ends.
func startMailWorkers(t *testing.T, newStore dbtest.NewStoreFunc) *mailWorkers {
	t.Helper()
	sender := &recordingSender{}
	store := newStore(t, dbtest.WithRiverConfig(func(store riverstore.Store) (*river.Config, error) {
		riverConfig, err := jobs.NewRiverConfig(
			&jobs.Deps{Store: store, Jobs: store.Jobs(), Sender: sender, Logger: dbtest.Logger(t)},
			&jobs.Config{Secret: testSecret, AppURL: "http://localhost:8080", FetchCooldown: 5 * time.Millisecond, FetchPollInterval: 50 * time.Millisecond})
		if err == nil {
			riverConfig.PeriodicJobs = nil
		}
		return riverConfig, err
	}))

	client := store.Jobs()
	events, cancel := client.Subscribe(river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled)
	require.NoError(t, client.Start(context.Background()))
	t.Cleanup(func() {
		cancel()
		ctx, cancelStop := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancelStop()
		require.NoError(t, client.Stop(ctx))
	})
	return &mailWorkers{store: store, sender: sender, events: events}
}

// drain waits until no job of kind is in flight: every job a request inserted has been worked.
// The email jobs are unique by args while in flight, so a second request for one user would
// not insert a job (nor send a mail) while the first one's job still waits; working each job to
// completion between requests makes every admitted request show as one mail.
func (w *mailWorkers) drain(t *testing.T, kind string) {
	t.Helper()
	timeout := time.NewTimer(20 * time.Second)
	defer timeout.Stop()
	for {
		result, err := w.store.Jobs().JobList(t.Context(), river.NewJobListParams().Kinds(kind).States(
			rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRetryable,
			rivertype.JobStateRunning, rivertype.JobStateScheduled))
		require.NoError(t, err)
		if len(result.Jobs) == 0 {
			return
		}
		select {
		case event := <-w.events:
			require.Equal(t, river.EventKindJobCompleted, event.Kind, "job %d (%s)", event.Job.ID, event.Job.Kind)
		case <-timeout.C:
			require.FailNow(t, fmt.Sprintf("%d %s jobs still in flight", len(result.Jobs), kind))
		}
	}
}

// quietAnswer is what must not differ between two answers of forgot-password or
// resend-verification: status, headers (but X-Request-Id and Date) and body.
type quietAnswer struct {
	status int
	header http.Header
	body   string
}

func TestServer_EmailRuleRefusalAnswersLikeAdmission(t *testing.T) {
	t.Parallel()

	// A fixed clock for the limiter, so that RateLimit's t= is the same for every request.
	now := time.Now()
	nowFunc := func() time.Time { return now }
	rules := abuse.DefaultRules() // forgot-password: 5 / 15 min per IP, 3 / 1 h per email

	type quietBundle struct {
		*testBundle
		workers *mailWorkers
	}
	setupQuiet := func(t *testing.T, newStore dbtest.NewStoreFunc) *quietBundle {
		t.Helper()
		workers := startMailWorkers(t, newStore)
		return &quietBundle{setup(t, workers.store, &setupOpts{rules: &rules, limiterNow: nowFunc}), workers}
	}

	// send posts email to path from ip, works what it enqueued, and returns its answer.
	send := func(t *testing.T, b *quietBundle, path, email, ip, kind string) quietAnswer {
		t.Helper()
		req := jsonRequest(t, path, map[string]string{"email": email})
		req.RemoteAddr = ip + ":4321"
		start := time.Now()
		rec := serve(t, b.router, req)
		// The hold that makes every answer take as long, refusals included.
		require.GreaterOrEqual(t, time.Since(start), uniform.AnswerMin)
		b.workers.drain(t, kind)

		h := rec.Header().Clone()
		require.NotEmpty(t, h.Get(requestIDHeader))
		h.Del(requestIDHeader)
		h.Del("Date")
		for _, name := range []string{"RateLimit-Policy", "RateLimit"} {
			require.NotContains(t, h.Get(name), "-email", "%s speaks of the email's budget", name)
		}
		return quietAnswer{rec.Code, h, rec.Body.String()}
	}

	requireAllEqual := func(t *testing.T, answers []quietAnswer, policy string) {
		t.Helper()
		require.Equal(t, http.StatusAccepted, answers[0].status, answers[0].body)
		for i, a := range answers {
			require.Equal(t, answers[0], a, "answer %d differs from the first", i)
		}
		// Each request came from a fresh IP: the header is that IP's budget, one spent.
		require.Equal(t, `"`+policy+`";q=`+itoa(map[string]int64{"forgot-password-ip": 5, "resend-verification-ip": 6}[policy])+`;w=900`,
			answers[0].header.Get("RateLimit-Policy"))
		require.True(t, strings.HasPrefix(answers[0].header.Get("RateLimit"), `"`+policy+`";r=`))
		require.Empty(t, answers[0].header.Get("Retry-After"))
	}

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		t.Run("ForgotPassword", func(t *testing.T) {
			t.Parallel()
			b := setupQuiet(t, newStore)
			insertUser(t, b.store, "known@example.com", false)

			// Five requests for one address, from five IPs: the email rule admits three and
			// refuses two, and nothing tells them apart but the mail that went out.
			var answers []quietAnswer
			for i := range 5 {
				answers = append(answers, send(t, b, "/v1/auth/forgot-password", "known@example.com", fmt.Sprintf("192.0.2.%d", i+1), "password_reset_email"))
			}
			require.Equal(t, []string{
				"password_reset_email known@example.com",
				"password_reset_email known@example.com",
				"password_reset_email known@example.com",
			}, b.workers.sender.mails())

			// The same for an address no account has: five answers like those, no mail.
			for i := range 5 {
				answers = append(answers, send(t, b, "/v1/auth/forgot-password", "unknown@example.com", fmt.Sprintf("192.0.2.%d", i+11), "password_reset_email"))
			}
			requireAllEqual(t, answers, "forgot-password-ip")
			require.Len(t, b.workers.sender.mails(), 3)
			require.Equal(t, 3, jobCount(t, b.store, "password_reset_email"))

			// The refusals are counted: two per address.
			require.InDelta(t, 4, decisions(t, b.registry, "forgot_password", "email", "refused"), 0)
			require.InDelta(t, 6, decisions(t, b.registry, "forgot_password", "email", "allowed"), 0)
		})

		t.Run("ResendVerification", func(t *testing.T) {
			t.Parallel()
			b := setupQuiet(t, newStore)
			insertUser(t, b.store, "unverified@example.com", false)
			insertUser(t, b.store, "verified@example.com", true)

			var answers []quietAnswer
			for i, email := range []string{"unverified@example.com", "verified@example.com", "nobody@example.com"} {
				for j := range 5 {
					answers = append(answers, send(t, b, "/v1/auth/resend-verification", email, fmt.Sprintf("198.51.100.%d", 10*i+j+1), "verification_email"))
				}
			}
			requireAllEqual(t, answers, "resend-verification-ip")
			require.Equal(t, []string{
				"verification_email unverified@example.com",
				"verification_email unverified@example.com",
				"verification_email unverified@example.com",
			}, b.workers.sender.mails())
			require.InDelta(t, 6, decisions(t, b.registry, "resend_verification", "email", "refused"), 0)
		})

		t.Run("IPRuleStillRefuses", func(t *testing.T) {
			t.Parallel()
			b := setupQuiet(t, newStore)

			// The client's own budget is its to know: the sixth request from one IP is a 429.
			for i := range 5 {
				send(t, b, "/v1/auth/forgot-password", fmt.Sprintf("someone%d@example.com", i), "203.0.113.9", "password_reset_email")
			}
			req := jsonRequest(t, "/v1/auth/forgot-password", map[string]string{"email": "someone@example.com"})
			req.RemoteAddr = "203.0.113.9:4321"
			rec := serve(t, b.router, req)
			requireRateLimited(t, rec, "forgot-password-ip", 5)
		})
	})
}

// decisions reads one series of postguard_rate_limit_decisions_total.
func decisions(t *testing.T, registry *prometheus.Registry, action, scope, outcome string) float64 {
	t.Helper()
	families, err := registry.Gather()
	require.NoError(t, err)
	for _, family := range families {
		if family.GetName() != "postguard_rate_limit_decisions_total" {
			continue
		}
		for _, metric := range family.GetMetric() {
			labels := map[string]string{}
			for _, pair := range metric.GetLabel() {
				labels[pair.GetName()] = pair.GetValue()
			}
			if labels["action"] == action && labels["scope"] == scope && labels["outcome"] == outcome {
				return metric.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no series action=%s scope=%s outcome=%s", action, scope, outcome)
	return 0
}
