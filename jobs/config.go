// Package jobs holds postguard's River jobs: the transactional emails (welcome, verification,
// password reset) and the periodic prunes (prune, and prune_counters for the rate-limit
// counters), their retry policy, the shared send pacer, and
// NewRiverConfig, which assembles the whole River configuration of a postguard process. The
// tokens mailed in links are the tokens package's; the mail itself, jobs/mail's.
//
// A host app with its own River client uses the same jobs: NewWorkers on its db.Tables (their
// db.PartMail migrated), with Recipients reading its own users table, registered on its
// river.Workers (Workers.Register); it inserts WelcomeEmailArgs and the others with its own
// client's InsertTx, in the transaction that creates the user. postguard's own server is built the same way, on its users table
// (UserRecipients).
package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverlog"
	"github.com/riverqueue/river/rivertype"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/tokens"
)

// Queues.
const (
	// QueueEmail is the queue of the email jobs, worked by Config.EmailWorkers per process.
	QueueEmail = "email"
	// QueueMaintenance is the queue of the two prune jobs, each unique while in flight, worked
	// side by side (two workers), so that a long prune of finished jobs never holds the
	// counters' prune back.
	QueueMaintenance = "maintenance"
)

// Defaults of Config, the defaults of the environment variables too
// (README.md, Configuration).
const (
	DefaultEmailWorkers     = 10               // EMAIL_WORKERS
	DefaultJobTimeout       = 30 * time.Second // JOB_TIMEOUT
	DefaultRescueAfter      = 5 * time.Minute  // JOB_RESCUE_AFTER
	DefaultJobRetention     = 336 * time.Hour  // JOB_RETENTION
	DefaultCounterRetention = 24 * time.Hour   // COUNTER_RETENTION
	DefaultPruneInterval    = time.Hour        // PRUNE_INTERVAL
	// DefaultCounterPruneInterval is a minute: between two runs the counters table holds at most
	// a minute's fresh keys more than the admitted rate × (window + COUNTER_RETENTION), a
	// 1/1440 share of a day's retention (docs/operations.md, Sizing the counters table).
	DefaultCounterPruneInterval = time.Minute // COUNTER_PRUNE_INTERVAL
)

// DeviceRevocationMargin is how long past DeviceTokenTTL a revocation of trusted devices is kept:
// a token's expiry is judged by the clock of the process that reads it, and its issue time was
// stamped by another's, so the margin covers any skew between them (a day, far more than any).
const DeviceRevocationMargin = 24 * time.Hour

// EmailMaxAttempts is how many times an email job is tried before it is discarded (snoozes do
// not count): with RetryPolicy, about 0, 1, 3, 7 and 15 minutes after the first attempt.
const EmailMaxAttempts = 5

// Deps are the long-lived collaborators of the jobs.
type Deps struct {
	// Store holds postguard's tables the workers read and write (messages, tokens, the send
	// pacer, counters): a host app's db.Tables on its own pool or *sql.DB, or postguard's own
	// store. Required.
	Store db.Tables
	// Recipients give the workers each user's address, name and locale: a host app's own users
	// table. NewWorkers requires it; NewRiverConfig, postguard's own configuration, defaults it
	// to postguard's users table (UserRecipients(Store)).
	Recipients Recipients
	// Jobs is the River client prune deletes finished jobs through and the queue depth metric
	// counts with. NewRiverConfig requires it, as it turns River's own job cleaner off; for a
	// host app's workers (NewWorkers) nil leaves finished jobs to the host's River.
	Jobs RiverClient
	// Providers deliver mail, in failover order (MAILER=resend,smtp): an attempt goes to the
	// first whose circuit is closed, and on to the next after an outage that left the provider
	// without the mail (see Provider). None (and no Sender) means MAILER=none: the email queue is
	// not worked, and email jobs stay queued (nothing is lost) until a process with a provider
	// starts.
	Providers []Provider
	// Sender, when Providers is empty, is the one provider: named DefaultProviderName ("resend")
	// and paced at Config.MaxRPS, as postguard's one sender always was.
	Sender mail.Sender
	// Logger receives the workers' lines (and River's). Defaults to slog.Default().
	Logger *slog.Logger
	// Registerer, when not nil, gets postguard_email_deliveries_total and postguard_jobs.
	Registerer prometheus.Registerer
	// Renderer renders the mail (APP_NAME, MAIL_TEMPLATES_DIR, DEFAULT_LOCALE). nil means the
	// built-in templates, branded postguard, on Config.AppURL.
	Renderer *mail.Renderer
}

