package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/dbtest"
)

// TestRun runs every scenario with tiny durations and counts, on SQLite and on PostgreSQL, and
// checks the report's structure: every figure measured, every request answered as expected,
// every ratio and verdict present. It guards the tool against the service's code moving under it.
//
// The two engines run one after the other, not in parallel: each run measures CPU-bound work
// (argon2id above all) in windows of a few hundred milliseconds, and two runs at once on a small
// machine would starve each other's windows of any completed request.
func TestRun(t *testing.T) {
	t.Parallel()

	withRedis := redisReachable(t)

	t.Run("SQLite", func(t *testing.T) { //nolint:paralleltest // see above
		dir := t.TempDir()
		report := runTool(t, "sqlite://"+filepath.Join(dir, "never-opened.db"))
		require.Equal(t, engineSQLite, report.Engine)
		requireRows(t, report, false, withRedis)
		require.Contains(t, strings.Join(report.Notes, "\n"), "sqlite: skipped")

		_, err := os.Stat(filepath.Join(dir, "never-opened.db"))
		require.ErrorIs(t, err, os.ErrNotExist, "the tool must not open sqlite://PATH itself")
		leftovers, err := filepath.Glob(filepath.Join(dir, "postguard-load-*"))
		require.NoError(t, err)
		require.Empty(t, leftovers, "the run's SQLite files are removed")
	})

	t.Run("Postgres", func(t *testing.T) { //nolint:paralleltest // see above
		databaseURL := dbtest.DatabaseURL(t)
		report := runTool(t, databaseURL)
		require.True(t, strings.HasPrefix(report.Engine, enginePostgres), report.Engine)
		requireRows(t, report, true, withRedis)

		// Its schemas are dropped.
		conn, err := pgx.Connect(t.Context(), databaseURL)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		var schemas int
		require.NoError(t, conn.QueryRow(t.Context(),
			"SELECT count(*) FROM pg_namespace WHERE starts_with(nspname, $1)", schemaPrefix+report.RunID).Scan(&schemas))
		require.Zero(t, schemas)
	})
}

// runTool runs the tool on databaseURL with tiny settings and returns its JSON report.
func runTool(t *testing.T, databaseURL string) *Report {
	t.Helper()

	var stdout, stderr bytes.Buffer
	err := run(t.Context(), []string{
		"-database-url", databaseURL,
		"-duration", "300ms",
		"-flood-duration", "300ms",
		"-concurrency", "4",
		"-hold-concurrency", "16",
		"-registrations", "4",
		"-mails", "10",
		"-existing-keys", "50",
		"-budget", "50",
		"-json",
	}, func(string) string { return "" }, &stdout, &stderr)
	require.NoError(t, err, "stderr:\n%s", stderr.String())

	var report Report
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &report), "stdout:\n%s", stdout.String())
	require.Contains(t, stderr.String(), "\r"+rowCeilingFresh, "progress lines on stderr")
	return &report
}

