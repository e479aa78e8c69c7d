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
	"sync/atomic"
	"time"

	"github.com/postguard/postguard/api"
	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/cmd/internal/service"
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

// loadService is postguard's HTTP API built in-process by the very constructor `postguard api`
// uses (service.New, role api: its store and pools, limiter and router), with the production
// server timeouts, listening on a loopback port.
type loadService struct {
	url    string
	svc    *service.Service
	server *http.Server
	client *http.Client
	served chan struct{}
	closed sync.Once
	active atomic.Int64 // requests in the service's handler
}

// serviceOpts are what a scenario changes in the service it starts. A nil *serviceOpts changes
// nothing.
type serviceOpts struct {
	// apiConfigFunc makes last changes to the API's config, after the tool's own (the redis_rate
	// baseline's limiter).
	apiConfigFunc func(config *api.Config)
}

// startService serves the API of d on 127.0.0.1 with its own limiter (rules) and metrics
// registry, and returns it with an HTTP client keeping up to clients connections alive, one per
// client, so that no client dials again between its requests.
//
// The server's goroutines carry the pprof label scenario=name, as the load clients' do, so that
// -cpuprofile can be read per scenario.
func (r *runner) startService(ctx context.Context, name string, d *database, rules abuse.Rules, clients int, opts *serviceOpts) (*loadService, error) {
	trusted, err := abuse.ParseTrustedProxies(trustedProxy)
	if err != nil {
		return nil, fmt.Errorf("error parsing trusted proxies: %w", err)
	}
	config := d.config()
	config.AppSecret = r.secret
	config.AppURL = appURL
	config.Rules = rules
	config.TrustedProxies = trusted
	config.Mailers = nil // MAILER=none
	// `postguard api`; on the embedded default, which has no api role, `postguard serve` with its
	// River client not started.
	role := service.RoleAPI
	if d.engine == engineSQLite {
		role = service.RoleServe
	}
	svc, err := service.New(ctx, config, r.logger, role, &service.Opts{
		APIConfigFunc: func(config *api.Config) {
			// Explicit, so that the register scenario's bound on concurrent hashes is the very
			// concurrency of its argon2id-hash baseline.
			config.HashConcurrency = hashConcurrency()
			if opts != nil && opts.apiConfigFunc != nil {
				opts.apiConfigFunc(config)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("error building the API: %w", err)
	}

	listener, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		svc.Close()
		return nil, fmt.Errorf("error listening on 127.0.0.1: %w", err)
	}
	labels := pprof.Labels("scenario", name)
	s := &loadService{
		url:    "http://" + listener.Addr().String(),
		svc:    svc,
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
	s.server = service.NewHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		s.active.Add(1)
		defer s.active.Add(-1)
		pprof.Do(req.Context(), labels, func(context.Context) { svc.Handler.ServeHTTP(w, req) })
	}), r.logger)
	go func() {
		defer close(s.served)
		_ = s.server.Serve(listener) // ErrServerClosed after close
	}()
	return s, nil
}

// settle waits until no request is in the service's handler, at most 5 s (or until ctx ends): a
// measurement that cuts its requests short leaves them unwinding (a held answer waits out its
// hold), and in a nest (see interleavedScenarios) the service lives on while the next row
// measures, whose warnings they would be taken for, and whose CPU they would share.
func (s *loadService) settle(ctx context.Context) {
	for deadline := time.Now().Add(5 * time.Second); s.active.Load() > 0 && ctx.Err() == nil && time.Now().Before(deadline); {
		sleepContext(ctx, 10*time.Millisecond)
	}
}

// close stops the server, waiting up to 5s for requests in flight, and closes the service. Safe
// to call twice.
func (s *loadService) close() {
	s.closed.Do(func() {
		s.client.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.server.Shutdown(ctx); err != nil {
			_ = s.server.Close()
		}
		<-s.served
		_ = s.svc.Close()
	})
}

// post sends a JSON body from clientIP (through X-Forwarded-For) and wants status back.
func (s *loadService) post(ctx context.Context, path, clientIP, body string, want int) error {
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