// RiverClient is what prune and the queue-depth metric use of River's client: any
// *river.Client[TTx] is one.
type RiverClient interface {
	JobList(ctx context.Context, params *river.JobListParams) (*river.JobListResult, error)
	JobDeleteMany(ctx context.Context, params *river.JobDeleteManyParams) (*river.JobDeleteManyResult, error)
}

// Config configures the jobs. Its values are taken as given, checked by the caller (postguard's
// own are checked once, where its environment is read); a zero duration or count takes its
// Default*.
type Config struct {
	// Secret is APP_SECRET: it keys the unsubscribe links' HMACs and, through HKDF, the sealing
	// of link tokens while their jobs may resend them. Required, at least tokens.MinSecretLen
	// bytes.
	Secret []byte
	// AppURL is the base of the links in mail (APP_URL), e.g. https://example.com.
	AppURL string
	// LoginURL is where the welcome mail's button goes (APP_LOGIN_URL): the app's sign-in
	// page. Default AppURL.
	LoginURL string
	// EmailWorkers is how many email jobs one process works at once (EMAIL_WORKERS).
	EmailWorkers int
	// JobTimeout bounds one attempt of a job (JOB_TIMEOUT).
	JobTimeout time.Duration
	// RescueAfter is how long a job may stay running before it is thought abandoned (its worker
	// died) and retried (JOB_RESCUE_AFTER); it must exceed JobTimeout.
	RescueAfter time.Duration
	// JobRetention is how long finished jobs (completed, cancelled, discarded) and their message
	// rows are kept (JOB_RETENTION). A welcome job is unique for as long as it is kept.
	JobRetention time.Duration
	// CounterRetention is how long rate-limit counters are kept after their window ends, and
	// email tokens after they expire (COUNTER_RETENTION).
	CounterRetention time.Duration
	// DeviceTokenTTL is the life of a trusted-device token (DEVICE_TOKEN_TTL,
	// abuse.DefaultDeviceTokenTTL when zero): prune keeps a revocation of devices until every
	// token it revoked has expired, DeviceTokenTTL and DeviceRevocationMargin after it.
	DeviceTokenTTL time.Duration
	// PruneInterval is the period of the prune job (PRUNE_INTERVAL).
	PruneInterval time.Duration
	// CounterPruneInterval is the period of the prune_counters job (COUNTER_PRUNE_INTERVAL),
	// which deletes the rate-limit counters past CounterRetention.
	CounterPruneInterval time.Duration
	// MaxRPS is the most sends per second through Deps.Sender, all worker processes together
	// (RESEND_MAX_RPS); 0 (or a rate so high that its slots would be under a microsecond apart)
	// sends unpaced. Deps.Providers carry their own.
	MaxRPS float64
	// CircuitCooldown is how long a provider's circuit stays open after an outage before the
	// provider is tried in its turn again. Defaults to DefaultCircuitCooldown.
	CircuitCooldown time.Duration
	// FetchCooldown and FetchPollInterval tune River's fetch loop; zero takes River's defaults
	// (100ms, 1s).
	FetchCooldown, FetchPollInterval time.Duration
	// InsertOnly builds a config for a process that inserts jobs but works none (postguard api):
	// workers registered (so River checks kinds at insert) but no queues and no periodic jobs.
	InsertOnly bool
	// NowFunc returns the current time. Defaults to time.Now. Tests stub it.
	NowFunc func() time.Time
}

// withDefaults returns a copy of c with defaults applied.
func (c *Config) withDefaults() *Config {
	out := *c
	out.EmailWorkers = cmp.Or(out.EmailWorkers, DefaultEmailWorkers)
	out.JobTimeout = cmp.Or(out.JobTimeout, DefaultJobTimeout)
	out.RescueAfter = cmp.Or(out.RescueAfter, DefaultRescueAfter)
	out.JobRetention = cmp.Or(out.JobRetention, DefaultJobRetention)
	out.CounterRetention = cmp.Or(out.CounterRetention, DefaultCounterRetention)
	out.PruneInterval = cmp.Or(out.PruneInterval, DefaultPruneInterval)
	out.CounterPruneInterval = cmp.Or(out.CounterPruneInterval, DefaultCounterPruneInterval)
	out.CircuitCooldown = cmp.Or(out.CircuitCooldown, DefaultCircuitCooldown)
	out.DeviceTokenTTL = cmp.Or(out.DeviceTokenTTL, abuse.DefaultDeviceTokenTTL)
	out.AppURL = strings.TrimRight(out.AppURL, "/")
	if out.NowFunc == nil {
		out.NowFunc = time.Now
	}
	return &out
}

