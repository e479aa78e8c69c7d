package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, to read the flood's table sizes

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/jobs"
)

// Row names of the flood scenario, after its prefix (flood, or sqlite/flood on a PostgreSQL run).
const (
	floodCounters    = "/counters"
	floodPrune       = "/prune"
	floodDuringPrune = "/during-prune"
)

// floodPruneOffset is how far ahead of the clock the flood's prune runs: past every window of the
// flood (the longest rule's window, an hour, started at most the flood's duration ago) and
// COUNTER_RETENTION, so that every counter of the flood, and of the flood that goes on during
// the prune, is expired to it.
const floodPruneOffset = jobs.DefaultCounterRetention + 2*time.Hour

// floodMinPruneWindow is the least window of the flood measured during the prune, so that even a
// short prune's window holds answers (each is held ≥ 100 ms).
const floodMinPruneWindow = time.Second

// floodPruneBound bounds the prune of a flood of duration d: a prune that does not outpace the
// flood would never finish, as the flood's new counters are expired to it too.
func floodPruneBound(d time.Duration) time.Duration { return 2*d + 30*time.Second }

// counterFigures are the counters table after a flood, against its sizing (docs/operations.md,
// Sizing the counters table).
type counterFigures struct {
	// Rows is SELECT count(*) FROM rate_limit_counters after the flood, on a table empty before.
	Rows int64 `json:"rows"`
	// RulesPerRequest are the counters a fresh request creates: one per rule its route checks.
	RulesPerRequest int `json:"rules_per_request"`
	// Admitted are the flood's answered requests, its warm-up's included; Sent adds those cut
	// short at the end, which may have spent their checks before they were cut.
	Admitted int64 `json:"admitted"`
	Sent     int64 `json:"sent"`
	// PredictedMin and PredictedMax are the formula's rows within the flood, where no window
	// ends: RulesPerRequest × Admitted, and × Sent.
	PredictedMin int64 `json:"predicted_rows_min"`
	PredictedMax int64 `json:"predicted_rows_max"`
	// Bytes is the table's growth over the flood, its indexes included: PostgreSQL's
	// pg_total_relation_size, SQLite's pages of the table (dbstat). IndexBytes is the indexes'
	// part: none on SQLite, whose counters are one WITHOUT ROWID B-tree.
	Bytes       int64   `json:"bytes"`
	IndexBytes  int64   `json:"index_bytes"`
	BytesPerRow float64 `json:"bytes_per_row"`
	// SteadyRows is the formula at the flood's admitted rate held for good, with the default
	// windows, COUNTER_RETENTION and COUNTER_PRUNE_INTERVAL: rate × Σ(window + retention +
	// interval) over the rules; SteadyBytes is it at BytesPerRow.
	SteadyRows  int64 `json:"steady_rows"`
	SteadyBytes int64 `json:"steady_bytes"`
	// RowsAfterPrune and BytesAfterPrune are the table once the prune has run (with the flood
	// still creating counters meanwhile).
	RowsAfterPrune  int64 `json:"rows_after_prune"`
	BytesAfterPrune int64 `json:"bytes_after_prune"`
	// FileBytesAfterPrune is, on SQLite, the database file's size then (page_count × page_size):
	// the pages the prune freed stay in it, for later writes.
	FileBytesAfterPrune int64 `json:"file_bytes_after_prune,omitempty"`
}

// flood measures a fresh-key flood (a botnet: every request a new key, which the deny cache
// cannot help) on the run's engine, and again on SQLite when the sqlite scenario runs on a
// PostgreSQL run.
func (r *runner) flood(ctx context.Context) error {
	if err := r.floodOn(ctx, r.engine, scenarioFlood); err != nil {
		return err
	}
	if r.engine == enginePostgres && r.opts.selected(scenarioSQLite) {
		return r.floodOn(ctx, engineSQLite, engineSQLite+"/"+scenarioFlood)
	}
	return nil
}

