package jobs

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertest"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/jobs/mail/resendfake"
	"github.com/postguard/postguard/jobs/mail/smtpfake"
)

// testSecret is APP_SECRET in the jobs' tests.
var testSecret = []byte("a test secret of at least 32 bytes") //nolint:gochecknoglobals // a constant []byte

const testAppURL = "https://app.example.com"

// clock is the stubbed time of a test: the jobs' NowFunc, and River's (Config.Test.Time), so that
// schedules, snoozes and expiries are exact.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Now().UTC().Truncate(time.Microsecond)} }

// Now implements rivertype.TimeGenerator.
func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NowOrNil implements rivertype.TimeGenerator.
func (c *clock) NowOrNil() *time.Time {
	now := c.Now()
	return &now
}

// advance moves the clock on by d.
func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// syncBuffer is a bytes.Buffer safe for concurrent writers (a log handler's target).
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testBundle is a store and postguard's workers on it, sending through the real ResendSender to
// a resendfake, worked one job at a time in River's test executor (rivertest) with the River
// configuration NewRiverConfig makes (middleware, retry policy, timeouts).
type testBundle struct {
	clock       *clock
	config      *Config
	deps        *Deps
	fake        *resendfake.Server
	smtp        *smtpfake.Server
	logs        *syncBuffer
	registry    *prometheus.Registry
	riverConfig *river.Config
	store       *dbtest.Store
	workers     *Workers
}

type setupOpts struct {
	// configure adjusts the jobs Config.
	configure func(config *Config)
	// fake configures the resendfake.
	fake *resendfake.Config
	// sender wraps the ResendSender.
	sender func(inner mail.Sender) mail.Sender
	// recipients replaces postguard's users table as the workers' Recipients (a host app's).
	recipients func(store *dbtest.Store) Recipients
	// renderer renders the mail; nil for the built-in templates.
	renderer *mail.Renderer
	// providers, when set, are the workers' Providers in order, by name: "resend" (the
	// ResendSender to the resendfake, after sender), "smtp" (an SMTPSender over STARTTLS with
	// AUTH to an smtpfake). Unset, the ResendSender is Deps.Sender.
	providers []string
	// smtp configures the smtpfake; nil starts one with STARTTLS and AUTH.
	smtp *smtpfake.Config
	// smtpScheme is the SMTP_URL scheme of the SMTPSender; smtp (STARTTLS) when "".
	smtpScheme string
}

func setup(t *testing.T, newStore dbtest.NewStoreFunc, opts *setupOpts) *testBundle {
	t.Helper()

	if opts == nil {
		opts = &setupOpts{}
	}
	store := newStore(t)
	fake := resendfake.New(t, opts.fake)
	var sender mail.Sender
	sender, err := mail.NewResendSender(&mail.ResendConfig{
		APIKey:  "re_test_key",
		BaseURL: fake.URL(),
		From:    "Postguard <no-reply@example.com>",
		Timeout: 10 * time.Second,
	})
	require.NoError(t, err)
	if opts.sender != nil {
		sender = opts.sender(sender)
	}

	logs := &syncBuffer{}
	clock := newClock()
	config := &Config{
		AppURL:      testAppURL,
		JobTimeout:  15 * time.Second,
		RescueAfter: time.Minute,
		Secret:      testSecret,
		NowFunc:     clock.Now,
		// rivertest works jobs with a pool-less driver, which takes no queues.
		InsertOnly: true,
	}
	if opts.configure != nil {
		opts.configure(config)
	}
	deps := &Deps{
		Logger:     slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registerer: prometheus.NewRegistry(),
		Renderer:   opts.renderer,
		Sender:     sender,
		Store:      store,
		Recipients: UserRecipients(store),
		Jobs:       store.Jobs(),
	}
	if opts.recipients != nil {
		deps.Recipients = opts.recipients(store)
	}
	var smtp *smtpfake.Server
	for _, name := range opts.providers {
		switch name {
		case "resend":
			deps.Providers = append(deps.Providers, Provider{Name: name, Sender: sender})
		case "smtp":
			smtp = newSMTPFake(t, opts.smtp)
			deps.Providers = append(deps.Providers, Provider{Name: name, Sender: newSMTPSender(t, smtp, cmp.Or(opts.smtpScheme, mail.SMTPSchemeStartTLS))})
		default:
			require.FailNow(t, "no provider "+name)
		}
	}
	if len(deps.Providers) > 0 {
		deps.Sender = nil
	}
	workers, err := NewWorkers(deps, config)
	require.NoError(t, err)
	riverConfig, err := NewRiverConfig(deps, config)
	require.NoError(t, err)
	riverConfig.Test.Time = clock
	riverConfig.RetryPolicy.(*RetryPolicy).jitterFunc = func() float64 { return 0 } // exact schedules

	registry, _ := deps.Registerer.(*prometheus.Registry)
	return &testBundle{
		clock:       clock,
		config:      config,
		deps:        deps,
		fake:        fake,
		smtp:        smtp,
		logs:        logs,
		registry:    registry,
		riverConfig: riverConfig,
		store:       store,
		workers:     workers,
	}
}