// Workers are postguard's River workers, built by NewWorkers for one store and configuration.
type Workers struct {
	WelcomeEmail       *WelcomeEmailWorker
	VerificationEmail  *VerificationEmailWorker
	PasswordResetEmail *PasswordResetEmailWorker
	Prune              *PruneWorker
	PruneCounters      *PruneCountersWorker
}

// NewWorkers builds the workers of deps and config, to Register on a River registry: postguard's
// own, or a host app's, whose River client then works them and whose InsertTx inserts their jobs
// (WelcomeEmailArgs and the others) in its own transactions. They use deps only when they work a
// job, so they may be built before the River client that works them exists.
func NewWorkers(deps *Deps, config *Config) (*Workers, error) {
	if deps == nil || deps.Store == nil {
		return nil, errors.New("jobs: Deps.Store is required")
	}
	if deps.Recipients == nil {
		return nil, errors.New("jobs: Deps.Recipients is required (jobs.UserRecipients for postguard's users table)")
	}
	if config == nil {
		config = &Config{}
	}
	config = config.withDefaults()

	if err := tokens.CheckSecret(config.Secret); err != nil {
		return nil, fmt.Errorf("jobs: Config.Secret (APP_SECRET): %w", err)
	}
	sealer, err := tokens.NewSealer(config.Secret)
	if err != nil {
		return nil, err
	}
	metrics, err := newMetrics(deps.Registerer)
	if err != nil {
		return nil, err
	}
	providers, err := newProviders(deps, config, deps.Store)
	if err != nil {
		return nil, err
	}
	for _, p := range providers {
		metrics.circuit(p.name, false)
	}
	logger := cmp.Or(deps.Logger, slog.Default())
	renderer := deps.Renderer
	if renderer == nil {
		if renderer, err = mail.NewRenderer(&mail.RendererConfig{AppURL: config.AppURL}); err != nil {
			return nil, fmt.Errorf("jobs: the built-in mail renderer: %w", err)
		}
	}

	m := &mailer{
		jobTimeout: config.JobTimeout,
		links:      &linkBuilder{appURL: config.AppURL, loginURL: cmp.Or(config.LoginURL, config.AppURL), secret: config.Secret},
		logger:     logger,
		metrics:    metrics,
		nowFunc:    config.NowFunc,
		providers:  providers,
		recipients: deps.Recipients,
		renderer:   renderer,
		sealer:     sealer,
		store:      deps.Store,
	}
	return &Workers{
		WelcomeEmail:       &WelcomeEmailWorker{emailWorker[WelcomeEmailArgs]{mailer: m, spec: welcomeEmail}},
		VerificationEmail:  &VerificationEmailWorker{emailWorker[VerificationEmailArgs]{mailer: m, spec: verificationEmail}},
		PasswordResetEmail: &PasswordResetEmailWorker{emailWorker[PasswordResetEmailArgs]{mailer: m, spec: passwordResetEmail}},
		Prune:              newPruneWorker(deps.Store, deps.Jobs, logger, config),
		PruneCounters:      newPruneCountersWorker(deps.Store, logger, config),
	}, nil
}

// Register adds the workers to a River registry: postguard's own, or a host app's.
func (w *Workers) Register(workers *river.Workers) error {
	if err := errors.Join(
		river.AddWorkerSafely(workers, w.WelcomeEmail),
		river.AddWorkerSafely(workers, w.VerificationEmail),
		river.AddWorkerSafely(workers, w.PasswordResetEmail),
		river.AddWorkerSafely(workers, w.Prune),
		river.AddWorkerSafely(workers, w.PruneCounters),
	); err != nil {
		return fmt.Errorf("error registering workers: %w", err)
	}
	return nil
}

