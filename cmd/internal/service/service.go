package service

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"riverqueue.com/riverui"
	"riverqueue.com/riverui/uiendpoints"

	"github.com/postguard/postguard/api"
	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/api/abuse/abuseprom"
	"github.com/postguard/postguard/cmd/internal/telemetry"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/postgres"
	"github.com/postguard/postguard/db/sqlite"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs"
	"github.com/postguard/postguard/jobs/mail"
)

// Role is what a process does: serve is api and worker in one.
type Role string

// Roles.
const (
	RoleServe  Role = "serve"
	RoleAPI    Role = "api"
	RoleWorker Role = "worker"
)

// Works says the role works jobs.
func (r Role) Works() bool { return r != RoleAPI }

// Serves says the role serves the API (a worker serves health and metrics only).
func (r Role) Serves() bool { return r != RoleWorker }

// Opts are what a caller may give New beyond the Config. A nil *Opts is fine.
type Opts struct {
	// Sender replaces the mailers Config.Mailers name (the load tool's no-op sender).
	Sender mail.Sender
	// SMTPTLSConfig, when set, is the TLS configuration of the SMTP sender (the root CA of a
	// test server's certificate); nil verifies the server against the system's roots.
	SMTPTLSConfig *tls.Config
	// APIConfigFunc makes last changes to the API's config before its router is built (the load
	// tool's hash concurrency; tests' short request timeouts).
	APIConfigFunc func(config *api.Config)
	// RiverConfigFunc makes last changes to the River config before the client is built (the
	// load tool's fetch tuning).
	RiverConfigFunc func(config *river.Config)
	// Telemetry is the process's tracing (telemetry.New), handed to each part that makes spans:
	// the HTTP router, the limiter, River's middleware, the database engine, the providers, the
	// logger. nil, or tracing off, installs none of it. The caller shuts it down, after HTTP and
	// River have drained.
	Telemetry *telemetry.Telemetry
}

// Service is one postguard process, built and not yet running: its store (River's client
// included, not started) and the HTTP handler of its role.
type Service struct {
	Config   *Config
	Logger   *slog.Logger
	Role     Role
	Store    riverstore.Store
	Registry *prometheus.Registry
	// Handler is the role's HTTP handler: the API (with River UI when configured), or health
	// and metrics only for a worker.
	Handler http.Handler
	// MetricsHandler serves /metrics on METRICS_ADDR, for the roles that serve the public API
	// (its delivery counts by kind would tell anyone which addresses have accounts); nil for a
	// worker, which serves /metrics on HTTP_ADDR, and when METRICS_ADDR is off.
	MetricsHandler http.Handler
	// Mailer names the mailers in use, for the start line: MAILER's list ("resend,smtp"), or
	// "custom" for Opts.Sender.
	Mailer string
	// DevMail is the log mailer's outbox, which the API serves at /dev/mail: set for `serve` with
	// MAILER=log on a loopback APP_URL (see DevMailServed), nil otherwise.
	DevMail *mail.Outbox

	// riverUIEndpoints is River UI's API on the store's River client.
	riverUIEndpoints func() uiendpoints.Bundle
	stopUI           context.CancelFunc
	// lite is the embedded engine under Store; nil on PostgreSQL.
	lite *sqlite.Engine
	// telemetry is Opts.Telemetry; nil when none was given.
	telemetry *telemetry.Telemetry
}