// smtpUser and smtpPassword are the smtpfake's credentials in the workers' tests.
const (
	smtpUser     = "postguard"
	smtpPassword = "relay p@ss"
)

// newSMTPFake starts an smtpfake with config, or with STARTTLS and AUTH (smtpUser, smtpPassword).
func newSMTPFake(t *testing.T, config *smtpfake.Config) *smtpfake.Server {
	t.Helper()

	if config == nil {
		config = &smtpfake.Config{Username: smtpUser, Password: smtpPassword}
	}
	return smtpfake.New(t, config)
}

// newSMTPSender is an SMTPSender to fake on scheme, trusting its certificate.
func newSMTPSender(t *testing.T, fake *smtpfake.Server, scheme string) *mail.SMTPSender {
	t.Helper()

	u, err := mail.ParseSMTPURL(fake.URL(scheme))
	require.NoError(t, err)
	sender, err := mail.NewSMTPSender(&mail.SMTPConfig{
		URL:       u,
		From:      "Postguard <no-reply@example.com>",
		TLSConfig: fake.ClientTLSConfig(),
		Timeout:   10 * time.Second,
	})
	require.NoError(t, err)
	return sender
}

// deploy replaces the bundle's workers with ones rendering through renderer, as a deploy of other
// templates would between two attempts of a job.
func (b *testBundle) deploy(t *testing.T, renderer *mail.Renderer) {
	t.Helper()

	deps := *b.deps
	deps.Renderer = renderer
	deps.Registerer = nil // the first workers' metrics stay registered
	workers, err := NewWorkers(&deps, b.config)
	require.NoError(t, err)
	b.workers = workers
}

// newRenderer is a renderer on testAppURL whose templates directory holds files (name → text).
func newRenderer(t *testing.T, files map[string]string) *mail.Renderer {
	t.Helper()

	dir := t.TempDir()
	for name, text := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600))
	}
	renderer, err := mail.NewRenderer(&mail.RendererConfig{AppURL: testAppURL, TemplatesDir: dir})
	require.NoError(t, err)
	return renderer
}

// frenchTemplates are a French welcome and verification mail, text and HTML, inside the built-in
// layouts.
var frenchTemplates = map[string]string{ //nolint:gochecknoglobals // test data
	"welcome.fr.txt": `{{define "subject"}}Bienvenue sur {{.AppName}}{{end}}
{{define "content"}}Votre compte est prêt : {{.ActionURL}}{{end}}
{{define "footer"}}Se désabonner : {{.UnsubscribeURL}}{{end}}`,
	"welcome.fr.html": `{{define "action_label"}}Commencer{{end}}
{{define "content"}}<p>Votre compte est prêt.</p>{{template "button" .}}{{end}}
{{define "footer"}}<a href="{{.UnsubscribeURL}}">Se désabonner</a>{{end}}`,
	"verification.fr.txt": `{{define "subject"}}Confirmez votre adresse{{end}}
{{define "content"}}Confirmez votre adresse : {{.ActionURL}} (valable {{.ExpiresIn.Hours}} heures){{end}}
{{define "footer"}}{{.AppName}}{{end}}`,
	"verification.fr.html": `{{define "action_label"}}Confirmer{{end}}
{{define "content"}}<p>Confirmez votre adresse (valable {{.ExpiresIn.Hours}} heures).</p>{{template "button" .}}{{end}}
{{define "footer"}}{{.AppName}}{{end}}`,
}

// createUserIn registers a user with a unique email and locale.
func createUserIn(t *testing.T, store riverstore.Store, locale string) *db.User {
	t.Helper()

	n := userSeq.Add(1)
	user, err := store.UserInsert(t.Context(), &db.UserInsertParams{
		Email:        fmt.Sprintf("user%d@example.fr", n),
		Name:         fmt.Sprintf("Utilisateur %d", n),
		PasswordHash: "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA",
		Locale:       locale,
		Now:          time.Now(),
	})
	require.NoError(t, err)
	return user
}

