package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"riverqueue.com/riverui"

	"github.com/postguard/postguard/api"
	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/postgres"
	"github.com/postguard/postguard/db/sqlite"
	"github.com/postguard/postguard/jobs"
	"github.com/postguard/postguard/jobs/mail"
)

// role is what a server process does: serve is api and worker in one.
type role string

const (
	roleServe  role = "serve"
	roleAPI    role = "api"
	roleWorker role = "worker"
)

func (r role) works() bool  { return r != roleAPI }
func (r role) serves() bool { return r != roleWorker }

// serverCommand runs the HTTP server and/or River's workers until the context ends (SIGTERM),
// then stops taking requests, lets running requests and jobs finish within SHUTDOWN_TIMEOUT, and
// returns nil.
type serverCommand struct {
	role role

	// readyFunc, when set, is called with the listener's address once the process serves (tests).
	readyFunc func(addr net.Addr)

	// metricsReadyFunc, when set, is called with the metrics listener's address (METRICS_ADDR)
	// just before readyFunc, when there is one (tests).
	metricsReadyFunc func(addr net.Addr)

	// apiConfigFunc, when set, makes last changes to the API's config before its router is built
	// (tests: a short RequestTimeout, so a database outage is seen in seconds).
	apiConfigFunc func(config *api.Config)
}

