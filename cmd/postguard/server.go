package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/postguard/postguard/api"
	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/cmd/internal/service"
	"github.com/postguard/postguard/cmd/internal/telemetry"
)

// serverCommand runs the HTTP server and/or River's workers until the context ends (SIGTERM),
// then stops taking requests, lets running requests and jobs finish within SHUTDOWN_TIMEOUT, and
// returns nil.
type serverCommand struct {
	role service.Role

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
	// Tracing is on when an OTEL_ variable turns it on (telemetry.New); the spans still buffered
	// at SIGTERM are flushed once HTTP and River have drained.
	tel, err := telemetry.New(ctx, &telemetry.Opts{Getenv: newEnvParser(env.Environ).getenv, Logger: logger})
	if err != nil {
		return fmt.Errorf("configuration error:\n%w", err)
	}
	svc, err := service.New(ctx, cfg, logger, c.role, &service.Opts{APIConfigFunc: c.apiConfigFunc, Telemetry: tel})
	if err != nil {
		return errors.Join(err, tel.Shutdown(ctx))
	}
	defer svc.Close()

	listener, err := (&net.ListenConfig{}).Listen(ctx, "tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("error listening on HTTP_ADDR %s: %w", cfg.HTTPAddr, err)
	}
	server := service.NewHTTPServer(svc.Handler, logger)

	// /metrics has a listener of its own on the roles that serve the public API (see
	// service.Service.MetricsHandler).
	var metricsListener net.Listener
	var metricsServer *http.Server
	if svc.MetricsHandler != nil {
		metricsListener, err = (&net.ListenConfig{}).Listen(ctx, "tcp", cfg.MetricsAddr)
		if err != nil {
			_ = listener.Close()
			return fmt.Errorf("error listening on METRICS_ADDR %s: %w", cfg.MetricsAddr, err)
		}
		metricsServer = service.NewHTTPServer(svc.MetricsHandler, logger)
	}

	// River runs on a context SIGTERM does not cancel, so the shutdown below decides the order.
	riverCtx := context.WithoutCancel(ctx)
	if c.role.Works() {
		if err := svc.Store.Jobs().Start(riverCtx); err != nil {
			_ = listener.Close()
			return fmt.Errorf("error starting River: %w", err)
		}
	}

	serveErr := make(chan error, 2)
	go func() { serveErr <- server.Serve(listener) }()
	started := []any{
		slog.String("role", string(c.role)), slog.String("engine", svc.Store.Engine()),
		slog.String("addr", listener.Addr().String()), slog.String("mailer", svc.Mailer),
	}
	if c.role.Works() && cfg.Renderer != nil {
		started = append(started, slog.String("app_name", cfg.AppName), slog.Any("mail_locales", cfg.Renderer.Locales()))
	}
	if c.role.Works() && cfg.SMTPURL != nil && slices.Contains(cfg.Mailers, service.MailerSMTP) {
		started = append(started, slog.String("smtp_url", cfg.SMTPURL.Redacted())) // never the password
	}
	if tel.Enabled() {
		started = append(started, slog.String("traces", tel.Exporter()))
	}
	if metricsServer != nil {
		go func() { serveErr <- metricsServer.Serve(metricsListener) }()
		started = append(started, slog.String("metrics_addr", metricsListener.Addr().String()))
	}
	// A RATE_LIMIT_ variable with a misspelt built-in action defines a custom action instead:
	// the start line names them all, so a typo shows.
	if custom := customActions(cfg.Rules); custom != "" {
		started = append(started, slog.String("custom_rate_limit_actions", custom))
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
	shutdownErr := c.shutdown(riverCtx, svc, server, metricsServer)
	return errors.Join(runErr, shutdownErr, flushTraces(riverCtx, svc, tel))
}

// flushTraces exports the spans tracing still holds, within SHUTDOWN_TIMEOUT: after HTTP and
// River have drained, so that the last requests' and jobs' spans are among them.
func flushTraces(ctx context.Context, svc *service.Service, tel *telemetry.Telemetry) error {
	flushCtx, cancel := context.WithTimeout(ctx, svc.Config.ShutdownTimeout)
	defer cancel()
	return tel.Shutdown(flushCtx)
}

// customActions lists the rules' custom actions, comma-separated ("" for none).
func customActions(rules abuse.Rules) string {
	var names []string
	for _, action := range rules.Actions() {
		if !action.BuiltIn() {
			names = append(names, string(action))
		}
	}
	return strings.Join(names, ",")
}

// shutdown stops taking requests and lets running requests and jobs finish within
// SHUTDOWN_TIMEOUT, HTTP (both listeners; metrics may be nil) and River at the same time.
func (c *serverCommand) shutdown(ctx context.Context, svc *service.Service, server, metrics *http.Server) error {
	timeout := svc.Config.ShutdownTimeout
	httpDone := make(chan error, 1)
	go func() {
		shutdownCtx, cancel := context.WithTimeout(ctx, timeout)
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
	if c.role.Works() {
		// SoftStopTimeout cancels jobs still running after SHUTDOWN_TIMEOUT; give them a
		// moment more to hand their jobs back before giving up on a clean stop.
		stopCtx, cancel := context.WithTimeout(ctx, timeout+5*time.Second)
		defer cancel()
		if err := svc.Store.Jobs().Stop(stopCtx); err != nil {
			riverErr = fmt.Errorf("error stopping River: %w", err)
		}
	}

	// Requests cut short at the deadline are the deadline working, not a failure to report.
	if err := <-httpDone; err != nil {
		svc.Logger.WarnContext(ctx, "HTTP requests still running at SHUTDOWN_TIMEOUT were cut short", slog.String("error", err.Error()))
	}
	if riverErr == nil {
		svc.Logger.InfoContext(ctx, "stopped")
	}
	return riverErr
}
