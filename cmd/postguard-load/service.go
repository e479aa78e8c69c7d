package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/postguard/postguard/api"
	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/jobs"
)

// trustedProxy is the load clients' address: the service believes their X-Forwarded-For, as it
// would a reverse proxy's (TRUSTED_PROXIES=127.0.0.1/32), so each request can come from its own
// client IP.
const trustedProxy = "127.0.0.1/32"

// appURL is the service's APP_URL in the run (links in mail).
const appURL = "http://127.0.0.1"

// hashConcurrency is the service's HashConcurrency in the run and the number of goroutines of
// the argon2id-hash baseline: GOMAXPROCS, the most hashes that can run at once.
func hashConcurrency() int { return runtime.GOMAXPROCS(0) }

// service is postguard's HTTP API built in-process as `postguard api` builds it (api.New with an
// abuse.Limiter on the store, the production server timeouts), listening on a loopback port.
type service struct {
	url    string
	server *http.Server
	client *http.Client
	served chan struct{}
	closed sync.Once
}

// configureInsertOnly configures store's River client as the api role does: workers registered,
// no queues, so requests can insert jobs that nobody works in the run.
func (r *runner) configureInsertOnly(store db.Store) error {
	riverConfig, err := jobs.NewRiverConfig(&jobs.Deps{Store: store, Logger: r.logger}, &jobs.Config{
		Secret:     r.secret,
		AppURL:     appURL,
		InsertOnly: true,
	})
	if err != nil {
		return fmt.Errorf("error building River config: %w", err)
	}
	if err := store.ConfigureRiver(riverConfig); err != nil {
		return fmt.Errorf("error configuring River: %w", err)
	}
	return nil
}

// startService serves the API on 127.0.0.1 with its own limiter (rules) and metrics registry, and
// returns it with an HTTP client keeping up to clients connections alive.
//
// The server's goroutines carry the pprof label scenario=name, as the load clients' do, so that
// -cpuprofile can be read per scenario.
func (r *runner) startService(ctx context.Context, name string, store db.Store, rules abuse.Rules, clients int) (*service, error) {
	trusted, err := abuse.ParseTrustedProxies(trustedProxy)
	if err != nil {
		return nil, fmt.Errorf("error parsing trusted proxies: %w", err)
	}
	registry := prometheus.NewRegistry()
	limiter := abuse.NewLimiter(store, r.secret, rules, &abuse.LimiterConfig{Registerer: registry})
	handler, err := api.New(&api.Config{
		Store:      store,
		Limiter:    limiter,
		IPResolver: abuse.NewIPResolver(trusted),
		Secret:     r.secret,
		AppURL:     appURL,
		Logger:     r.logger,
		Registerer: registry,
		Gatherer:   registry,
		// Explicit, so that the register scenario's bound on concurrent hashes is the very
		// concurrency of its argon2id-hash baseline (the service's default is runtime.NumCPU,
		// which differs from GOMAXPROCS under a CPU quota or GOMAXPROCS=n).
		HashConcurrency: hashConcurrency(),
	})
	if err != nil {
		return nil, fmt.Errorf("error building the API: %w", err)
	}

	listener, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("error listening on 127.0.0.1: %w", err)
	}
	// The timeouts of cmd/postguard's server.
	labels := pprof.Labels("scenario", name)
	server := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			pprof.Do(req.Context(), labels, func(context.Context) { handler.ServeHTTP(w, req) })
		}),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(r.logger.Handler(), slog.LevelWarn),
	}
	s := &service{
		url:    "http://" + listener.Addr().String(),
		server: server,
		served: make(chan struct{}),
		client: &http.Client{
			Transport: &http.Transport{
				DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
				DisableCompression:  true,
				IdleConnTimeout:     30 * time.Second,
				MaxIdleConns:        clients,
				MaxIdleConnsPerHost: clients,
			},
			Timeout: time.Minute,
		},
	}
	go func() {
		defer close(s.served)
		_ = server.Serve(listener) // ErrServerClosed after close
	}()
	return s, nil
}

// close stops the server, waiting up to 5s for requests in flight. Safe to call twice.
func (s *service) close() {
	s.closed.Do(func() {
		s.client.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.server.Shutdown(ctx); err != nil {
			_ = s.server.Close()
		}
		<-s.served
	})
}

// post sends a JSON body from clientIP (through X-Forwarded-For) and wants status back.
func (s *service) post(ctx context.Context, path, clientIP, body string, want int) error {
	//nolint:gosec // G704: s.url is the service's own loopback listener, path a constant route
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+path, strings.NewReader(body))
	if err != nil {
		return fmt.Errorf("error building request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-For", clientIP)
	resp, err := s.client.Do(req) //nolint:gosec // G704: see above
	if err != nil {
		return fmt.Errorf("error posting %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		excerpt, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return fmt.Errorf("POST %s: status %d, want %d: %s", path, resp.StatusCode, want, bytes.TrimSpace(excerpt))
	}
	// Read to the end, so the connection is reused.
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return fmt.Errorf("error reading answer of %s: %w", path, err)
	}
	return nil
}

// warningLog keeps the first lines the service logs at warning level or above, to show them
// after the report (the service's other lines are formatted, as in production, and discarded).
//
// It is muted while a measurement cancels its requests in flight at its deadline: the service
// rightly warns about requests that end before their answer, but those are the tool's doing.
type warningLog struct {
	mu    sync.Mutex
	lines []string
	max   int
	muted bool
}

func (w *warningLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.muted && len(w.lines) < w.max {
		w.lines = append(w.lines, strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

func (w *warningLog) mute(muted bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.muted = muted
}

func (w *warningLog) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.lines...)
}

// newServiceLogger formats every line at info level as the service would (so that the access
// log costs what it costs in production) and discards it, keeping warnings and errors in warn.
func newServiceLogger(warn *warningLog) *slog.Logger {
	return slog.New(slog.NewMultiHandler(
		slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}),
		slog.NewTextHandler(warn, &slog.HandlerOptions{Level: slog.LevelWarn}),
	))
}