// NewRiverConfig builds the whole River configuration of a postguard process (a host app builds
// its own, with NewWorkers): the five workers;
// the queues (email with config.EmailWorkers, maintenance with 2) and the periodic prunes (prune
// every PruneInterval, prune_counters every CounterPruneInterval, both run on start, leader only)
// unless config.InsertOnly; RetryPolicy; JobTimeout;
// RescueStuckJobsAfter; River's job cleaner switched off (all three retentions -1, so prune is the
// one retention policy); riverlog's middleware (a worker's lines show on its job in River UI);
// the fetch tuning; the logger. With deps.Sender nil the email queue is left out: email jobs stay
// queued. The caller may still set fields this package does not own, such as SoftStopTimeout
// (SHUTDOWN_TIMEOUT). It also registers the queue depth metric on deps.Registerer.
func NewRiverConfig(deps *Deps, config *Config) (*river.Config, error) {
	if config == nil {
		config = &Config{}
	}
	config = config.withDefaults()
	if deps == nil || deps.Store == nil {
		return nil, errors.New("jobs: Deps.Store is required")
	}
	if deps.Jobs == nil {
		return nil, errors.New("jobs: Deps.Jobs is required: River's job cleaner is off, and prune deletes finished jobs through it")
	}
	if deps.Recipients == nil {
		withUsers := *deps
		withUsers.Recipients = UserRecipients(deps.Store)
		deps = &withUsers
	}
	workers, err := NewWorkers(deps, config)
	if err != nil {
		return nil, err
	}
	registry := river.NewWorkers()
	if err := workers.Register(registry); err != nil {
		return nil, err
	}
	logger := cmp.Or(deps.Logger, slog.Default())

	if deps.Registerer != nil {
		if err := deps.Registerer.Register(newQueueDepthCollector(deps.Jobs, logger)); err != nil {
			var already prometheus.AlreadyRegisteredError
			if !errors.As(err, &already) {
				return nil, fmt.Errorf("error registering queue depth metric: %w", err)
			}
		}
	}

	riverConfig := &river.Config{
		// River's job cleaner is off: prune is the one retention policy (JOB_RETENTION), and it
		// goes through River's public JobDeleteMany.
		CancelledJobRetentionPeriod: -1,
		CompletedJobRetentionPeriod: -1,
		DiscardedJobRetentionPeriod: -1,
		FetchCooldown:               config.FetchCooldown,
		FetchPollInterval:           config.FetchPollInterval,
		JobTimeout:                  config.JobTimeout,
		Logger:                      logger,
		Middleware:                  []rivertype.Middleware{NewRiverlogMiddleware()},
		RescueStuckJobsAfter:        config.RescueAfter,
		RetryPolicy:                 &RetryPolicy{NowFunc: config.NowFunc},
		Workers:                     registry,
	}
	if config.InsertOnly {
		return riverConfig, nil
	}

	riverConfig.Queues = map[string]river.QueueConfig{
		QueueMaintenance: {MaxWorkers: 2},
	}
	if deps.Sender != nil || len(deps.Providers) > 0 {
		riverConfig.Queues[QueueEmail] = river.QueueConfig{MaxWorkers: config.EmailWorkers}
	} else {
		logger.Warn("no mailer configured (MAILER=none): email jobs stay queued until a worker with a mailer starts; set RESEND_API_KEY or MAILER=log")
	}
	riverConfig.PeriodicJobs = []*river.PeriodicJob{
		river.NewPeriodicJob(
			river.PeriodicInterval(config.PruneInterval),
			func() (river.JobArgs, *river.InsertOpts) { return PruneArgs{}, nil },
			&river.PeriodicJobOpts{ID: PruneArgs{}.Kind(), RunOnStart: true},
		),
		river.NewPeriodicJob(
			river.PeriodicInterval(config.CounterPruneInterval),
			func() (river.JobArgs, *river.InsertOpts) { return PruneCountersArgs{}, nil },
			&river.PeriodicJobOpts{ID: PruneCountersArgs{}.Kind(), RunOnStart: true},
		),
	}
	return riverConfig, nil
}

// NewRiverlogMiddleware is riverlog's middleware as postguard installs it: a worker's log lines,
// as text, on its job, where River UI shows them. Workers never log a secret (no raw token or
// address); the log mailer, which prints mail, writes to the process log only.
func NewRiverlogMiddleware() rivertype.Middleware {
	return riverlog.NewMiddleware(func(w io.Writer) slog.Handler {
		return slog.NewTextHandler(w, nil)
	}, nil)
}
