package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is the outcome of a run: one Row per measured figure, Checks for the targets that are
// not rates (peak RSS, lost jobs), and the misses of both spelled out.
type Report struct {
	// RunID names the run's databases: schemas pgload_<RunID>_*, or a postguard-load-* directory.
	RunID       string   `json:"run_id"`
	Engine      string   `json:"engine"`
	GOMAXPROCS  int      `json:"gomaxprocs"`
	NumCPU      int      `json:"num_cpu"`
	Concurrency int      `json:"concurrency"`
	Duration    string   `json:"duration"`
	Rows        []*Row   `json:"rows"`
	Checks      []Check  `json:"checks"`
	Notes       []string `json:"notes"`
	Misses      []string `json:"misses"`
	// Noise lists the comparisons whose two measurements saw different loads from other
	// processes: their ratios are not like for like.
	Noise []string `json:"noise"`
	// ServiceWarnings are the first warnings and errors the service logged, if any.
	ServiceWarnings []string `json:"service_warnings,omitempty"`
}

// Row is one measured figure.
type Row struct {
	Scenario string  `json:"scenario"`
	Unit     string  `json:"unit"` // what one request is: "req", "check", "hash", "mail"
	Clients  int     `json:"clients,omitempty"`
	Requests int64   `json:"requests"`
	Errors   int64   `json:"errors"`
	Seconds  float64 `json:"seconds"`
	Rate     float64 `json:"rate_per_second"`
	P50MS    float64 `json:"p50_ms"`
	P99MS    float64 `json:"p99_ms"`
	// CPUPerRequestUS is this process's user+sys CPU time during the measurement divided by the
	// requests: the service and its load clients together; the database server's CPU is not in it.
	CPUPerRequestUS float64 `json:"cpu_per_request_us"`
	// SysCPUPerRequestUS is the system (kernel) part of CPUPerRequestUS: page faults, madvise,
	// socket and futex calls.
	SysCPUPerRequestUS float64 `json:"sys_cpu_per_request_us"`
	// GCCPUPerRequestUS is the runtime's estimate of its garbage collector's CPU time over the
	// requests (part of CPUPerRequestUS), and GCCyclesPerRequest the collections per request.
	GCCPUPerRequestUS  float64 `json:"gc_cpu_per_request_us"`
	GCCyclesPerRequest float64 `json:"gc_cycles_per_request"`
	// GCCPUPercent is the garbage collector's CPU time as a share of the CPU time the runtime had
	// (runtime/metrics /cpu/classes/total: GOMAXPROCS × the measurement, idle included), and
	// GCCPUBusyPercent its share of the CPU this process used (user+sys).
	GCCPUPercent     float64 `json:"gc_cpu_percent"`
	GCCPUBusyPercent float64 `json:"gc_cpu_busy_percent"`
	// FaultsPerRequest is this process's minor page faults over the requests: memory the Go
	// runtime touches afresh, after getting it from the kernel or returning it (scavenging).
	FaultsPerRequest float64 `json:"minor_faults_per_request"`
	// SwitchesPerRequest and PreemptionsPerRequest are this process's voluntary and involuntary
	// context switches over the requests.
	SwitchesPerRequest    float64 `json:"context_switches_per_request"`
	PreemptionsPerRequest float64 `json:"preemptions_per_request"`
	// DBCPUPerRequestUS is the local PostgreSQL server's CPU time (all its processes) over the
	// requests; absent on SQLite rows or when the server is not on this machine.
	DBCPUPerRequestUS *float64 `json:"db_cpu_per_request_us,omitempty"`
	// RedisCPUPerRequestUS is the local Redis server's CPU time over the requests, on the row
	// whose limiter counts in Redis.
	RedisCPUPerRequestUS *float64 `json:"redis_cpu_per_request_us,omitempty"`
	// OthersPercent is the share of the machine's CPU capacity that other processes (neither
	// this one, PostgreSQL nor Redis) used during the measurement: a noisy neighbour shows here.
	OthersPercent *float64 `json:"others_cpu_percent,omitempty"`
	// Ratio is Rate over the Baseline row's rate (or Baseline's figure), when measured.
	Ratio    *float64 `json:"ratio,omitempty"`
	Baseline string   `json:"baseline,omitempty"`
	// Target is the least ratio wanted; Pass is set when there is a target and a ratio.
	Target *float64 `json:"target,omitempty"`
	Pass   *bool    `json:"pass,omitempty"`
	// ClientCap is, on a row whose every answer is held (forgot-password), the most requests a
	// second its clients can make: clients over the hold. CappedByClients is set when Rate is at
	// least cappedFraction of it: the figure then measures the clients, not the service, and no
	// comparison with it passes.
	ClientCap       *float64 `json:"client_cap_per_second,omitempty"`
	CappedByClients bool     `json:"capped_by_clients,omitempty"`
	// Counters is, on a flood's counters row, the counters table against its sizing.
	Counters *counterFigures `json:"counters,omitempty"`
	// Derived rows are computed from others (no requests of their own, no latency).
	Derived  bool   `json:"derived,omitempty"`
	Note     string `json:"note,omitempty"`
	FirstErr string `json:"first_error,omitempty"`
}