// New builds the process of role from config: it opens the engine, takes the secret (on the
// embedded default, the one kept beside the database), builds the store and its River client with
// postguard's workers, migrates the embedded default (on PostgreSQL it checks the schema and
// refuses to run behind it), checks the secret against the one the database was made with
// (CheckSecret), and builds the role's handler. Close releases what it made.
func New(ctx context.Context, config *Config, logger *slog.Logger, role Role, opts *Opts) (_ *Service, err error) {
	if opts == nil {
		opts = &Opts{}
	}
	tel := opts.Telemetry
	logger = tel.Logger(logger)
	if role != RoleServe && config.Engine == EngineSQLite {
		return nil, fmt.Errorf("`postguard %s` needs PostgreSQL (DATABASE_URL=postgres://…): the embedded SQLite database belongs to one process; use `postguard serve`", role)
	}

	providers, mailer := []jobs.Provider(nil), "custom"
	var devMail *mail.Outbox
	if opts.Sender != nil {
		providers = []jobs.Provider{{Name: mailer, Sender: tel.Sender(mailer, opts.Sender), MaxRPS: config.ResendMaxRPS}}
	} else {
		if providers, devMail, err = newProviders(config, logger, role, opts); err != nil {
			return nil, err
		}
		mailer = cmp.Or(strings.Join(config.Mailers, ","), MailerNone)
	}
	if role.Works() && len(providers) == 0 {
		logger.WarnContext(ctx, "MAILER=none: email jobs stay queued until a mailer is configured; nothing is lost")
	}
	if role.Works() && config.SMTPURL != nil && config.SMTPURL.Scheme == mail.SMTPSchemeInsecure && slices.Contains(config.Mailers, MailerSMTP) {
		logger.WarnContext(ctx, "SMTP_URL is smtp+insecure://: mail crosses the network to the relay unencrypted; use it for a relay on this host or a private network only",
			slog.String("smtp_url", config.SMTPURL.Redacted()))
	}
	if role.Works() && config.Renderer != nil {
		for _, warning := range config.Renderer.Warnings() {
			logger.WarnContext(ctx, "MAIL_TEMPLATES_DIR: "+warning)
		}
	}

	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	s := &Service{Config: config, Logger: logger, Role: role, Registry: registry, Mailer: mailer, DevMail: devMail, telemetry: tel}
	secret, err := s.open(ctx, true, func(store riverstore.Store, secret []byte) (*river.Config, error) {
		riverConfig, err := jobs.NewRiverConfig(
			&jobs.Deps{
				Store:      store,
				Recipients: jobs.UserRecipients(store), // postguard's own users table
				Jobs:       store.Jobs(),
				Providers:  providers,
				Logger:     logger,
				Registerer: registry,
				Renderer:   config.Renderer,
			},
			&jobs.Config{
				Secret:               secret,
				AppURL:               config.AppURL,
				LoginURL:             config.LoginURL,
				EmailWorkers:         config.EmailWorkers,
				JobTimeout:           config.JobTimeout,
				RescueAfter:          config.JobRescueAfter,
				JobRetention:         config.JobRetention,
				CounterRetention:     config.CounterRetention,
				DeviceTokenTTL:       config.DeviceTokenTTL,
				PruneInterval:        config.PruneInterval,
				CounterPruneInterval: config.CounterPruneInterval,
				MaxRPS:               config.ResendMaxRPS,
				FetchCooldown:        config.FetchCooldown,
				FetchPollInterval:    config.FetchPollInterval,
				InsertOnly:           !role.Works(),
			})
		if err != nil {
			return nil, err
		}
		// A job still running SHUTDOWN_TIMEOUT after SIGTERM has its context cancelled; it
		// returns context.Canceled and River puts it back without spending an attempt.
		riverConfig.SoftStopTimeout = config.ShutdownTimeout
		// Tracing's middleware goes first, so that an attempt's span holds riverlog's work too.
		riverConfig.Middleware = append(tel.RiverMiddleware(), riverConfig.Middleware...)
		if opts.RiverConfigFunc != nil {
			opts.RiverConfigFunc(riverConfig)
		}
		return riverConfig, nil
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()

	if config.Engine == EngineSQLite {
		// The embedded default needs no set-up: it migrates itself.
		if err := s.Store.Migrate(ctx); err != nil {
			return nil, fmt.Errorf("error migrating SQLite database %s: %w", config.SQLitePath, err)
		}
	} else if err := s.Store.CheckSchema(ctx); err != nil {
		return nil, err
	}
	// Every role checks its secret against the database's before it does anything with it; the
	// first to start records it, should nothing have yet.
	if err := CheckSecret(ctx, s.Store, secret, SecretSource(config)); err != nil {
		return nil, err
	}

	if s.Handler, err = s.handler(secret, opts); err != nil {
		return nil, err
	}
	if role.Serves() && config.MetricsAddr != "" {
		if s.MetricsHandler, err = api.MetricsRouter(&api.Config{Logger: logger, Registerer: registry, Gatherer: registry}); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// OpenStore opens the store DATABASE_URL names with an insert-only River client, for work that
// needs no workers and no secret (the load tool's own statements). Close the store when done.
func OpenStore(ctx context.Context, config *Config, logger *slog.Logger) (riverstore.Store, error) {
	s := &Service{Config: config, Logger: logger}
	if _, err := s.open(ctx, false, nil); err != nil {
		return nil, err
	}
	return s.Store, nil
}

// open opens the engine and builds s.Store on it, with the River config riverConfigFunc returns
// given the store and the secret (nil: an insert-only client), and returns the secret when
// withSecret: APP_SECRET, or the embedded default's own (made for a new database; a lost one is
// refused, see sqlite.Engine.AppSecret).
func (s *Service) open(ctx context.Context, withSecret bool, riverConfigFunc func(store riverstore.Store, secret []byte) (*river.Config, error)) ([]byte, error) {
	config := s.Config
	secret := config.AppSecret
	var newStore func(storeConfig *riverstore.Config) (riverstore.Store, error)
	switch config.Engine {
	case EnginePostgres:
		pg, err := postgres.NewEngine(ctx, config.DatabaseURL, &postgres.Config{Logger: s.Logger, Tracer: s.telemetry.PgxTracer()})
		if err != nil {
			return nil, fmt.Errorf("error connecting to PostgreSQL (DATABASE_URL): %w", err)
		}
		newStore = func(storeConfig *riverstore.Config) (riverstore.Store, error) {
			return openStore(s, pg, riverpgxv5.New(pg.Pool()), storeConfig)
		}
	default:
		lite, err := sqlite.NewEngine(ctx, config.SQLitePath, &sqlite.Config{Logger: s.Logger, Tracer: s.telemetry.SQLiteTracer()})
		if err != nil {
			return nil, fmt.Errorf("error opening SQLite database %s (DATABASE_URL): %w", config.SQLitePath, err)
		}
		if secret == nil && withSecret {
			if secret, err = lite.AppSecret(ctx); err != nil {
				lite.Close()
				if errors.Is(err, sqlite.ErrSecretFileMissing) {
					return nil, secretFileMissing(config)
				}
				return nil, err
			}
		}
		s.lite = lite
		newStore = func(storeConfig *riverstore.Config) (riverstore.Store, error) {
			return openStore(s, lite, riversqlite.New(lite.DB()), storeConfig)
		}
	}

	storeConfig := &riverstore.Config{Logger: s.Logger}
	if riverConfigFunc != nil {
		storeConfig.RiverConfigFunc = func(store riverstore.Store) (*river.Config, error) { return riverConfigFunc(store, secret) }
	}
	store, err := newStore(storeConfig) // closes the engine when it fails
	if err != nil {
		return nil, err
	}
	s.Store = store
	return secret, nil
}

// openStore builds s's store on engine, with River's driver on the engine's connections, and River
// UI's endpoints on its client.
func openStore[TTx any](s *Service, engine db.Engine[TTx], driver riverdriver.Driver[TTx], config *riverstore.Config) (riverstore.Store, error) {
	store, client, err := riverstore.New(engine, driver, config)
	if err != nil {
		return nil, err
	}
	s.riverUIEndpoints = func() uiendpoints.Bundle { return riverui.NewEndpoints(client, nil) }
	return store, nil
}

// handler builds the role's HTTP handler.
func (s *Service) handler(secret []byte, opts *Opts) (http.Handler, error) {
	config := s.Config
	if !s.Role.Serves() {
		return api.HealthRouter(&api.Config{Store: s.Store, Logger: s.Logger, Registerer: s.Registry, Gatherer: s.Registry})
	}

	var riverUI http.Handler
	if config.RiverUIUsername != "" {
		ui, err := riverui.NewHandler(&riverui.HandlerOpts{
			Endpoints: s.riverUIEndpoints(),
			Logger:    s.Logger,
			Prefix:    "/riverui",
		})
		if err != nil {
			return nil, fmt.Errorf("error creating River UI: %w", err)
		}
		// River UI's background services (its job count caches) query the store: they run until
		// Close, not until SIGTERM, as requests still draining may use them.
		uiCtx, stopUI := context.WithCancel(context.Background())
		if err := ui.Start(uiCtx); err != nil {
			stopUI()
			return nil, fmt.Errorf("error starting River UI: %w", err)
		}
		s.stopUI, riverUI = stopUI, ui
	}

	limiterMetrics, err := abuseprom.Register(s.Registry)
	if err != nil {
		return nil, err
	}
	limiter, err := abuse.NewLimiter(s.Store, secret, config.Rules, &abuse.LimiterConfig{
		DeviceTokenTTL: config.DeviceTokenTTL,
		Metrics:        limiterMetrics,
		Tracer:         s.telemetry.LimiterTracer(),
	})
	if err != nil {
		return nil, err
	}
	apiConfig := &api.Config{
		Store:           s.Store,
		Limiter:         limiter,
		IPResolver:      abuse.NewIPResolver(config.TrustedProxies).WithHeader(config.ClientIPHeader),
		Secret:          secret,
		AppURL:          config.AppURL,
		AppName:         config.AppName,
		Renderer:        config.Renderer,
		Logger:          s.Logger,
		Registerer:      s.Registry,
		Gatherer:        s.Registry,
		RiverUI:         riverUI,
		RiverUIUsername: config.RiverUIUsername,
		RiverUIPassword: config.RiverUIPassword,
		LimitsToken:     config.LimitsToken,
		DevMail:         s.DevMail,

		ResendWebhookSecret: config.ResendWebhookSecret,
		AdminToken:          config.AdminToken,
		TracerProvider:      s.telemetry.TracerProvider(),
	}
	if opts.APIConfigFunc != nil {
		opts.APIConfigFunc(apiConfig)
	}
	return api.New(apiConfig)
}

// Close stops River UI's services and closes the store. Stop River first.
func (s *Service) Close() error {
	if s.stopUI != nil {
		s.stopUI()
	}
	if s.Store == nil {
		return nil
	}
	return s.Store.Close()
}

// NewHTTPServer is the HTTP server of a process: handler behind read-header, read, write and
// idle timeouts, its errors logged at warning level.
func NewHTTPServer(handler http.Handler, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// newProviders builds the providers MAILER names, in its order; none for none. The log mailer of
// `serve` keeps its mail in an outbox for /dev/mail when DevMailServed says so.
func newProviders(config *Config, logger *slog.Logger, role Role, opts *Opts) ([]jobs.Provider, *mail.Outbox, error) {
	var (
		providers []jobs.Provider
		outbox    *mail.Outbox
	)
	for _, name := range config.Mailers {
		switch name {
		case MailerResend:
			sender, err := mail.NewResendSender(&mail.ResendConfig{
				APIKey:     config.ResendAPIKey,
				From:       config.MailFrom,
				BaseURL:    config.ResendBaseURL,
				Timeout:    config.JobTimeout,
				HTTPClient: opts.Telemetry.HTTPClient(),
			})
			if err != nil {
				return nil, nil, fmt.Errorf("error creating Resend sender: %w", err)
			}
			providers = append(providers, jobs.Provider{Name: name, Sender: opts.Telemetry.Sender(name, sender), MaxRPS: config.ResendMaxRPS})
		case MailerSMTP:
			sender, err := mail.NewSMTPSender(&mail.SMTPConfig{
				URL:       config.SMTPURL,
				From:      config.MailFrom,
				TLSConfig: opts.SMTPTLSConfig,
				Timeout:   config.JobTimeout,
			})
			if err != nil {
				return nil, nil, fmt.Errorf("error creating SMTP sender: %w", err)
			}
			providers = append(providers, jobs.Provider{Name: name, Sender: opts.Telemetry.Sender(name, sender), MaxRPS: config.SMTPMaxRPS})
		case MailerLog:
			var sender *mail.LogSender
			switch {
			case role != RoleServe:
				sender = mail.NewLogSender(logger, nil)
			case !DevMailServed(config.AppURL):
				logger.Warn("/dev/mail is not served: APP_URL is not a loopback address, and /dev/mail would show every mail's links to whoever asks; the log mailer prints whole mails instead",
					slog.String("app_url", config.AppURL))
				sender = mail.NewLogSender(logger, nil)
			default:
				outbox = mail.NewOutbox(mail.DefaultOutboxSize)
				sender = mail.NewLogSender(logger, &mail.LogSenderConfig{Outbox: outbox, DevMailURL: config.AppURL + "/dev/mail"})
			}
			providers = append(providers, jobs.Provider{Name: name, Sender: opts.Telemetry.Sender(name, sender), MaxRPS: config.ResendMaxRPS})
		default:
			return nil, nil, fmt.Errorf("no mailer %q", name)
		}
	}
	return providers, outbox, nil
}

// DevMailServed says whether `serve` with MAILER=log serves /dev/mail for appURL (APP_URL): only
// when its host is a loopback name or address (api.LoopbackHost: localhost, 127.0.0.1, [::1]),
// the development machine's own. /dev/mail shows every mail with its links, a reset link among
// them, so a deployment with a public APP_URL never serves it, even when it runs the log mailer;
// and where it is served, it answers only requests from this machine (see api.Config.DevMail).
func DevMailServed(appURL string) bool {
	u, err := url.Parse(appURL)
	return err == nil && api.LoopbackHost(u.Hostname())
}