// floodOn posts forgot-password for -flood-duration on a database of its own, each request from a
// new client IP with a new unknown email, under the service's default rules (so the counters have
// their real windows), every one admitted; then it reads the counters table against the formula,
// and runs the counters' prune (jobs' own worker, its batches and pauses) with every counter
// expired to its clock while the flood goes on, measuring both.
func (r *runner) floodOn(ctx context.Context, engine, name string) error {
	d, cleanup, err := r.newDatabase(ctx, engine, "flood")
	if err != nil {
		return err
	}
	defer cleanup()
	rules := abuse.DefaultRules()
	sizing := r.holdSizing()
	svc, err := r.startService(ctx, name, d, rules, sizing.clients, nil)
	if err != nil {
		return err
	}
	defer svc.close()
	table, err := openCounterTable(ctx, d)
	if err != nil {
		return err
	}
	defer table.close()
	before, err := table.read(ctx)
	if err != nil {
		return err
	}

	var admitted, sent atomic.Int64
	batch := 0
	post := func() loadFunc {
		batch++
		prefix := `{"email":"flood-` + r.tag + `-` + name + `-` + strconv.Itoa(batch) + `-`
		return func(ctx context.Context, seq uint64) error {
			sent.Add(1)
			body := prefix + strconv.FormatUint(seq, 10) + `@example.com"}`
			err := svc.post(ctx, "/v1/auth/forgot-password", r.nextIP(), body, http.StatusAccepted)
			if err == nil {
				admitted.Add(1)
			}
			return err
		}
	}

	s := r.measure(ctx, name, "req", sizing.clients, r.opts.FloodDuration, post())
	floodRow := r.heldRow(name, s, d.engine, "forgot-password for -flood-duration under the service's default rules, "+
		"each request from a new client IP with a new unknown email (a botnet: the deny cache cannot help), every one admitted: "+
		"a counter per rule checked")
	r.report.Rows = append(r.report.Rows, floodRow)

	after, err := table.read(ctx)
	if err != nil {
		return err
	}
	figures := newCounterFigures(rules, before, after, admitted.Load(), sent.Load(), s.rate())
	countersRow := &Row{
		Scenario: name + floodCounters,
		Unit:     "row",
		Requests: figures.Rows,
		Seconds:  floodRow.Seconds,
		Rate:     round(float64(figures.Rows)/max(s.elapsed.Seconds(), 1e-9), 1),
		Derived:  true,
		Counters: figures,
	}
	r.report.Rows = append(r.report.Rows, countersRow)
	r.report.Checks = append(r.report.Checks, Check{
		Name:   name + ": counters rows against the formula (no window ends within the flood)",
		Value:  fmt.Sprintf("%d rows", figures.Rows),
		Target: fmt.Sprintf("%d × admitted = %d … %d × sent = %d", figures.RulesPerRequest, figures.PredictedMin, figures.RulesPerRequest, figures.PredictedMax),
		Pass:   figures.Rows >= figures.PredictedMin && figures.Rows <= figures.PredictedMax,
	})

	prune, during, err := r.floodPrune(ctx, name, svc, sizing.clients, post())
	if err != nil {
		return err
	}
	pruneRow := &Row{
		Scenario: name + floodPrune,
		Unit:     "row",
		Clients:  1,
		Requests: prune.deleted,
		Seconds:  round(prune.elapsed.Seconds(), 3),
		Rate:     round(prune.rate(), 1),
		P50MS:    ms(prune.hist.quantile(0.50)),
		P99MS:    ms(prune.hist.quantile(0.99)),
		Derived:  true,
		Note: fmt.Sprintf("the counters' prune (jobs.PruneCountersWorker: its batches of up to %d rows and pauses) with every counter "+
			"expired to its clock, while the flood goes on (the flood's new counters expired too, so it deletes more than the table "+
			"held): %d batches in %d attempts, a batch's delete p50 %s, p99 %s (on SQLite what a check may wait behind it); "+
			"it must outpace the %.0f counters/s the flood creates", prune.maxBatch, prune.batches, prune.attempts,
			fmtMS(ms(prune.hist.quantile(0.50))), fmtMS(ms(prune.hist.quantile(0.99))), float64(figures.RulesPerRequest)*s.rate()),
	}
	r.report.Rows = append(r.report.Rows, pruneRow)
	creation := float64(figures.RulesPerRequest) * s.rate()
	check := Check{
		Name:   name + ": the counters' prune outpaces the flood",
		Value:  fmt.Sprintf("%.0f rows/s deleted", prune.rate()),
		Target: fmt.Sprintf("> %.0f rows/s (%d counters × %.0f req/s) and done", creation, figures.RulesPerRequest, s.rate()),
		Pass:   prune.rate() > creation && !prune.stopped,
	}
	if prune.stopped {
		why := fmt.Sprintf("STOPPED after %.0f s (2 × -flood-duration + 30 s) with counters left: it did not catch up with the flood", prune.elapsed.Seconds())
		pruneRow.addNote(why)
		check.Value += ", " + why
	}
	r.report.Checks = append(r.report.Checks, check)

	duringRow := r.heldRow(name+floodDuringPrune, during, d.engine, fmt.Sprintf(
		"the flood while the prune runs (%.1f s of this %.1f s window, at least %s), compared with the flood before it",
		prune.elapsed.Seconds(), during.elapsed.Seconds(), fmtSeconds(floodMinPruneWindow)))
	r.report.Rows = append(r.report.Rows, duringRow)
	r.report.compare(duringRow, name, 0)

	afterPrune, err := table.read(ctx)
	if err != nil {
		return err
	}
	figures.RowsAfterPrune, figures.BytesAfterPrune, figures.FileBytesAfterPrune = afterPrune.rows, afterPrune.bytes, afterPrune.fileBytes
	countersRow.Note = figures.note(d.engine)
	return nil
}