// Check is a target that is not a rate ratio.
type Check struct {
	Name   string `json:"name"`
	Value  string `json:"value"`
	Target string `json:"target"`
	Pass   bool   `json:"pass"`
}

func rowFromSample(scenario, unit string, clients int, s *sample) *Row {
	row := &Row{
		Scenario: scenario,
		Unit:     unit,
		Clients:  clients,
		Requests: s.requests,
		Errors:   s.errors,
		Seconds:  round(s.elapsed.Seconds(), 3),
		Rate:     round(s.rate(), 1),
		P50MS:    ms(s.hist.quantile(0.50)),
		P99MS:    ms(s.hist.quantile(0.99)),
	}
	if s.requests > 0 {
		n := float64(s.requests)
		row.CPUPerRequestUS = round(float64(s.cpu.self.Microseconds())/n, 1)
		row.SysCPUPerRequestUS = round(float64(s.cpu.proc.sys.Microseconds())/n, 1)
		row.FaultsPerRequest = round(float64(s.cpu.proc.minFaults)/n, 1)
		row.GCCPUPerRequestUS = round(float64(s.cpu.proc.gc.Microseconds())/n, 1)
		row.GCCyclesPerRequest = round(float64(s.cpu.proc.gcCycles)/n, 3)
		if s.cpu.proc.runtimeTotal > 0 {
			row.GCCPUPercent = round(100*float64(s.cpu.proc.gc)/float64(s.cpu.proc.runtimeTotal), 1)
		}
		if s.cpu.self > 0 {
			row.GCCPUBusyPercent = round(100*float64(s.cpu.proc.gc)/float64(s.cpu.self), 1)
		}
		row.SwitchesPerRequest = round(float64(s.cpu.proc.voluntary)/n, 1)
		row.PreemptionsPerRequest = round(float64(s.cpu.proc.preempted)/n, 1)
		if s.cpu.dbSeen {
			v := round(float64(s.cpu.db.Microseconds())/float64(s.requests), 1)
			row.DBCPUPerRequestUS = &v
		}
	}
	if s.cpu.others >= 0 {
		v := round(100*s.cpu.others, 1)
		row.OthersPercent = &v
	}
	if s.firstErr != nil {
		row.FirstErr = s.firstErr.Error()
	}
	return row
}

// engineRow is rowFromSample for a measurement on engine ("" when no database is involved): the
// PostgreSQL server's CPU is only reported for rows that use it.
func engineRow(scenario, unit string, clients int, s *sample, engine string) *Row {
	row := rowFromSample(scenario, unit, clients, s)
	if engine != enginePostgres {
		row.DBCPUPerRequestUS = nil
	}
	return row
}