// requireRows checks that every scenario produced its rows, with requests, no failures, and
// the ratios and verdicts of the targets.
func requireRows(t *testing.T, report *Report, withSQLite, withRedis bool) {
	t.Helper()

	want := []string{rowCeilingFresh, "ceiling/existing-keys", "ceiling/hot-key", rowCeilingPair, scenarioManyIPs}
	if withSQLite {
		want = append(want, rowSQLite)
	}
	if withRedis {
		want = append(want, rowRedis, rowManyIPsRedis)
	} else {
		require.Contains(t, strings.Join(report.Notes, "\n"), rowRedis+": skipped: no Redis at ")
	}
	want = append(want, scenarioHotIP, rowHash, scenarioRegister, rowDrainNoop, rowDrainResend, rowDrainSMTP, rowDrainBudget)
	floods := []string{scenarioFlood}
	if withSQLite {
		floods = append(floods, engineSQLite+"/"+scenarioFlood)
	}
	for _, flood := range floods {
		want = append(want, flood, flood+floodCounters, flood+floodPrune, flood+floodDuringPrune)
	}
	var got []string
	for _, row := range report.Rows {
		got = append(got, row.Scenario)
	}
	require.Equal(t, want, got)

	targeted := []string{scenarioManyIPs, rowManyIPsRedis, scenarioHotIP, scenarioRegister, rowDrainResend, rowDrainSMTP, rowDrainBudget, rowSQLite}
	held := []string{scenarioManyIPs, rowRedis, rowSQLite}
	for _, flood := range floods {
		held = append(held, flood, flood+floodDuringPrune)
	}
	for _, row := range report.Rows {
		require.Positive(t, row.Requests, row.Scenario)
		require.Positive(t, row.Rate, row.Scenario)
		require.Zero(t, row.Errors, "%s: %s", row.Scenario, row.FirstErr)
		if !row.Derived {
			require.Positive(t, row.P99MS, row.Scenario)
			require.GreaterOrEqual(t, row.P99MS, row.P50MS, row.Scenario)
			require.Positive(t, row.CPUPerRequestUS, row.Scenario)
			require.LessOrEqual(t, row.SysCPUPerRequestUS, row.CPUPerRequestUS, row.Scenario)
		}
		if slices.Contains(targeted, row.Scenario) {
			require.NotNil(t, row.Ratio, row.Scenario)
			require.NotNil(t, row.Target, row.Scenario)
			require.NotNil(t, row.Pass, row.Scenario)
			require.NotEmpty(t, row.Baseline, row.Scenario)
		}
		if slices.Contains(held, row.Scenario) {
			// -hold-concurrency 16 (runTool): 16 clients held ≥ 100ms each.
			require.Equal(t, 16, row.Clients, row.Scenario)
			require.NotNil(t, row.ClientCap, row.Scenario)
			require.InDelta(t, 160, *row.ClientCap, 1e-9, row.Scenario)
		}
	}
	require.Contains(t, strings.Join(report.Notes, "\n"), "clients 16 (-hold-concurrency); the hold caps each of them at 16/0.1 s = 160 req/s")
	require.Contains(t, report.row(scenarioRegister).Note, "ms of CPU per registration")
	require.Len(t, report.Checks, 3+2*len(floods))
	require.Contains(t, report.Checks[0].Name, "peak RSS")
	require.Contains(t, report.Checks[1].Name, "no 429")
	require.Contains(t, report.Checks[2].Name, "loses no mail")
	require.True(t, report.Checks[2].Pass, report.Checks[2].Value)
	for i, flood := range floods {
		requireFlood(t, report, flood, report.Checks[3+2*i:5+2*i])
	}

	// Every miss is spelled out.
	misses := 0
	for _, row := range report.Rows {
		if row.Pass != nil && !*row.Pass {
			misses++
		}
	}
	for _, c := range report.Checks {
		if !c.Pass {
			misses++
		}
	}
	require.Len(t, report.Misses, misses)
}

// requireFlood checks the flood's rows: its counters table holds a counter per rule per admitted
// request (within the flood no window ends), measured in bytes; the prune deleted at least all
// of them, in bounded batches; the flood during the prune is compared with the flood before it.
func requireFlood(t *testing.T, report *Report, flood string, checks []Check) {
	t.Helper()

	counters := report.row(flood + floodCounters)
	figures := counters.Counters
	require.NotNil(t, figures, flood)
	require.Equal(t, 2, figures.RulesPerRequest, "forgot-password: an IP counter and an email counter")
	require.Positive(t, figures.Admitted)
	require.Equal(t, 2*figures.Admitted, figures.PredictedMin)
	require.Equal(t, 2*figures.Sent, figures.PredictedMax)
	require.GreaterOrEqual(t, figures.Rows, figures.PredictedMin, "every admitted request left its two counters")
	require.LessOrEqual(t, figures.Rows, figures.PredictedMax, "no request left more than two")
	require.Equal(t, figures.Rows, counters.Requests)
	require.Positive(t, figures.Bytes)
	if report.Engine == engineSQLite || strings.HasPrefix(flood, engineSQLite+"/") {
		require.Zero(t, figures.IndexBytes, "SQLite's counters are one B-tree, the table's")
	} else {
		require.Positive(t, figures.IndexBytes)
		require.Less(t, figures.IndexBytes, figures.Bytes)
	}
	require.InDelta(t, float64(figures.Bytes)/float64(figures.Rows), figures.BytesPerRow, 0.1)
	require.Positive(t, figures.SteadyRows)
	require.Contains(t, counters.Note, "SELECT count(*) FROM rate_limit_counters")

	prune := report.row(flood + floodPrune)
	require.GreaterOrEqual(t, prune.Requests, figures.Rows, "the prune deleted every counter of the flood (and the flood's new ones)")
	require.Positive(t, prune.Seconds)
	require.Positive(t, prune.P99MS)
	require.Contains(t, prune.Note, "batches of up to 10000 rows")
	require.NotContains(t, prune.Note, "STOPPED")

	during := report.row(flood + floodDuringPrune)
	require.Equal(t, flood, during.Baseline)
	require.NotNil(t, during.Ratio)

	require.Contains(t, checks[0].Name, flood+": counters rows against the formula")
	require.True(t, checks[0].Pass, checks[0].Value)
	require.Contains(t, checks[1].Name, flood+": the counters' prune outpaces the flood")
}

