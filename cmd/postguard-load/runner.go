package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"github.com/jackc/pgx/v5"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"time"
)

// runner runs the selected scenarios against one engine and fills the report.
type runner struct {
	opts     *options
	stderr   io.Writer
	logger   *slog.Logger
	warnings *warningLog
	secret   []byte // APP_SECRET of the run
	tag      string // random, names the run's schemas and makes its emails unique

	engine  string
	baseURL string // PostgreSQL server URL, without schema
	sqlDir  string // the run's directory of SQLite files, once made

	clientIPs atomic.Uint32 // the next client IP, counted in 10.0.0.0/8
	report    *Report

	// pendingCeiling, when set, measures the second half of ceiling/fresh-keys and adds the
	// ceiling's rows (see ceiling).
	pendingCeiling func()
}

func newRunner(opts *options, stderr io.Writer) *runner {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret) // never fails, per crypto/rand
	tagBytes := make([]byte, 6)
	_, _ = rand.Read(tagBytes)

	warnings := &warningLog{max: 20}
	r := &runner{
		opts:     opts,
		stderr:   stderr,
		logger:   newServiceLogger(warnings),
		warnings: warnings,
		secret:   secret,
		tag:      hex.EncodeToString(tagBytes),
		engine:   enginePostgres,
		baseURL:  opts.DatabaseURL,
	}
	if strings.HasPrefix(opts.DatabaseURL, "sqlite://") {
		r.engine, r.baseURL = engineSQLite, ""
	}
	r.report = &Report{
		RunID:       r.tag,
		Engine:      r.engine,
		GOMAXPROCS:  runtime.GOMAXPROCS(0),
		NumCPU:      runtime.NumCPU(),
		Concurrency: opts.Concurrency,
		Duration:    opts.Duration.String(),
	}
	return r
}

// nextIP returns a client IP no other request of the run has used.
func (r *runner) nextIP() string {
	n := r.clientIPs.Add(1) // from 10.0.0.1
	return fmt.Sprintf("10.%d.%d.%d", byte(n>>16), byte(n>>8), byte(n))
}

// newDatabase creates and migrates a database of the run on engine; cleanup removes it.
func (r *runner) newDatabase(ctx context.Context, engine, name string) (d *database, cleanup func(), err error) {
	if engine == enginePostgres {
		d, err := newPostgresDatabase(ctx, r.baseURL, r.tag, name, r.logger)
		if d == nil {
			return nil, nil, err
		}
		cleanup = func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := d.drop(ctx, r.baseURL); err != nil {
				fmt.Fprintf(r.stderr, "postguard-load: %v\n", err)
			}
		}
		if err != nil {
			cleanup()
			return nil, nil, err
		}
		return d, cleanup, nil
	}

	if r.sqlDir == "" {
		if r.sqlDir, err = sqliteDir(r.opts.DatabaseURL); err != nil {
			return nil, nil, err
		}
	}
	d, err = newSQLiteDatabase(ctx, r.sqlDir, name, r.logger)
	if err != nil {
		return nil, nil, err
	}
	return d, func() {}, nil
}

// run measures the selected scenarios in order and returns the report.
func (r *runner) run(ctx context.Context) (*Report, error) {
	defer func() {
		if r.sqlDir != "" {
			_ = os.RemoveAll(r.sqlDir) //nolint:gosec // G703: the directory os.MkdirTemp made for this run
		}
	}()

	fmt.Fprintf(r.stderr, "postguard-load: preparing %s database…\n", r.engine)
	mainDB, cleanup, err := r.newDatabase(ctx, r.engine, "main")
	if err != nil {
		return nil, err
	}
	defer cleanup()

	store, err := mainDB.open(ctx)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	if r.engine == enginePostgres {
		r.report.Engine = enginePostgres + serverVersion(ctx, mainDB.url)
	}

	steps := []struct {
		scenario string
		run      func(ctx context.Context) error
	}{
		{scenarioCeiling, func(ctx context.Context) error { return r.ceiling(ctx, store) }},
		{scenarioManyIPs, func(ctx context.Context) error {
			return r.manyIPs(ctx, mainDB, scenarioManyIPs, rowCeilingPair, targetManyIPs)
		}},
		{scenarioHotIP, func(ctx context.Context) error { return r.hotIP(ctx, mainDB) }},
		{scenarioRegister, func(ctx context.Context) error { return r.register(ctx, mainDB) }},
		{scenarioEmailDrain, r.emailDrain},
		{scenarioSQLite, r.sqliteManyIPs},
	}
	for _, step := range steps {
		if !r.opts.selected(step.scenario) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("interrupted before %s: %w", step.scenario, err)
		}
		if err := step.run(ctx); err != nil {
			return nil, fmt.Errorf("error in scenario %s: %w", step.scenario, err)
		}
	}
	r.finishCeiling() // when http-many-ips failed to run after it

	r.report.Notes = append(r.report.Notes,
		"CPU/req is this process's user+sys CPU (service and load clients together) over requests; DB CPU/req is the local PostgreSQL "+
			"server's (all its processes; SQLite runs in-process, so its cost is in CPU/req); others is the share of the machine's CPU "+
			"capacity that other processes used meanwhile (a noisy neighbour slows every figure it overlaps)",
		"the service runs as `postguard api` would: production pools and timeouts, access log formatted at info level and discarded")
	r.report.ServiceWarnings = r.warnings.all()
	r.report.finish()
	return r.report, nil
}

// serverVersion is " (PostgreSQL x.y)" of the server at databaseURL, or "" when it cannot be
// read.
func serverVersion(ctx context.Context, databaseURL string) string {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return ""
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var version string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		return ""
	}
	return " (PostgreSQL " + strings.Fields(version)[0] + ")"
}
