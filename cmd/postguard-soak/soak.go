package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postguard/postguard/jobs/mail/resendfake"
)

// Settings of the processes under test: short enough that a fault's consequences (a job a
// killed worker left running, a send cut short) resolve within the run.
const (
	shutdownTimeout = 5 * time.Second
	jobTimeout      = 5 * time.Second
	jobRescueAfter  = 15 * time.Second
	// limitWindow is the window of the per-IP limit the bursts spend: long, so that a burst
	// rarely straddles two windows (one that does is not held to exactly the limit).
	limitWindow = 24 * time.Hour
	resendKey   = "re_soak"
)

// fault is one entry of the schedule: what was done, when, and what it showed.
type fault struct {
	name string
	at   time.Time
	took time.Duration
	err  error // a fault that could not be played, or a SIGTERM that did not exit 0
}

// soak is one run.
type soak struct {
	opts   *options
	logger *slog.Logger

	admin     *pgx.Conn // on the server, outside the soak's database
	database  string
	soakURL   string
	logDir    string
	fake      *resendfake.Server
	apis      []*process
	workers   []*process
	recorder  *recorder
	faults    []fault
	processMu sync.Mutex // one fault at a time touches the processes
	keepLogs  bool       // a check failed: the logs say why
}

func newSoak(opts *options, stderr io.Writer) *soak {
	return &soak{
		opts:     opts,
		logger:   slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
		recorder: &recorder{},
	}
}

// run plays the whole soak and returns its report; an error means it could not run at all.
func (s *soak) run(ctx context.Context) (*report, error) {
	if err := s.setUp(ctx); err != nil {
		s.tearDown()
		return nil, err
	}
	defer s.tearDown()

	started := time.Now()
	loadCtx, stopLoad := context.WithTimeout(ctx, s.opts.Duration)
	defer stopLoad()
	load := newLoader(s.apis, s.opts.Clients, s.recorder)
	var wg sync.WaitGroup
	for n := range s.opts.Clients {
		wg.Go(func() { load.runClient(loadCtx, n) })
	}
	wg.Go(func() { s.playBursts(loadCtx, load) })
	wg.Go(func() { s.playFaults(loadCtx) })
	s.logger.InfoContext(ctx, "load and faults running", slog.Duration("for", s.opts.Duration))
	wg.Wait()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("interrupted: %w", ctx.Err())
	}
	loadTook := time.Since(started)

	// Whatever the last fault did, every process runs and the database takes connections.
	if err := s.allowConnections(ctx, true); err != nil {
		return nil, err
	}
	for _, p := range append(append([]*process(nil), s.apis...), s.workers...) {
		if !p.running() {
			if err := p.start(ctx); err != nil {
				return nil, err
			}
		}
	}

	s.logger.InfoContext(ctx, "load stopped; waiting for the queue to drain", slog.Duration("at_most", s.opts.DrainTimeout))
	drainStart := time.Now()
	drainErr := s.drain(ctx)
	drainTook := time.Since(drainStart)

	// Every process stops as a deploy stops it, and must exit 0.
	var stops []fault
	for _, p := range append(append([]*process(nil), s.apis...), s.workers...) {
		err := p.signal(syscall.SIGTERM, shutdownTimeout+30*time.Second)
		stops = append(stops, fault{name: "final SIGTERM " + p.name, err: err})
	}

	data, err := s.collect(ctx)
	if err != nil {
		return nil, err
	}
	data.loadTook, data.drainTook, data.drainErr = loadTook, drainTook, drainErr
	data.faults, data.stops = s.faults, stops
	data.opts = s.opts
	data.database = s.database
	data.logDir = s.logDir
	report := evaluate(data)
	s.keepLogs = !report.passed()
	return report, nil
}

