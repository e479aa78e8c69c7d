// Package jobs holds postguard's River jobs: the transactional emails (welcome, verification,
// password reset) and the periodic prune, their retry policy, the shared send pacer, and
// NewRiverConfig, which assembles the whole River configuration. The tokens mailed in links are
// jobs/tokens'.
package jobs

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverlog"
	"github.com/riverqueue/river/rivertype"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/jobs/tokens"
)

// Queues.
const (
	// QueueEmail is the queue of the email jobs, worked by Config.EmailWorkers per process.
	QueueEmail = "email"
	// QueueMaintenance is the queue of the prune job, worked one at a time.
	QueueMaintenance = "maintenance"
)

// Defaults of Config, the same as DESIGN.md's environment variables.
const (
	DefaultEmailWorkers     = 10               // EMAIL_WORKERS
	DefaultJobTimeout       = 30 * time.Second // JOB_TIMEOUT
	DefaultRescueAfter      = 5 * time.Minute  // JOB_RESCUE_AFTER
	DefaultJobRetention     = 336 * time.Hour  // JOB_RETENTION
	DefaultCounterRetention = 24 * time.Hour   // COUNTER_RETENTION
	DefaultPruneInterval    = time.Hour        // PRUNE_INTERVAL
)

// EmailMaxAttempts is how many times an email job is tried before it is discarded (snoozes do
// not count): with RetryPolicy, about 0, 1, 3, 7 and 15 minutes after the first attempt.
const EmailMaxAttempts = 5

// MinSecretLen is the shortest Config.Secret accepted (APP_SECRET).
const MinSecretLen = 32

// Deps are the long-lived collaborators of the jobs.
type Deps struct {
	// Store is the database; its River client (Store.River) is used by prune and by the queue
	// depth metric, so call Store.ConfigureRiver with the result of NewRiverConfig.
	Store db.Store
	// Sender delivers mail. nil means MAILER=none: the email queue is not worked, and email jobs
	// stay queued (nothing is lost) until a process with a sender starts.
	Sender mail.Sender
	// Logger receives the workers' lines (and River's). Defaults to slog.Default().
	Logger *slog.Logger
	// Registerer, when not nil, gets postguard_email_deliveries_total and postguard_jobs.
	Registerer prometheus.Registerer
}

// Config configures the jobs. A zero duration or worker count takes its default (the Default*
// constants); a negative one is an error naming its environment variable.
type Config struct {
	// Secret is APP_SECRET, at least MinSecretLen bytes: it keys the unsubscribe links' HMACs and,
	// through HKDF, the sealing of link tokens while their jobs may resend them.
	Secret []byte
	// AppURL is the base of the links in mail (APP_URL), http or https, e.g. https://example.com.
	AppURL string
	// EmailWorkers is how many email jobs one process works at once (EMAIL_WORKERS).
	EmailWorkers int
	// JobTimeout bounds one attempt of a job (JOB_TIMEOUT).
	JobTimeout time.Duration
	// RescueAfter is how long a job may stay running before it is thought abandoned (its worker
	// died) and retried (JOB_RESCUE_AFTER); must exceed JobTimeout.
	RescueAfter time.Duration
	// JobRetention is how long finished jobs (completed, cancelled, discarded) are kept
	// (JOB_RETENTION). A welcome job is unique for as long as it is kept.
	JobRetention time.Duration
	// CounterRetention is how long rate-limit counters are kept after their window ends, and
	// email tokens after they expire (COUNTER_RETENTION).
	CounterRetention time.Duration
	// PruneInterval is the period of the prune job (PRUNE_INTERVAL); at least a second.
	PruneInterval time.Duration
	// MaxRPS is the most sends per second, all worker processes together (RESEND_MAX_RPS);
	// 0 sends unpaced.
	MaxRPS float64
	// FetchCooldown and FetchPollInterval tune River's fetch loop; zero takes River's defaults
	// (100ms, 1s). Tests shorten them.
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
	out.AppURL = strings.TrimRight(out.AppURL, "/")
	if out.NowFunc == nil {
		out.NowFunc = time.Now
	}
	return &out
}