func TestReport_WriteTable(t *testing.T) {
	t.Parallel()

	ratio, target, fail, others := 0.3, 0.4, false, 12.0
	report := &Report{
		Engine: "postgres", GOMAXPROCS: 2, NumCPU: 2, Concurrency: 16, Duration: "5s",
		Rows: []*Row{
			{Scenario: rowCeilingPair, Unit: "pair", Rate: 4000, Derived: true},
			{
				Scenario: scenarioManyIPs, Unit: "req", Clients: 512, Requests: 6000, Rate: 1200, P50MS: 250, P99MS: 1500,
				CPUPerRequestUS: 600, SysCPUPerRequestUS: 40, GCCPUPerRequestUS: 20, FaultsPerRequest: 3, OthersPercent: &others,
				Ratio: &ratio, Baseline: rowCeilingPair, Target: &target, Pass: &fail,
			},
		},
		Checks: []Check{{Name: "register peak RSS", Value: "140 MiB", Target: "≤ 256 MiB", Pass: true}},
	}
	report.finish()

	var out bytes.Buffer
	require.NoError(t, report.writeTable(&out))
	text := out.String()
	require.Contains(t, text, "engine postgres")
	require.Regexp(t, `http-many-ips\s+512\s+6000\s+0\s+1200\.0 req/s\s+250ms\s+1\.50s\s+0\.300\s+ceiling/pair\s+≥ 0\.40\s+FAIL\s+600µs\s+40µs\s+20µs\s+3\s+-\s+12%`, text)
	require.Contains(t, text, "pass register peak RSS: 140 MiB")
	require.Contains(t, text, "MISSED TARGETS (1):\n  ✗ http-many-ips: ratio 0.300 to ceiling/pair, target ≥ 0.40")
}

func TestReport_Compare(t *testing.T) {
	t.Parallel()

	quiet, busy := 2.0, 40.0
	report := &Report{Rows: []*Row{
		{Scenario: "base", Rate: 100, OthersPercent: &quiet},
		{Scenario: "fast", Rate: 150, Requests: 1, OthersPercent: &quiet},
		{Scenario: "slow", Rate: 30, Requests: 1, OthersPercent: &busy},
	}}
	report.compare(report.row("fast"), "base", 1.5)
	report.compare(report.row("slow"), "base", 0.4)
	report.compare(report.row("base"), "missing", 0.5)

	require.InDelta(t, 1.5, *report.row("fast").Ratio, 1e-9)
	require.True(t, *report.row("fast").Pass)
	require.False(t, *report.row("slow").Pass)
	require.Nil(t, report.row("base").Ratio)
	require.Contains(t, report.row("base").Note, "missing was not measured")
	require.Len(t, report.Noise, 1)
	require.Contains(t, report.Noise[0], "slow vs base")
}

func TestHistogram_Quantile(t *testing.T) {
	t.Parallel()

	var h histogram
	require.Zero(t, h.quantile(0.5))
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Millisecond)
	}
	for _, tt := range []struct {
		q    float64
		want time.Duration
	}{
		{0.5, 500 * time.Millisecond},
		{0.99, 990 * time.Millisecond},
		{1, 1000 * time.Millisecond},
	} {
		require.InEpsilon(t, float64(tt.want), float64(h.quantile(tt.q)), 0.03, "q=%v", tt.q)
	}

	// Exact below 64ns, and every bucket's middle maps back to it.
	for i := range histogramBuckets - 1 {
		require.Equal(t, i, histogramIndex(histogramValue(i)), "bucket %d", i)
	}
	require.Equal(t, histogramBuckets-1, histogramIndex(time.Hour), "longer than the last bucket")
}