// newCounterFigures compares the table after a flood with before, against the formula for the
// rules of forgot-password at the flood's admitted rate.
func newCounterFigures(rules abuse.Rules, before, after tableSize, admitted, sent int64, rate float64) *counterFigures {
	var windows []time.Duration
	for _, scope := range []abuse.Scope{abuse.ScopeIP, abuse.ScopeEmail} {
		if rule, ok := rules.Get(abuse.ActionForgotPassword, scope); ok {
			windows = append(windows, rule.Window)
		}
	}
	f := &counterFigures{
		Rows:            after.rows - before.rows,
		RulesPerRequest: len(windows),
		Admitted:        admitted,
		Sent:            sent,
		PredictedMin:    int64(len(windows)) * admitted,
		PredictedMax:    int64(len(windows)) * sent,
		Bytes:           after.bytes - before.bytes,
		IndexBytes:      after.indexBytes - before.indexBytes,
	}
	if f.Rows > 0 {
		f.BytesPerRow = round(float64(f.Bytes)/float64(f.Rows), 1)
	}
	var life time.Duration
	for _, w := range windows {
		life += w + jobs.DefaultCounterRetention + jobs.DefaultCounterPruneInterval
	}
	f.SteadyRows = int64(rate * life.Seconds())
	f.SteadyBytes = int64(float64(f.SteadyRows) * f.BytesPerRow)
	return f
}

// note is the counters row's note.
func (f *counterFigures) note(engine string) string {
	size := "pg_total_relation_size (heap and indexes)"
	after := " (PostgreSQL keeps a table's pages: (auto)vacuum makes the dead rows' room reusable)"
	if engine == engineSQLite {
		size = "dbstat's pages of the table, one WITHOUT ROWID B-tree (no index)"
		after = fmt.Sprintf(" of table pages; the file keeps %s (page_count × page_size): the freed pages, for later writes", fmtBytes(f.FileBytesAfterPrune))
	}
	return fmt.Sprintf("SELECT count(*) FROM rate_limit_counters after the flood: %d rows for %d admitted requests (%d sent, the ones cut "+
		"short at the end included), %d counters each: the formula (admitted rate × (window + COUNTER_RETENTION), where no window ends "+
		"within the flood) says %d … %d. Size (%s): %s, of which indexes %s: %.0f bytes per row. Held for good at this rate, the "+
		"formula with the default windows (15m, 1h), COUNTER_RETENTION %s and a COUNTER_PRUNE_INTERVAL %s more says %d rows, %s. "+
		"After the prune: %d rows, %s",
		f.Rows, f.Admitted, f.Sent, f.RulesPerRequest, f.PredictedMin, f.PredictedMax, size, fmtBytes(f.Bytes), fmtBytes(f.IndexBytes),
		f.BytesPerRow, fmtDuration(jobs.DefaultCounterRetention), fmtDuration(jobs.DefaultCounterPruneInterval), f.SteadyRows,
		fmtBytes(f.SteadyBytes), f.RowsAfterPrune, fmtBytes(f.BytesAfterPrune)) + after
}