// Validate reports the first bad value, naming its environment variable. It checks the values
// as given, with zero meaning the default.
func (c *Config) Validate() error {
	if len(c.Secret) < MinSecretLen {
		return fmt.Errorf("APP_SECRET must be at least %d bytes (got %d): generate one with `openssl rand -hex 32`", MinSecretLen, len(c.Secret))
	}
	u, err := url.Parse(c.AppURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("APP_URL must be an absolute http(s) URL without query or fragment, like https://example.com (got %q)", c.AppURL)
	}
	if c.EmailWorkers < 0 || c.EmailWorkers > river.QueueNumWorkersMax {
		return fmt.Errorf("EMAIL_WORKERS must be between 1 and %d (got %d)", river.QueueNumWorkersMax, c.EmailWorkers)
	}
	for _, d := range []struct {
		env   string
		value time.Duration
	}{
		{"JOB_TIMEOUT", c.JobTimeout},
		{"JOB_RESCUE_AFTER", c.RescueAfter},
		{"JOB_RETENTION", c.JobRetention},
		{"COUNTER_RETENTION", c.CounterRetention},
		{"PRUNE_INTERVAL", c.PruneInterval},
	} {
		if d.value < 0 {
			return fmt.Errorf("%s must be a positive duration like 30s or 1h (got %s)", d.env, d.value)
		}
	}
	withDefaults := c.withDefaults()
	if withDefaults.RescueAfter <= withDefaults.JobTimeout {
		return fmt.Errorf("JOB_RESCUE_AFTER (%s) must exceed JOB_TIMEOUT (%s), or running jobs would be rescued and run twice", withDefaults.RescueAfter, withDefaults.JobTimeout)
	}
	if withDefaults.PruneInterval < time.Second {
		return fmt.Errorf("PRUNE_INTERVAL must be at least 1s (got %s)", c.PruneInterval)
	}
	if c.MaxRPS < 0 || math.IsNaN(c.MaxRPS) || math.IsInf(c.MaxRPS, 0) {
		return fmt.Errorf("RESEND_MAX_RPS must be a number of sends per second, 0 for unpaced (got %v)", c.MaxRPS)
	}
	if c.MaxRPS > 0 && pacerInterval(c.MaxRPS) < time.Microsecond {
		return fmt.Errorf("RESEND_MAX_RPS is too high (got %v); use 0 for unpaced", c.MaxRPS)
	}
	if c.FetchCooldown < 0 || c.FetchPollInterval < 0 {
		return errors.New("FetchCooldown and FetchPollInterval cannot be negative")
	}
	return nil
}

// NewRiverConfig builds the whole River configuration of a postguard process: the four workers;
// the queues (email with config.EmailWorkers, maintenance with 1) and the periodic prune (every
// PruneInterval, run on start, leader only) unless config.InsertOnly; RetryPolicy; JobTimeout;
// RescueStuckJobsAfter; River's job cleaner switched off (all three retentions -1, so prune is the
// one retention policy); riverlog's middleware (a worker's lines show on its job in River UI);
// the fetch tuning; the logger. With deps.Sender nil the email queue is left out, with a
// warning: email jobs stay queued. Pass the result to deps.Store.ConfigureRiver; the caller may
// still set fields this package does not own, such as SoftStopTimeout (SHUTDOWN_TIMEOUT).
func NewRiverConfig(deps *Deps, config *Config) (*river.Config, error) {
	if deps == nil || deps.Store == nil {
		return nil, errors.New("jobs: Deps.Store is required")
	}
	if config == nil {
		config = &Config{}
	}
	if err := config.Validate(); err != nil {
		return nil, err
	}
	config = config.withDefaults()

	logger := deps.Logger
	if logger == nil {
		logger = slog.Default()
	}

	metrics, err := newMetrics(deps.Registerer)
	if err != nil {
		return nil, err
	}
	if deps.Registerer != nil {
		if err := deps.Registerer.Register(newQueueDepthCollector(deps.Store, logger)); err != nil {
			var already prometheus.AlreadyRegisteredError
			if !errors.As(err, &already) {
				return nil, fmt.Errorf("error registering queue depth metric: %w", err)
			}
		}
	}

	sealer, err := tokens.NewSealer(config.Secret)
	if err != nil {
		return nil, err
	}
	deliverer := &emailDeliverer{
		jobTimeout: config.JobTimeout,
		logger:     logger,
		metrics:    metrics,
		nowFunc:    config.NowFunc,
		pacer:      newPacer(deps.Store, config.MaxRPS),
		sealer:     sealer,
		sender:     deps.Sender,
		store:      deps.Store,
	}
	links := &linkBuilder{appURL: config.AppURL, secret: config.Secret}

	workers := river.NewWorkers()
	if err := errors.Join(
		river.AddWorkerSafely(workers, &WelcomeEmailWorker{deliverer: deliverer, links: links}),
		river.AddWorkerSafely(workers, &VerificationEmailWorker{deliverer: deliverer, links: links}),
		river.AddWorkerSafely(workers, &PasswordResetEmailWorker{deliverer: deliverer, links: links}),
		river.AddWorkerSafely(workers, newPruneWorker(deps.Store, logger, config)),
	); err != nil {
		return nil, fmt.Errorf("error registering workers: %w", err)
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
		Middleware: []rivertype.Middleware{
			riverlog.NewMiddleware(func(w io.Writer) slog.Handler {
				return slog.NewTextHandler(w, nil)
			}, nil),
		},
		RescueStuckJobsAfter: config.RescueAfter,
		RetryPolicy:          &RetryPolicy{NowFunc: config.NowFunc},
		Workers:              workers,
	}
	if config.InsertOnly {
		return riverConfig, nil
	}

	riverConfig.Queues = map[string]river.QueueConfig{
		QueueMaintenance: {MaxWorkers: 1},
	}
	if deps.Sender != nil {
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
	}
	return riverConfig, nil
}