func TestParseVmHWM(t *testing.T) {
	t.Parallel()

	kib, err := parseVmHWM(strings.NewReader("Name:\tx\nVmPeak:\t  2000 kB\nVmHWM:\t  145432 kB\nVmRSS:\t 1000 kB\n"))
	require.NoError(t, err)
	require.Equal(t, int64(145432)<<10, kib)

	_, err = parseVmHWM(strings.NewReader("Name:\tx\n"))
	require.Error(t, err)

	peak, err := peakRSS()
	require.NoError(t, err)
	require.Positive(t, peak)
}

func TestParseProcStat(t *testing.T) {
	t.Parallel()

	comm, utime, stime, ok := parseProcStat([]byte("2194 (postgres) S 1 2194 2194 0 -1 4194560 1873 0 0 0 17 42 0 0 20 0 1 0 1234 0\n"))
	require.True(t, ok)
	require.Equal(t, "postgres", comm)
	require.Equal(t, int64(17), utime)
	require.Equal(t, int64(42), stime)

	comm, _, _, ok = parseProcStat([]byte("7 (a (b) c) R 1 1 1 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 0\n"))
	require.True(t, ok)
	require.Equal(t, "a (b) c", comm)

	_, _, _, ok = parseProcStat([]byte("garbage"))
	require.False(t, ok)
}

func TestParseOptions(t *testing.T) {
	t.Parallel()

	noEnv := func(string) string { return "" }

	opts, err := parseOptions(nil, noEnv, &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, databaseURLFallback, opts.DatabaseURL)
	require.Equal(t, 16, opts.Concurrency)
	require.Equal(t, 5*time.Second, opts.Duration)
	require.Equal(t, time.Minute, opts.FloodDuration)
	require.Equal(t, allScenarios, opts.Scenarios)
	require.Equal(t, 200, opts.Registrations)
	require.Equal(t, 500, opts.Mails)
	require.Zero(t, opts.HoldConcurrency, "sized by the tool")
	require.Equal(t, redisURLFallback, opts.RedisURL)

	opts, err = parseOptions([]string{"-scenarios", "register, ceiling,register"}, func(key string) string {
		if key == "TEST_DATABASE_URL" {
			return "postgres://elsewhere/db"
		}
		return ""
	}, &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, "postgres://elsewhere/db", opts.DatabaseURL)
	require.Equal(t, []string{scenarioRegister, scenarioCeiling}, opts.Scenarios)

	for _, args := range [][]string{
		{"-scenarios", "nope"},
		{"-concurrency", "0"},
		{"-duration", "1h"},
		{"-flood-duration", "0s"},
		{"-flood-duration", "11m"},
		{"-database-url", "mysql://x"},
		{"-fetch-cooldown", "0s"},
		{"-hold-concurrency", "-1"},
		{"-hold-concurrency", "10001"},
		{"-redis-url", "http://127.0.0.1:6379"},
		{"-scenarios", "redis-baseline"},
		{"stray"},
	} {
		var stderr bytes.Buffer
		_, err := parseOptions(args, noEnv, &stderr)
		require.ErrorIs(t, err, errUsage, "%v", args)
		require.NotEmpty(t, stderr.String(), "%v", args)
	}
}