// pruneSample is what the flood's prune did.
type pruneSample struct {
	deleted  int64
	batches  int
	maxBatch int
	attempts int
	elapsed  time.Duration
	hist     histogram // each batch's delete
	// stopped says the prune was stopped at floodPruneBound, its counters not all deleted.
	stopped bool
}

func (p *pruneSample) rate() float64 {
	if p.elapsed <= 0 {
		return 0
	}
	return float64(p.deleted) / p.elapsed.Seconds()
}

// floodPrune goes on with the flood (fn) and, once its warm-up is over, runs the counters' prune
// on the service's own store with a clock floodPruneOffset ahead, attempt after attempt (an
// attempt that spent its budget snoozes) until it has nothing left; the flood is measured over
// the prune's run, and at least floodMinPruneWindow.
func (r *runner) floodPrune(ctx context.Context, name string, svc *loadService, clients int, fn loadFunc) (*pruneSample, *sample, error) {
	meter := &pruneMeter{Tables: svc.svc.Store}
	workers, err := jobs.NewWorkers(&jobs.Deps{
		Store:      meter,
		Recipients: jobs.UserRecipients(meter),
		Logger:     r.logger,
	}, &jobs.Config{
		Secret:           r.secret,
		AppURL:           appURL,
		CounterRetention: jobs.DefaultCounterRetention,
		NowFunc:          func() time.Time { return time.Now().Add(floodPruneOffset) },
	})
	if err != nil {
		return nil, nil, fmt.Errorf("error building the counters' prune: %w", err)
	}

	floodCtx, stopFlood := context.WithCancel(ctx)
	defer stopFlood()
	counting := make(chan struct{})
	floodDone := make(chan *sample, 1)
	go func() {
		floodDone <- r.measureFrom(floodCtx, name+floodDuringPrune, "req", clients, maxDuration, fn, counting)
	}()
	select {
	case <-counting:
	case <-ctx.Done():
		stopFlood()
		<-floodDone
		return nil, nil, ctx.Err()
	}

	start := time.Now()
	pruneCtx, cancel := context.WithTimeout(ctx, floodPruneBound(r.opts.FloodDuration))
	attempts, err := runPrune(pruneCtx, workers.PruneCounters)
	cancel()
	elapsed := time.Since(start)
	stopped := err != nil && pruneCtx.Err() != nil && ctx.Err() == nil
	if stopped {
		err = nil
	}
	if err == nil {
		sleepContext(ctx, floodMinPruneWindow-elapsed)
	}
	r.warnings.mute(true) // the requests the stop cuts short warn, by the tool's doing
	stopFlood()
	during := <-floodDone
	if err != nil {
		return nil, nil, fmt.Errorf("error in the counters' prune: %w", err)
	}
	prune := meter.sample()
	prune.attempts = attempts
	prune.elapsed = elapsed
	prune.stopped = stopped
	return prune, during, nil
}

// runPrune works the counters' prune as River would, again after each snooze, until an attempt
// finds nothing more to delete; it returns the attempts.
func runPrune(ctx context.Context, worker *jobs.PruneCountersWorker) (int, error) {
	for attempt := 1; ; attempt++ {
		err := worker.Work(ctx, &river.Job[jobs.PruneCountersArgs]{
			JobRow: &rivertype.JobRow{ID: 1, Attempt: attempt, Kind: jobs.PruneCountersArgs{}.Kind()},
		})
		var snooze *rivertype.JobSnoozeError
		switch {
		case err == nil:
			return attempt, nil
		case errors.As(err, &snooze) && ctx.Err() == nil:
			continue
		default:
			return attempt, err
		}
	}
}

// pruneMeter counts and times the counters' deletes of the Tables it wraps.
type pruneMeter struct {
	db.Tables

	mu       sync.Mutex
	deleted  int64
	batches  int
	maxBatch int
	hist     histogram
}