func ms(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 3) }

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// row returns the row of a scenario, or nil.
func (r *Report) row(scenario string) *Row {
	for _, row := range r.Rows {
		if row.Scenario == scenario {
			return row
		}
	}
	return nil
}

// compare sets row's ratio to its rate over the baseline row's, and judges it against target
// (0: none). Without a usable baseline the ratio stays unset and the note says why.
func (r *Report) compare(row *Row, baseline string, target float64) {
	row.Baseline = baseline
	if target > 0 {
		row.Target = &target
	}
	base := r.row(baseline)
	switch {
	case base == nil:
		row.addNote("no ratio: " + baseline + " was not measured in this run")
		return
	case base.Rate <= 0:
		row.addNote("no ratio: " + baseline + " measured nothing")
		return
	}
	row.setRatio(row.Rate/base.Rate, target)
	if row.CappedByClients || base.CappedByClients {
		capped := row.Scenario
		if !row.CappedByClients {
			capped = baseline
		}
		row.addNote("no verdict: " + capped + " is capped by clients, so the ratio is not the service's")
		if row.Pass != nil {
			fail := false
			row.Pass = &fail
		}
	}

	if row.OthersPercent != nil && base.OthersPercent != nil {
		a, b := *row.OthersPercent, *base.OthersPercent
		if math.Abs(a-b) > noiseDiffPercent || max(a, b) > noiseMaxPercent {
			r.Noise = append(r.Noise, fmt.Sprintf(
				"%s vs %s: other processes took %.0f%% and %.0f%% of the machine's CPU during them: the ratio is not like for like; rerun on a quieter machine",
				row.Scenario, baseline, a, b))
		}
	}
}

// Thresholds of Report.Noise, in percent of the machine's CPU capacity used by other processes.
const (
	noiseDiffPercent = 10 // between a row and its baseline
	noiseMaxPercent  = 30 // during either
)

// setRatio sets the ratio and, with a target, the verdict.
func (row *Row) setRatio(ratio, target float64) {
	ratio = round(ratio, 3)
	row.Ratio = &ratio
	if target > 0 {
		pass := ratio >= target && row.Errors == 0 && row.Requests > 0
		row.Pass = &pass
	}
}

func (row *Row) addNote(note string) {
	if row.Note != "" {
		row.Note += "; "
	}
	row.Note += note
}

// finish lists the misses.
func (r *Report) finish() {
	r.Misses = nil
	for _, row := range r.Rows {
		if row.Pass == nil || *row.Pass {
			continue
		}
		why := fmt.Sprintf("%s: ratio %.3f to %s, target ≥ %.2f", row.Scenario, *row.Ratio, row.Baseline, *row.Target)
		if base := r.row(row.Baseline); row.CappedByClients || (base != nil && base.CappedByClients) {
			why += " — capped by clients: rerun with a larger -hold-concurrency"
		}
		if row.Errors > 0 {
			why += fmt.Sprintf(" (%d failed requests: %s)", row.Errors, row.FirstErr)
		}
		r.Misses = append(r.Misses, why)
	}
	for _, c := range r.Checks {
		if !c.Pass {
			r.Misses = append(r.Misses, fmt.Sprintf("%s: %s, target %s", c.Name, c.Value, c.Target))
		}
	}
	if r.Rows == nil {
		r.Rows = []*Row{}
	}
	if r.Checks == nil {
		r.Checks = []Check{}
	}
	if r.Notes == nil {
		r.Notes = []string{}
	}
	if r.Misses == nil {
		r.Misses = []string{}
	}
	if r.Noise == nil {
		r.Noise = []string{}
	}
}

func (r *Report) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("error writing report: %w", err)
	}
	return nil
}

