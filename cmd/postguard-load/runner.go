package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
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

	// pending are the interleaved scenarios' second halves and rows (see later).
	pending []pendingStep

	// pairBound is ceiling/pair's rate over the first half of ceiling/fresh-keys, 0 until
	// measured: the bound the held rows' clients are sized by.
	pairBound float64
	// clientLimit is the most held clients this process can keep connected (its file
	// descriptors); sizing is the held rows' clients, chosen once (holdSizing).
	clientLimit clientLimit
	sizing      *holdSizing
	heldBatches int // the held measurements made so far, numbering their emails
}

// pendingStep is what an interleaved scenario does once the scenarios after it have measured:
// measure (its second half; may be nil), report (add its rows), cleanup (when the run stops
// before measure; may be nil).
type pendingStep struct {
	measure, report, cleanup func()
}

// interleavedScenarios run in a nest, so that a drift of the machine's load weighs on each row and
// its baseline alike: ceiling/fresh-keys (1/2), http-many-ips (1/2), sqlite/http-many-ips (1/2),
// redis/http-many-ips, sqlite/http-many-ips (2/2), http-many-ips (2/2), ceiling/fresh-keys (2/2).
// Each pushes its second half with later; the rows are added once all have measured, in the
// order of allScenarios.
var interleavedScenarios = []string{scenarioCeiling, scenarioManyIPs, scenarioSQLite, scenarioRedis}

// later queues an interleaved scenario's second half and rows (see pendingStep).
func (r *runner) later(measure, report, cleanup func()) {
	r.pending = append(r.pending, pendingStep{measure: measure, report: report, cleanup: cleanup})
}

// finishLater measures the queued second halves, the last queued first, then adds the rows in
// the order they were queued (a row's baseline before it).
func (r *runner) finishLater() {
	pending := r.pending
	r.pending = nil
	for i := len(pending) - 1; i >= 0; i-- {
		if pending[i].measure != nil {
			pending[i].measure()
		}
	}
	for _, p := range pending {
		p.report()
	}
}

// dropLater cleans up what is queued without measuring it, when the run stops early.
func (r *runner) dropLater() {
	pending := r.pending
	r.pending = nil
	for i := len(pending) - 1; i >= 0; i-- {
		if pending[i].cleanup != nil {
			pending[i].cleanup()
		}
	}
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

	r.clientLimit = r.fileLimit()

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
	defer r.dropLater()
	if r.engine == enginePostgres {
		r.report.Engine = enginePostgres + serverVersion(ctx, mainDB.url)
	}

	steps := []struct {
		scenario string
		run      func(ctx context.Context) error
	}{
		{scenarioCeiling, func(ctx context.Context) error { return r.ceiling(ctx, store) }},
		{scenarioManyIPs, func(ctx context.Context) error { return r.manyIPs(ctx, mainDB) }},
		{scenarioSQLite, r.sqliteManyIPs},
		{scenarioRedis, func(ctx context.Context) error { return r.redisManyIPs(ctx, mainDB) }},
		{scenarioHotIP, func(ctx context.Context) error { return r.hotIP(ctx, mainDB) }},
		{scenarioRegister, func(ctx context.Context) error { return r.register(ctx, mainDB) }},
		{scenarioEmailDrain, r.emailDrain},
		{scenarioFlood, r.flood},
	}
	for _, step := range steps {
		if !r.opts.selected(step.scenario) {
			continue
		}
		if !slices.Contains(interleavedScenarios, step.scenario) {
			r.finishLater()
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("interrupted before %s: %w", step.scenario, err)
		}
		if err := step.run(ctx); err != nil {
			return nil, fmt.Errorf("error in scenario %s: %w", step.scenario, err)
		}
	}
	r.finishLater() // when only interleaved scenarios ran
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("interrupted: %w", err)
	}

	r.report.Notes = append(r.report.Notes,
		"CPU/req is this process's user+sys CPU (service and load clients together) over requests; DB CPU/req is the local PostgreSQL "+
			"server's (all its processes; SQLite runs in-process, so its cost is in CPU/req; the local Redis server's is in the JSON "+
			"report's redis_cpu_per_request_us); others is the share of the machine's CPU capacity that other processes used "+
			"meanwhile (a noisy neighbour slows every figure it overlaps)",
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

// fileLimit raises the soft RLIMIT_NOFILE to the hard one and returns the held clients it allows;
// the report notes the limit when it bounds them or could not be read.
func (r *runner) fileLimit() clientLimit {
	soft, was, err := raiseFileLimit()
	switch {
	case err != nil && soft == 0:
		soft = fallbackFileLimit
		r.report.Notes = append(r.report.Notes, fmt.Sprintf("file descriptors: %v; assuming %d", err, soft))
	case err != nil:
		r.report.Notes = append(r.report.Notes, fmt.Sprintf("file descriptors: %v", err))
	case soft > was:
		r.report.Notes = append(r.report.Notes, fmt.Sprintf("file descriptors: RLIMIT_NOFILE raised from %d to its hard limit %d", was, soft))
	}
	return maxHoldClients(soft)
}

// fallbackFileLimit is the file-descriptor limit assumed when it cannot be read: the usual
// default soft limit.
const fallbackFileLimit = 1024