// RateLimitCounterDeleteExpired implements db.Tables.
func (m *pruneMeter) RateLimitCounterDeleteExpired(ctx context.Context, before time.Time, limit int) (int64, error) {
	start := time.Now()
	n, err := m.Tables.RateLimitCounterDeleteExpired(ctx, before, limit)
	d := time.Since(start)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err == nil {
		m.deleted += n
		m.batches++
		m.maxBatch = max(m.maxBatch, limit)
		m.hist.record(d)
	}
	return n, err
}

func (m *pruneMeter) sample() *pruneSample {
	m.mu.Lock()
	defer m.mu.Unlock()
	return &pruneSample{deleted: m.deleted, batches: m.batches, maxBatch: m.maxBatch, hist: m.hist}
}

// tableSize is the counters table's rows and bytes at one moment.
type tableSize struct {
	rows, bytes, indexBytes int64
	fileBytes               int64 // SQLite's file, page_count × page_size
}

// counterTable reads the counters table of a flood's database over a connection of its own.
type counterTable struct {
	pg   *pgx.Conn
	lite *sql.DB
}

func openCounterTable(ctx context.Context, d *database) (*counterTable, error) {
	if d.engine == enginePostgres {
		conn, err := pgx.Connect(ctx, d.url)
		if err != nil {
			return nil, fmt.Errorf("error connecting to read the counters table: %w", err)
		}
		return &counterTable{pg: conn}, nil
	}
	lite, err := sql.Open("sqlite", d.path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		return nil, fmt.Errorf("error opening %s to read the counters table: %w", d.path, err)
	}
	lite.SetMaxOpenConns(1)
	return &counterTable{lite: lite}, nil
}

func (c *counterTable) read(ctx context.Context) (tableSize, error) {
	var s tableSize
	var err error
	if c.pg != nil {
		err = c.pg.QueryRow(ctx, `
			SELECT (SELECT count(*) FROM rate_limit_counters),
				pg_total_relation_size('rate_limit_counters'), pg_indexes_size('rate_limit_counters')`).
			Scan(&s.rows, &s.bytes, &s.indexBytes)
	} else {
		// dbstat is SQLite's virtual table of every page, by b-tree: the table's rows, and any
		// index of it, all named in sqlite_master with the table's name (since the limiter's
		// migration 4 there is none: the table is ordered by its primary key).
		err = c.lite.QueryRowContext(ctx, `
			SELECT (SELECT count(*) FROM rate_limit_counters),
				(SELECT coalesce(sum(pgsize), 0) FROM dbstat
					WHERE name IN (SELECT name FROM sqlite_master WHERE tbl_name = 'rate_limit_counters')),
				(SELECT coalesce(sum(pgsize), 0) FROM dbstat
					WHERE name IN (SELECT name FROM sqlite_master WHERE tbl_name = 'rate_limit_counters' AND type = 'index')),
				(SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size())`).
			Scan(&s.rows, &s.bytes, &s.indexBytes, &s.fileBytes)
	}
	if err != nil {
		return s, fmt.Errorf("error reading the counters table's size: %w", err)
	}
	return s, nil
}

func (c *counterTable) close() {
	if c.pg != nil {
		_ = c.pg.Close(context.Background())
	}
	if c.lite != nil {
		_ = c.lite.Close()
	}
}

// fmtBytes is n in kB, MB or GB (powers of ten).
func fmtBytes(n int64) string {
	switch v := float64(n); {
	case v >= 1e9:
		return fmt.Sprintf("%.1f GB", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.1f MB", v/1e6)
	default:
		return fmt.Sprintf("%.0f kB", v/1e3)
	}
}

// fmtDuration is d without its zero parts: 24h, 1m, 15m.
func fmtDuration(d time.Duration) string {
	s := d.String()
	for _, zero := range []struct{ suffix, short string }{{"h0m0s", "h"}, {"m0s", "m"}} {
		if len(s) > len(zero.suffix) && s[len(s)-len(zero.suffix):] == zero.suffix {
			return s[:len(s)-len(zero.suffix)] + zero.short
		}
	}
	return s
}