func (c *serverCommand) Run(ctx context.Context, env *commandEnv) error {
	cfg, logger, err := env.configure()
	if err != nil {
		return err
	}
	if c.role != roleServe && cfg.Engine == engineSQLite {
		return fmt.Errorf("`postguard %s` needs PostgreSQL (DATABASE_URL=postgres://…): the embedded SQLite database belongs to one process; use `postguard serve`", c.role)
	}

	store, err := openStore(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer store.Close()

	secret := cfg.AppSecret
	if cfg.Engine == engineSQLite {
		// The embedded default needs no set-up: it migrates itself and keeps a generated secret
		// beside its database (PATH.secret), so links in mail survive restarts.
		if err := store.Migrate(ctx); err != nil {
			return fmt.Errorf("error migrating SQLite database %s: %w", cfg.SQLitePath, err)
		}
		if secret == nil {
			if secret, err = store.(*sqlite.Store).AppSecret(ctx); err != nil {
				return err
			}
		}
	} else if err := store.CheckSchema(ctx); err != nil {
		return err
	}

	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	sender, err := newSender(cfg, logger)
	if err != nil {
		return err
	}
	if c.role.works() && sender == nil {
		logger.WarnContext(ctx, "MAILER=none: email jobs stay queued until a mailer is configured; nothing is lost")
	}

	riverConfig, err := jobs.NewRiverConfig(
		&jobs.Deps{Store: store, Sender: sender, Logger: logger, Registerer: registry},
		&jobs.Config{
			Secret:            secret,
			AppURL:            cfg.AppURL,
			EmailWorkers:      cfg.EmailWorkers,
			JobTimeout:        cfg.JobTimeout,
			RescueAfter:       cfg.JobRescueAfter,
			JobRetention:      cfg.JobRetention,
			CounterRetention:  cfg.CounterRetention,
			PruneInterval:     cfg.PruneInterval,
			MaxRPS:            cfg.ResendMaxRPS,
			FetchCooldown:     cfg.FetchCooldown,
			FetchPollInterval: cfg.FetchPollInterval,
			InsertOnly:        !c.role.works(),
		})
	if err != nil {
		return err
	}
	// A job still running SHUTDOWN_TIMEOUT after SIGTERM has its context cancelled; it returns
	// context.Canceled and River puts it back without spending an attempt.
	riverConfig.SoftStopTimeout = cfg.ShutdownTimeout
	if err := store.ConfigureRiver(riverConfig); err != nil {
		return fmt.Errorf("error creating River client: %w", err)
	}

	// River UI's background services (its job count caches) must not outlive Run: they query the
	// store, which closes when Run returns. SIGTERM does not stop them (requests still draining
	// may use them); returning does. (Fix: they were started on a context never cancelled, and
	// kept querying the closed database.)
	uiCtx, stopUI := context.WithCancel(context.WithoutCancel(ctx))
	defer stopUI()

	handler, err := c.handler(uiCtx, cfg, logger, store, secret, registry)
	if err != nil {
		return err
	}

	listener, err := (&net.ListenConfig{}).Listen(ctx, "tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("error listening on HTTP_ADDR %s: %w", cfg.HTTPAddr, err)
	}
	server := newHTTPServer(handler, logger)

	// /metrics has a listener of its own on the roles that serve the public API: its delivery
	// counts by kind would tell anyone which addresses have accounts. A worker serves it on
	// HTTP_ADDR, which serves nothing else of interest.
	var metricsListener net.Listener
	var metricsServer *http.Server
	if c.role.serves() && cfg.MetricsAddr != "" {
		metricsHandler, err := api.MetricsRouter(&api.Config{Logger: logger, Registerer: registry, Gatherer: registry})
		if err != nil {
			return err
		}
		metricsListener, err = (&net.ListenConfig{}).Listen(ctx, "tcp", cfg.MetricsAddr)
		if err != nil {
			_ = listener.Close()
			return fmt.Errorf("error listening on METRICS_ADDR %s: %w", cfg.MetricsAddr, err)
		}
		metricsServer = newHTTPServer(metricsHandler, logger)
	}

	// River runs on a context SIGTERM does not cancel, so the shutdown below decides the order.
	riverCtx := context.WithoutCancel(ctx)
	if c.role.works() {
		if err := store.River().Start(riverCtx); err != nil {
			return fmt.Errorf("error starting River: %w", err)
		}
	}

	serveErr := make(chan error, 2)
	go func() { serveErr <- server.Serve(listener) }()
	started := []any{
		slog.String("role", string(c.role)), slog.String("engine", store.Engine()),
		slog.String("addr", listener.Addr().String()), slog.String("mailer", cfg.Mailer),
	}
	if metricsServer != nil {
		go func() { serveErr <- metricsServer.Serve(metricsListener) }()
		started = append(started, slog.String("metrics_addr", metricsListener.Addr().String()))
	}
	logger.InfoContext(ctx, "postguard started", started...)
	if c.metricsReadyFunc != nil && metricsListener != nil {
		c.metricsReadyFunc(metricsListener.Addr())
	}
	if c.readyFunc != nil {
		c.readyFunc(listener.Addr())
	}

	var runErr error
	select {
	case <-ctx.Done():
		logger.InfoContext(riverCtx, "shutting down", slog.Duration("timeout", cfg.ShutdownTimeout))
	case err := <-serveErr:
		runErr = fmt.Errorf("error serving HTTP: %w", err)
	}
	return errors.Join(runErr, c.shutdown(riverCtx, cfg, logger, server, metricsServer, store))
}

// newHTTPServer is an HTTP server for handler with the service's timeouts.
func newHTTPServer(handler http.Handler, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// shutdown stops taking requests and lets running requests and jobs finish within
// SHUTDOWN_TIMEOUT, HTTP (both listeners; metrics may be nil) and River at the same time.
func (c *serverCommand) shutdown(ctx context.Context, cfg *config, logger *slog.Logger, server, metrics *http.Server, store db.Store) error {
	httpDone := make(chan error, 1)
	go func() {
		shutdownCtx, cancel := context.WithTimeout(ctx, cfg.ShutdownTimeout)
		defer cancel()
		metricsDone := make(chan error, 1)
		go func() {
			if metrics == nil {
				metricsDone <- nil
				return
			}
			metricsDone <- metrics.Shutdown(shutdownCtx)
		}()
		err := server.Shutdown(shutdownCtx)
		httpDone <- errors.Join(err, <-metricsDone)
	}()

	var riverErr error
	if c.role.works() {
		// SoftStopTimeout cancels jobs still running after SHUTDOWN_TIMEOUT; give them a
		// moment more to hand their jobs back before giving up on a clean stop.
		stopCtx, cancel := context.WithTimeout(ctx, cfg.ShutdownTimeout+5*time.Second)
		defer cancel()
		if err := store.River().Stop(stopCtx); err != nil {
			riverErr = fmt.Errorf("error stopping River: %w", err)
		}
	}

	// Requests cut short at the deadline are the deadline working, not a failure to report.
	if err := <-httpDone; err != nil {
		logger.WarnContext(ctx, "HTTP requests still running at SHUTDOWN_TIMEOUT were cut short", slog.String("error", err.Error()))
	}
	if riverErr == nil {
		logger.InfoContext(ctx, "stopped")
	}
	return riverErr
}

// handler builds the HTTP handler of the role: the whole API, or health and metrics only.
func (c *serverCommand) handler(ctx context.Context, cfg *config, logger *slog.Logger, store db.Store, secret []byte, registry *prometheus.Registry) (http.Handler, error) {
	if !c.role.serves() {
		return api.HealthRouter(&api.Config{Store: store, Logger: logger, Registerer: registry, Gatherer: registry})
	}

	var riverUI http.Handler
	if cfg.RiverUIUsername != "" {
		ui, err := riverui.NewHandler(&riverui.HandlerOpts{
			Endpoints: store.RiverUIEndpoints(),
			Logger:    logger,
			Prefix:    "/riverui",
		})
		if err != nil {
			return nil, fmt.Errorf("error creating River UI: %w", err)
		}
		// ctx ends when Run returns (see Run), not at SIGTERM.
		if err := ui.Start(ctx); err != nil {
			return nil, fmt.Errorf("error starting River UI: %w", err)
		}
		riverUI = ui
	}

	limiter := abuse.NewLimiter(store, secret, cfg.Rules, &abuse.LimiterConfig{Registerer: registry})
	apiConfig := &api.Config{
		Store:           store,
		Limiter:         limiter,
		IPResolver:      abuse.NewIPResolver(cfg.TrustedProxies).WithHeader(cfg.ClientIPHeader),
		Secret:          secret,
		AppURL:          cfg.AppURL,
		Logger:          logger,
		Registerer:      registry,
		Gatherer:        registry,
		RiverUI:         riverUI,
		RiverUIUsername: cfg.RiverUIUsername,
		RiverUIPassword: cfg.RiverUIPassword,
	}
	if c.apiConfigFunc != nil {
		c.apiConfigFunc(apiConfig)
	}
	return api.New(apiConfig)
}

// openStore opens the database DATABASE_URL names.
func openStore(ctx context.Context, cfg *config, logger *slog.Logger) (db.Store, error) {
	switch cfg.Engine {
	case enginePostgres:
		store, err := postgres.New(ctx, cfg.DatabaseURL, &postgres.Config{Logger: logger})
		if err != nil {
			return nil, fmt.Errorf("error connecting to PostgreSQL (DATABASE_URL): %w", err)
		}
		return store, nil
	default:
		store, err := sqlite.Open(ctx, cfg.SQLitePath, &sqlite.Config{Logger: logger})
		if err != nil {
			return nil, fmt.Errorf("error opening SQLite database %s (DATABASE_URL): %w", cfg.SQLitePath, err)
		}
		return store, nil
	}
}

// newSender builds the mailer MAILER names; nil for none.
func newSender(cfg *config, logger *slog.Logger) (mail.Sender, error) {
	switch cfg.Mailer {
	case mailerResend:
		sender, err := mail.NewResendSender(&mail.ResendConfig{
			APIKey:  cfg.ResendAPIKey,
			From:    cfg.ResendFromEmail,
			BaseURL: cfg.ResendBaseURL,
			Timeout: cfg.JobTimeout,
		})
		if err != nil {
			return nil, fmt.Errorf("error creating Resend sender: %w", err)
		}
		return sender, nil
	case mailerLog:
		return mail.NewLogSender(logger), nil
	default:
		return nil, nil
	}
}