func TestCPUSnapshot_Since(t *testing.T) {
	t.Parallel()

	start := cpuSnapshot{
		self: time.Second,
		proc: procCounters{
			user: 800 * time.Millisecond, sys: 200 * time.Millisecond, minFaults: 100, voluntary: 10, preempted: 5,
			gc: 50 * time.Millisecond, gcCycles: 7, runtimeTotal: 4 * time.Second,
		},
		db:       map[int]time.Duration{1: 10 * time.Millisecond, 2: 500 * time.Millisecond},
		redis:    map[int]time.Duration{9: 100 * time.Millisecond},
		busy:     10 * time.Second,
		capacity: 20 * time.Second,
	}
	end := cpuSnapshot{
		self: 1500 * time.Millisecond,
		proc: procCounters{
			user: 1200 * time.Millisecond, sys: 300 * time.Millisecond, minFaults: 350, voluntary: 40, preempted: 6,
			gc: 80 * time.Millisecond, gcCycles: 9, runtimeTotal: 6 * time.Second,
		},
		// Backend 2 exited (its time is lost, not subtracted); backend 3 started.
		db:       map[int]time.Duration{1: 30 * time.Millisecond, 3: 5 * time.Millisecond},
		redis:    map[int]time.Duration{9: 175 * time.Millisecond},
		busy:     11600 * time.Millisecond,
		capacity: 22 * time.Second,
	}
	d := end.since(start)
	require.Equal(t, 500*time.Millisecond, d.self)
	require.Equal(t, procCounters{
		user: 400 * time.Millisecond, sys: 100 * time.Millisecond, minFaults: 250, voluntary: 30, preempted: 1,
		gc: 30 * time.Millisecond, gcCycles: 2, runtimeTotal: 2 * time.Second,
	}, d.proc)
	require.Equal(t, 25*time.Millisecond, d.db)
	require.Equal(t, 75*time.Millisecond, d.redis)
	require.True(t, d.dbSeen)
	// Others: 1.6s busy − 0.5s self − 0.025s db − 0.075s Redis over 2s of capacity.
	require.InDelta(t, 0.5, d.others, 1e-9)

	// The GC's shares: 30ms of the runtime's 2s, and of the process's 500ms.
	row := rowFromSample("x", "req", 1, &sample{requests: 10, elapsed: time.Second, cpu: d})
	require.InDelta(t, 1.5, row.GCCPUPercent, 1e-9)
	require.InDelta(t, 6.0, row.GCCPUBusyPercent, 1e-9)
	require.InDelta(t, 3000.0, row.GCCPUPerRequestUS, 1e-9)

	require.False(t, cpuSnapshot{}.since(cpuSnapshot{}).dbSeen, "no PostgreSQL on this machine")
	require.Equal(t, -1.0, cpuSnapshot{}.since(cpuSnapshot{}).others, "no capacity read")
}

func TestSizeHoldClients(t *testing.T) {
	t.Parallel()

	roomy := clientLimit{clients: maxConcurrency, why: "the tool's bound"}
	for _, tt := range []struct {
		name     string
		explicit int
		rate     float64
		limit    clientLimit
		want     int
		why      string
	}{
		{
			name: "FromTheCeiling", rate: 23_400, limit: roomy, want: 4680,
			why: "clients 4680 = ceil(23400 pairs/s × 0.1 s × 2)",
		},
		{
			name: "RoundsUp", rate: 10.1, limit: roomy, want: 3,
			why: "clients 3 = ceil(10 pairs/s × 0.1 s × 2)",
		},
		{
			name: "NoCeilingMeasured", limit: roomy, want: fallbackHeldRate / 5,
			why: "clients 5000 = ceil(25000 req/s, a fixed bound as no ceiling was measured in this run, × 0.1 s × 2)",
		},
		{
			name: "Explicit", explicit: 512, rate: 23_400, limit: roomy, want: 512,
			why: "clients 512 (-hold-concurrency)",
		},
		{
			name: "Clamped", rate: 80_000, limit: clientLimit{clients: 9744, why: "RLIMIT_NOFILE 20000"}, want: 9744,
			why: "clients 16000 = ceil(80000 pairs/s × 0.1 s × 2), CLAMPED to 9744 (RLIMIT_NOFILE 20000)",
		},
		{
			name: "ExplicitClamped", explicit: 5000, limit: clientLimit{clients: 1000, why: "RLIMIT_NOFILE 2512"}, want: 1000,
			why: "clients 5000 (-hold-concurrency), CLAMPED to 1000 (RLIMIT_NOFILE 2512)",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			s := sizeHoldClients(tt.explicit, tt.rate, "pairs/s", 100*time.Millisecond, tt.limit)
			require.Equal(t, tt.want, s.clients)
			require.Equal(t, tt.why, s.why)
			require.InDelta(t, float64(tt.want)*10, s.clientCap(), 1e-6)
			require.Contains(t, s.note(), fmt.Sprintf("the hold caps each of them at %d/0.1 s = %d req/s", tt.want, tt.want*10))
		})
	}

	// The hold is the service's own.
	require.Equal(t, 100*time.Millisecond, heldHold)
}

func TestMaxHoldClients(t *testing.T) {
	t.Parallel()

	limit := maxHoldClients(20_000)
	require.Equal(t, (20_000-fdReserve)/fdsPerClient, limit.clients)
	require.Contains(t, limit.why, "RLIMIT_NOFILE 20000")

	require.Equal(t, maxConcurrency, maxHoldClients(1<<20).clients)
	require.Equal(t, 1, maxHoldClients(100).clients)
	require.Equal(t, 1, maxHoldClients(0).clients)

	soft, _, err := raiseFileLimit()
	require.NoError(t, err)
	require.Positive(t, soft)
}