// setUp creates the database, migrates it with the binary, starts the fake and the processes.
func (s *soak) setUp(ctx context.Context) error {
	if _, err := os.Stat(s.opts.Postguard); err != nil { //nolint:gosec // the operator names the binary
		return fmt.Errorf("error finding the postguard binary (-postguard): %w", err)
	}
	admin, err := pgx.Connect(ctx, s.opts.DatabaseURL)
	if err != nil {
		return fmt.Errorf("error connecting to PostgreSQL (-database-url): %w", err)
	}
	s.admin = admin

	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix) // never fails, per crypto/rand
	s.database = "pgsoak_" + hex.EncodeToString(suffix)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{s.database}.Sanitize()); err != nil {
		return fmt.Errorf("error creating database %s: %w", s.database, err)
	}
	u, err := url.Parse(s.opts.DatabaseURL)
	if err != nil {
		return fmt.Errorf("error parsing -database-url: %w", err)
	}
	u.Path = "/" + s.database
	s.soakURL = u.String()

	if s.logDir, err = os.MkdirTemp("", "postguard-soak-"); err != nil {
		return fmt.Errorf("error creating the log directory: %w", err)
	}

	rate := 0
	if s.opts.ResendMaxRPS > 0 {
		rate = s.opts.ResendMaxRPS + s.opts.ResendMaxRPS/10 + 1
	}
	s.fake = resendfake.New(nil, &resendfake.Config{APIKey: resendKey, RatePerSecond: rate})

	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	env := []string{
		"DATABASE_URL=" + s.soakURL,
		"APP_SECRET=" + hex.EncodeToString(secret),
		"APP_URL=http://127.0.0.1",
		"MAILER=resend",
		"RESEND_API_KEY=" + resendKey,
		"RESEND_FROM_EMAIL=soak@example.com",
		"RESEND_BASE_URL=" + s.fake.URL(),
		"RESEND_MAX_RPS=" + strconv.Itoa(s.opts.ResendMaxRPS),
		"TRUSTED_PROXIES=127.0.0.1/32",
		"RATE_LIMIT_REGISTER_IP=1000000/24h",
		"RATE_LIMIT_REGISTER_EMAIL=1000000/24h",
		"RATE_LIMIT_RESEND_VERIFICATION_IP=1000000/24h",
		"RATE_LIMIT_FORGOT_PASSWORD_IP=" + strconv.Itoa(s.opts.Limit) + "/" + limitWindow.String(),
		"SHUTDOWN_TIMEOUT=" + shutdownTimeout.String(),
		"JOB_TIMEOUT=" + jobTimeout.String(),
		"JOB_RESCUE_AFTER=" + jobRescueAfter.String(),
		"METRICS_ADDR=off", // several api processes on one host
		"LOG_FORMAT=json",
		"LOG_LEVEL=info",
	}

	migrate := exec.CommandContext(ctx, s.opts.Postguard, "migrate") //nolint:gosec // the operator names the binary
	migrate.Env = env
	if out, err := migrate.CombinedOutput(); err != nil {
		return fmt.Errorf("error running `postguard migrate`: %w\n%s", err, out)
	}

	for i := range s.opts.APIs {
		p, err := newProcess(ctx, fmt.Sprintf("api-%d", i+1), "api", s.opts.Postguard, s.logDir, env, s.logger)
		if err != nil {
			return err
		}
		s.apis = append(s.apis, p)
	}
	for i := range s.opts.Workers {
		p, err := newProcess(ctx, fmt.Sprintf("worker-%d", i+1), "worker", s.opts.Postguard, s.logDir, env, s.logger)
		if err != nil {
			return err
		}
		s.workers = append(s.workers, p)
	}
	for _, p := range append(append([]*process(nil), s.apis...), s.workers...) {
		if err := p.start(ctx); err != nil {
			return err
		}
	}
	s.logger.InfoContext(ctx, "soak set up", slog.String("database", s.database), slog.String("logs", s.logDir),
		slog.Int("apis", len(s.apis)), slog.Int("workers", len(s.workers)))
	return nil
}

// tearDown stops whatever still runs, and drops the database unless -keep.
func (s *soak) tearDown() {
	for _, p := range append(append([]*process(nil), s.apis...), s.workers...) {
		p.kill()
	}
	if s.fake != nil {
		s.fake.Close()
	}
	if s.admin == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if s.database != "" && !s.opts.Keep {
		if _, err := s.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{s.database}.Sanitize()+" WITH (FORCE)"); err != nil {
			s.logger.WarnContext(ctx, "error dropping the soak's database", slog.String("database", s.database), slog.String("error", err.Error()))
		}
		if s.logDir != "" && !s.keepLogs {
			_ = os.RemoveAll(s.logDir) //nolint:gosec // the directory MkdirTemp made
		}
	}
	_ = s.admin.Close(ctx)
}

// playBursts spends the limit of a fresh IP every -burst-every, from every api at once.
func (s *soak) playBursts(ctx context.Context, load *loader) {
	ticker := time.NewTicker(s.opts.BurstEvery)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		b := load.burst(ctx, s.opts.Limit, limitWindow)
		if ctx.Err() == nil {
			s.recorder.addBurst(b)
		}
	}
}