func (r *Report) writeTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "postguard-load: engine %s, GOMAXPROCS %d (%d CPUs), concurrency %d, duration %s per measurement\n\n",
		r.Engine, r.GOMAXPROCS, r.NumCPU, r.Concurrency, r.Duration)

	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tclients\trequests\terrors\treq/s\tp50\tp99\tratio\tbaseline\ttarget\tresult\tCPU/req\tsys/req\tGC/req\tfaults/req\tDB CPU/req\tothers\t")
	for _, row := range r.Rows {
		clients, requests, errs, p50, p99, cpu, sys, gc, faults, dbCPU, others := "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-"
		if !row.Derived {
			clients = fmt.Sprint(row.Clients)
			requests = fmt.Sprint(row.Requests)
			errs = fmt.Sprint(row.Errors)
			p50, p99 = fmtMS(row.P50MS), fmtMS(row.P99MS)
			cpu = fmt.Sprintf("%.0fµs", row.CPUPerRequestUS)
			sys = fmt.Sprintf("%.0fµs", row.SysCPUPerRequestUS)
			gc = fmt.Sprintf("%.0fµs", row.GCCPUPerRequestUS)
			faults = fmt.Sprintf("%.0f", row.FaultsPerRequest)
			if row.DBCPUPerRequestUS != nil {
				dbCPU = fmt.Sprintf("%.0fµs", *row.DBCPUPerRequestUS)
			}
		}
		if row.OthersPercent != nil {
			others = fmt.Sprintf("%.0f%%", *row.OthersPercent)
		}
		ratio, baseline, target, result := "-", "-", "-", "-"
		if row.Ratio != nil {
			ratio = fmt.Sprintf("%.3f", *row.Ratio)
		}
		if row.Baseline != "" {
			baseline = row.Baseline
		}
		if row.Target != nil {
			target = fmt.Sprintf("≥ %.2f", *row.Target)
		}
		if row.Pass != nil {
			result = "pass"
			if !*row.Pass {
				result = "FAIL"
			}
		}
		if row.CappedByClients {
			result = "CAPPED"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1f %s/s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			row.Scenario, clients, requests, errs, row.Rate, row.Unit, p50, p99, ratio, baseline, target, result, cpu, sys, gc, faults, dbCPU, others)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("error writing report: %w", err)
	}

	if len(r.Checks) > 0 {
		b.WriteString("\nchecks:\n")
		for _, c := range r.Checks {
			result := "pass"
			if !c.Pass {
				result = "FAIL"
			}
			fmt.Fprintf(&b, "  %-4s %s: %s (target %s)\n", result, c.Name, c.Value, c.Target)
		}
	}

	var notes []string
	for _, row := range r.Rows {
		if row.Note != "" {
			notes = append(notes, row.Scenario+": "+row.Note)
		}
		if row.FirstErr != "" {
			notes = append(notes, fmt.Sprintf("%s: %d failed; first error: %s", row.Scenario, row.Errors, row.FirstErr))
		}
	}
	notes = append(notes, r.Notes...)
	if len(notes) > 0 {
		b.WriteString("\nnotes:\n")
		for _, n := range notes {
			fmt.Fprintf(&b, "  - %s\n", n)
		}
	}
	if len(r.ServiceWarnings) > 0 {
		b.WriteString("\nservice warnings (first ones):\n")
		for _, line := range r.ServiceWarnings {
			fmt.Fprintf(&b, "  %s\n", line)
		}
	}

	if len(r.Noise) > 0 {
		b.WriteString("\nNOISY COMPARISONS:\n")
		for _, n := range r.Noise {
			fmt.Fprintf(&b, "  ! %s\n", n)
		}
	}

	if len(r.Misses) == 0 {
		b.WriteString("\nAll targets met.\n")
	} else {
		fmt.Fprintf(&b, "\nMISSED TARGETS (%d):\n", len(r.Misses))
		for _, m := range r.Misses {
			fmt.Fprintf(&b, "  ✗ %s\n", m)
		}
	}

	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("error writing report: %w", err)
	}
	return nil
}

func fmtMS(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.2fs", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.0fms", v)
	default:
		return fmt.Sprintf("%.2fms", v)
	}
}