func TestCappedByClients(t *testing.T) {
	t.Parallel()

	require.True(t, cappedByClients(5120, 5120))
	require.True(t, cappedByClients(4608, 5120), "90% of the cap")
	require.False(t, cappedByClients(4607, 5120))
	require.False(t, cappedByClients(100, 0), "no cap: not a held row")
}

// TestReport_CappedByClients: a capped row passes no target, nor does a row compared with it, and
// both say so.
func TestReport_CappedByClients(t *testing.T) {
	t.Parallel()

	r := &runner{
		opts:   &options{HoldConcurrency: 512},
		report: &Report{},
		// The ceiling measured 30k pairs/s: a ratio of 0.17 only, as the hold caps the row.
		pairBound:   30_000,
		clientLimit: clientLimit{clients: maxConcurrency},
	}
	r.report.Rows = append(r.report.Rows, &Row{Scenario: rowCeilingPair, Rate: 30_000, Derived: true})
	capped := r.heldRow(scenarioManyIPs, &sample{requests: 5000, elapsed: time.Second}, engineSQLite, "note")
	require.True(t, capped.CappedByClients)
	require.InDelta(t, 5120, *capped.ClientCap, 1e-9)
	require.Contains(t, capped.Note, "CAPPED BY CLIENTS: 5000 req/s is ≥ 90% of the 5120 req/s that 512 clients")
	r.report.Rows = append(r.report.Rows, capped)
	r.report.compare(capped, rowCeilingPair, 0.1) // a ratio over its target, and still no pass

	hot := &Row{Scenario: scenarioHotIP, Unit: "req", Rate: 50_000, Requests: 1}
	r.report.Rows = append(r.report.Rows, hot)
	r.report.compare(hot, scenarioManyIPs, targetHotIP) // 10 ×: over its target, against a capped baseline

	free := r.heldRow(rowSQLite, &sample{requests: 4000, elapsed: time.Second}, engineSQLite, "note")
	require.False(t, free.CappedByClients)
	require.Equal(t, "note", free.Note)

	r.report.finish()
	require.False(t, *capped.Pass)
	require.False(t, *hot.Pass)
	require.Contains(t, hot.Note, "no verdict: http-many-ips is capped by clients")
	require.Len(t, r.report.Misses, 2)
	for _, miss := range r.report.Misses {
		require.Contains(t, miss, "capped by clients")
	}
	require.Contains(t, strings.Join(r.report.Notes, "\n"), "clients 512 (-hold-concurrency); the hold caps each of them at 512/0.1 s = 5120 req/s")

	var out bytes.Buffer
	require.NoError(t, r.report.writeTable(&out))
	require.Regexp(t, `http-many-ips\s+512\s+5000\s+0\s+5000\.0 req/s.*≥ 0\.10\s+CAPPED`, out.String())
}

// TestRun_RedisAbsent: without a Redis, the redis row is skipped and the report says why; the run
// goes on.
func TestRun_RedisAbsent(t *testing.T) {
	t.Parallel()

	var stdout, stderr bytes.Buffer
	err := run(t.Context(), []string{
		"-database-url", "sqlite://" + filepath.Join(t.TempDir(), "never-opened.db"),
		"-scenarios", scenarioRedis,
		"-redis-url", "redis://127.0.0.1:1/0", // nothing listens on port 1
		"-duration", "100ms",
		"-json",
	}, func(string) string { return "" }, &stdout, &stderr)
	require.NoError(t, err, "stderr:\n%s", stderr.String())

	var report Report
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &report), "stdout:\n%s", stdout.String())
	require.Empty(t, report.Rows)
	require.Contains(t, strings.Join(report.Notes, "\n"), rowRedis+": skipped: no Redis at 127.0.0.1:1: ")
	require.Empty(t, report.Misses)
}