// work inserts a job of args and works its first attempt. The error is the worker's when it
// failed (a retry), nil for a completion, a snooze or a cancellation (see WorkResult.EventKind).
func (b *testBundle) work(t *testing.T, args river.JobArgs, opts *river.InsertOpts) (*rivertest.WorkResult, error) {
	t.Helper()

	ctx := t.Context()
	switch args := args.(type) {
	case WelcomeEmailArgs:
		return dbtest.Work(ctx, t, b.store, b.riverConfig, b.workers.WelcomeEmail, args, opts)
	case VerificationEmailArgs:
		return dbtest.Work(ctx, t, b.store, b.riverConfig, b.workers.VerificationEmail, args, opts)
	case PasswordResetEmailArgs:
		return dbtest.Work(ctx, t, b.store, b.riverConfig, b.workers.PasswordResetEmail, args, opts)
	}
	require.FailNow(t, fmt.Sprintf("no worker for %T", args))
	return nil, nil
}

// workAgain works job, a row work returned, again: its next attempt.
func (b *testBundle) workAgain(t *testing.T, job *rivertype.JobRow) (*rivertest.WorkResult, error) {
	t.Helper()

	ctx := t.Context()
	switch job.Kind {
	case WelcomeEmailArgs{}.Kind():
		return dbtest.WorkJob(ctx, t, b.store, b.riverConfig, b.workers.WelcomeEmail, job)
	case VerificationEmailArgs{}.Kind():
		return dbtest.WorkJob(ctx, t, b.store, b.riverConfig, b.workers.VerificationEmail, job)
	case PasswordResetEmailArgs{}.Kind():
		return dbtest.WorkJob(ctx, t, b.store, b.riverConfig, b.workers.PasswordResetEmail, job)
	}
	require.FailNow(t, "no worker for kind "+job.Kind)
	return nil, nil
}

// requireRetrySentSameMail checks that the fake got two sends, a failed attempt and its retry,
// with one idempotency key and byte-identical payloads, and delivered one mail: it returns the
// key and that mail.
func (b *testBundle) requireRetrySentSameMail(t *testing.T) (string, resendfake.Delivery) {
	t.Helper()
	requests := b.fake.Requests()
	require.Len(t, requests, 2)
	key := requests[0].Header.Get("Idempotency-Key")
	require.Equal(t, key, requests[1].Header.Get("Idempotency-Key"))
	require.Equal(t, requests[0].Body, requests[1].Body, "byte-identical payloads")
	deliveries := b.fake.Deliveries()
	require.Len(t, deliveries, 1)
	return key, deliveries[0]
}

// deliveries counts postguard_email_deliveries_total{kind,outcome}, whatever the provider.
func (b *testBundle) deliveries(t *testing.T, kind, outcome string) float64 {
	t.Helper()

	return b.counter(t, "postguard_email_deliveries_total", map[string]string{"kind": kind, "outcome": outcome})
}

// counter sums the counters of family name whose labels include want.
func (b *testBundle) counter(t *testing.T, name string, want map[string]string) float64 {
	t.Helper()

	families, err := b.registry.Gather()
	require.NoError(t, err)
	sum := 0.0
	for _, family := range families {
		if family.GetName() != name {
			continue
		}
		for _, metric := range family.GetMetric() {
			labels := map[string]string{}
			for _, label := range metric.GetLabel() {
				labels[label.GetName()] = label.GetValue()
			}
			matches := true
			for k, v := range want {
				matches = matches && labels[k] == v
			}
			if matches {
				sum += metric.GetCounter().GetValue()
			}
		}
	}
	return sum
}

var userSeq atomic.Int64 //nolint:gochecknoglobals // unique emails across parallel tests

// createUser registers a user with a unique email.
func createUser(t *testing.T, store riverstore.Store) *db.User {
	t.Helper()

	n := userSeq.Add(1)
	user, err := store.UserInsert(t.Context(), &db.UserInsertParams{
		Email:        fmt.Sprintf("user%d@example.com", n),
		Name:         fmt.Sprintf("User %d", n),
		PasswordHash: "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA",
		Now:          time.Now(),
	})
	require.NoError(t, err)
	return user
}

// keyPattern is the form of every idempotency key: <kind>:<user_id>:<128 random bits, hex>.
func keyPattern(kind string, userID int64) *regexp.Regexp {
	return regexp.MustCompile(`^` + kind + `:` + strconv.FormatInt(userID, 10) + `:[0-9a-f]{32}$`)
}

// linkToken returns the token of the first link in text that starts with prefix.
func linkToken(t *testing.T, text, prefix string) string {
	t.Helper()

	match := regexp.MustCompile(regexp.QuoteMeta(prefix) + `([A-Za-z0-9_-]+)`).FindStringSubmatch(text)
	require.NotNil(t, match, "no link %s… in:\n%s", prefix, text)
	return match[1]
}

// senderFunc is a mail.Sender that calls a function.
type senderFunc func(ctx context.Context, msg *mail.Message) (string, error)

func (f senderFunc) Send(ctx context.Context, msg *mail.Message) (string, error) { return f(ctx, msg) }