// faultNames are the faults, in the order they take turns.
var faultNames = []string{
	"kill -9 worker",
	"kill -9 api",
	"every backend terminated",
	"SIGTERM worker",
	"SIGTERM api",
	"connections refused",
}

// playFaults plays one fault every -fault-every, in turn, until ctx ends.
func (s *soak) playFaults(ctx context.Context) {
	ticker := time.NewTicker(s.opts.FaultEvery)
	defer ticker.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		name := faultNames[n%len(faultNames)]
		target := n / len(faultNames) // which process of the kind, in turn
		f := fault{name: name, at: time.Now()}
		// The fault runs to its end (a restart included) even when the load ends meanwhile.
		f.err = s.playFault(context.WithoutCancel(ctx), name, target)
		f.took = time.Since(f.at)
		s.logger.InfoContext(ctx, "fault played", slog.String("fault", name), slog.Duration("took", f.took), slog.Any("error", f.err))
		s.faults = append(s.faults, f)
	}
}

func (s *soak) playFault(ctx context.Context, name string, target int) error {
	s.processMu.Lock()
	defer s.processMu.Unlock()

	worker := s.workers[target%len(s.workers)]
	api := s.apis[target%len(s.apis)]
	switch name {
	case "kill -9 worker":
		return s.killAndRestart(ctx, worker)
	case "kill -9 api":
		return s.killAndRestart(ctx, api)
	case "SIGTERM worker":
		return s.stopAndRestart(ctx, worker)
	case "SIGTERM api":
		return s.stopAndRestart(ctx, api)
	case "every backend terminated":
		return s.terminateBackends(ctx)
	case "connections refused":
		if err := s.allowConnections(ctx, false); err != nil {
			return err
		}
		err := s.terminateBackends(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(s.opts.RefuseFor):
		}
		return errors.Join(err, s.allowConnections(ctx, true))
	}
	return fmt.Errorf("unknown fault %q", name)
}

// killAndRestart ends p with SIGKILL (nothing of it runs on: its jobs stay running until
// rescued, its requests are cut) and starts it again, as a supervisor would.
func (s *soak) killAndRestart(ctx context.Context, p *process) error {
	var exitErr *exec.ExitError
	if err := p.signal(syscall.SIGKILL, 10*time.Second); !errors.As(err, &exitErr) {
		return fmt.Errorf("%s did not die of SIGKILL: %w", p.name, err)
	}
	return p.start(ctx)
}

// stopAndRestart stops p with SIGTERM, which must exit 0, and starts it again.
func (s *soak) stopAndRestart(ctx context.Context, p *process) error {
	if err := p.signal(syscall.SIGTERM, shutdownTimeout+30*time.Second); err != nil {
		return fmt.Errorf("%s after SIGTERM: %w", p.name, err)
	}
	return p.start(ctx)
}

// terminateBackends terminates every backend of the soak's database, as a restart of
// PostgreSQL does to its clients.
func (s *soak) terminateBackends(ctx context.Context) error {
	if _, err := s.admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, s.database); err != nil {
		return fmt.Errorf("error terminating backends: %w", err)
	}
	return nil
}

// allowConnections lets the soak's database take new connections, or refuses them as
// PostgreSQL does during maintenance (SQLSTATE 55000 at connect).
func (s *soak) allowConnections(ctx context.Context, allow bool) error {
	if _, err := s.admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s ALLOW_CONNECTIONS %t", pgx.Identifier{s.database}.Sanitize(), allow)); err != nil {
		return fmt.Errorf("error setting ALLOW_CONNECTIONS %t: %w", allow, err)
	}
	return nil
}

// drain waits until no job is left to work (every one completed, cancelled or discarded).
func (s *soak) drain(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.soakURL)
	if err != nil {
		return fmt.Errorf("error connecting to the soak's database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	deadline := time.Now().Add(s.opts.DrainTimeout)
	for {
		var left int
		if err := conn.QueryRow(ctx, `
			SELECT count(*)
			FROM river_job
			WHERE kind NOT IN ('prune', 'prune_counters')
				AND state NOT IN ('completed', 'cancelled', 'discarded')`).Scan(&left); err != nil {
			return fmt.Errorf("error counting unfinished jobs: %w", err)
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d jobs still unfinished after %s", left, s.opts.DrainTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// running says the process has been started and has not exited.
func (p *process) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}