// TestRedisConsumer spends windows in a real Redis through redis_rate as the limiter's chain
// does. It skips without a Redis at redisURLFallback.
func TestRedisConsumer(t *testing.T) {
	t.Parallel()

	rdb, _, err := connectRedis(t.Context(), redisURLFallback)
	if err != nil {
		t.Skipf("no Redis at %s: %v", redisURLFallback, err)
	}
	t.Cleanup(func() { _ = rdb.Close() })

	store := dbtest.NewSQLite(t)
	user, err := store.UserInsert(t.Context(), &db.UserInsertParams{
		Email: "known@example.com", Name: "Known", PasswordHash: drainUserHash, Now: time.Now(),
	})
	require.NoError(t, err)
	consumer := newRedisConsumer(rdb, store)

	start := time.Now().UTC().Truncate(time.Hour)
	window := func(key string, limit int64) db.RateLimitCounterConsumeParams {
		return db.RateLimitCounterConsumeParams{
			KeyHash:     []byte(key + "-" + randomTag(t)),
			WindowStart: start,
			WindowEnd:   start.Add(time.Hour),
			LimitCount:  limit,
		}
	}
	ip, email := window("ip", 2), window("email", 1)
	t.Cleanup(func() {
		for _, w := range []db.RateLimitCounterConsumeParams{ip, email} {
			_ = consumer.RateLimitCounterDelete(context.Background(), &db.RateLimitCounterDeleteParams{KeyHash: w.KeyHash, WindowStart: w.WindowStart, WindowEnd: w.WindowEnd})
		}
	})
	chain := func(userEmail string) *db.RateLimitCounterChainResult {
		res, err := consumer.RateLimitCounterConsumeChain(t.Context(), &db.RateLimitCounterChainParams{
			Windows:   []db.RateLimitCounterConsumeParams{ip, email},
			UserEmail: userEmail,
		})
		require.NoError(t, err)
		return res
	}

	// Both admit; the user is read.
	res := chain("known@example.com")
	require.Equal(t, []int64{1, 1}, res.Counts)
	require.NotNil(t, res.User)
	require.Equal(t, user.ID, res.User.ID)

	// The email's window is at its limit: the IP's is spent, the email's refuses, no user.
	res = chain("known@example.com")
	require.Equal(t, []int64{2}, res.Counts)
	require.Nil(t, res.User)

	// The IP's window is at its limit too: it refuses, and the email's is not spent.
	res = chain("")
	require.Empty(t, res.Counts)

	// Reset starts a window afresh; an unknown email is no user and no error.
	require.NoError(t, consumer.RateLimitCounterDelete(t.Context(), &db.RateLimitCounterDeleteParams{KeyHash: ip.KeyHash, WindowStart: start, WindowEnd: start.Add(time.Hour)}))
	require.NoError(t, consumer.RateLimitCounterDelete(t.Context(), &db.RateLimitCounterDeleteParams{KeyHash: email.KeyHash, WindowStart: start, WindowEnd: start.Add(time.Hour)}))
	res = chain("nobody@example.com")
	require.Equal(t, []int64{1, 1}, res.Counts)
	require.Nil(t, res.User)

	// An unlimited rule still writes its key (see redisMaxLimit), so that the baseline costs what
	// a limiter costs.
	huge := window("huge", unlimited)
	res, err = consumer.RateLimitCounterConsumeChain(t.Context(), &db.RateLimitCounterChainParams{Windows: []db.RateLimitCounterConsumeParams{huge}})
	require.NoError(t, err)
	require.Equal(t, []int64{1}, res.Counts)
	require.Equal(t, int64(1), rdb.Exists(t.Context(), "rate:"+redisKey(huge.KeyHash, huge.WindowStart)).Val())
	require.NoError(t, consumer.RateLimitCounterDelete(t.Context(), &db.RateLimitCounterDeleteParams{KeyHash: huge.KeyHash, WindowStart: start, WindowEnd: start.Add(time.Hour)}))

	_, err = consumer.RateLimitCounterGetMany(t.Context(), &db.RateLimitCounterWindowsParams{Windows: []db.RateLimitCounterGetParams{{KeyHash: ip.KeyHash, WindowStart: start, WindowEnd: start.Add(time.Hour)}}})
	require.ErrorIs(t, err, errRedisUnsupported)
}

// redisReachable says whether TestRun can expect the redis row.
func redisReachable(t *testing.T) bool {
	t.Helper()

	rdb, _, err := connectRedis(t.Context(), redisURLFallback)
	if err != nil {
		return false
	}
	_ = rdb.Close()
	return true
}

func randomTag(t *testing.T) string {
	t.Helper()

	b := make([]byte, 8)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}
