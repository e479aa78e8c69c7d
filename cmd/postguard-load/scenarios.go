package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/argon2"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/riverstore"
)

const (
	// unlimited is a limit no measurement reaches, for rules that must admit everything.
	unlimited = int64(1) << 40

	// The argon2id parameters of api/password.go (not exported there): m=19 MiB, t=2, p=1.
	argonMemoryKiB = 19 * 1024
	argonTime      = 2
	argonThreads   = 1
	argonKeyLen    = 32

	// loadPassword is every registration's password (each is hashed under its own salt).
	loadPassword = "load-test-password-0123456789"

	// Targets of issue 16 ("One round trip per rate-limited request, and performance evidence on
	// any machine"), raised by issue 26 (checks that share round trips: ahead of Redis, SQLite
	// ahead of PostgreSQL): each a least ratio of a row's rate to its baseline's, measured in the
	// same run. http-hot-ip's target is issue 16's, set when an admitted request cost a statement
	// of its own; batching made http-many-ips, its baseline, cheaper, not the flood dearer.
	targetManyIPs      = 0.50 // http-many-ips over ceiling/pair (the two-check ceiling)
	targetManyIPsRedis = 1.0  // http-many-ips over redis/http-many-ips (the same requests, limited by redis_rate)
	targetHotIP        = 3    // http-hot-ip over http-many-ips
	targetRegister     = 0.80 // register over argon2id-hash, with a peak RSS of at most maxPeakRSS
	targetDrainResend  = 0.60 // email-drain/resend over email-drain/noop
	targetDrainSMTP    = 0.30 // email-drain/smtp over email-drain/noop (issue 24: a TLS session per mail)
	targetDrainBudget  = 0.95 // email-drain/budget's delivered/s over the budget, with no 429
	targetSQLite       = 1.0  // sqlite/http-many-ips over http-many-ips
	maxPeakRSS         = 256 << 20
)

// Row names that other rows compare with.
const (
	rowCeilingFresh = "ceiling/fresh-keys"
	rowCeilingPair  = "ceiling/pair"
	rowHash         = "argon2id-hash"
	rowSQLite       = "sqlite/http-many-ips"
	rowRedis        = "redis/http-many-ips"
	// rowManyIPsRedis is http-many-ips again, derived, compared with rowRedis: a row has one
	// baseline.
	rowManyIPsRedis = "http-many-ips/vs-redis"
)

// ceiling measures the rate-limit statement alone, straight on the store (the service's very
// call, RateLimitCounterConsume, on its pool: on PostgreSQL the synchronous_commit=off one), on a
// set of existing keys, on one hot key, and on fresh keys. The fresh-key measurement is split in
// two halves around http-many-ips and redis/http-many-ips (when they run), which compare with it:
// a drift in the machine's load then weighs on all of them alike. The first half's pair rate is
// the bound the held scenarios' clients are sized by (holdSizing). Its rows are added with the
// interleaved scenarios' (see later).
func (r *runner) ceiling(ctx context.Context, store riverstore.Store) error {
	const window = 15 * time.Minute
	start := time.Now().UTC().Truncate(window)
	consume := func(ctx context.Context, key []byte) error {
		_, ok, err := store.RateLimitCounterConsume(ctx, &db.RateLimitCounterConsumeParams{
			KeyHash:     key,
			WindowStart: start,
			WindowEnd:   start.Add(window),
			LimitCount:  unlimited,
		})
		switch {
		case err != nil:
			return err
		case !ok:
			return errors.New("counter refused under an unlimited rule")
		}
		return nil
	}
	clients := r.opts.Concurrency
	engine := store.Engine()

	// The pre-filled set: each key spent once, so that the measurement only increments.
	keys := make([][]byte, r.opts.ExistingKeys)
	for i := range keys {
		keys[i] = r.key("existing", uint64(i))
	}
	var next atomic.Int64
	var prefillErr error
	var errOnce sync.Once
	stop := r.progress("ceiling/prefill", func(time.Duration) string {
		return fmt.Sprintf("%d/%d keys", min(next.Load(), int64(len(keys))), len(keys))
	})
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(len(keys)) {
					return
				}
				if err := consume(ctx, keys[i]); err != nil {
					errOnce.Do(func() { prefillErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	stop()
	if prefillErr != nil {
		return fmt.Errorf("error pre-filling counters: %w", prefillErr)
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	existing := r.measure(ctx, "ceiling/existing-keys", "check", clients, r.opts.Duration, func(ctx context.Context, seq uint64) error {
		return consume(ctx, keys[seq%uint64(len(keys))])
	})
	existingRow := engineRow("ceiling/existing-keys", "check", clients, existing, engine)
	existingRow.Note = fmt.Sprintf("%d pre-filled keys cycled: one UPDATE each", len(keys))

	hotKey := r.key("hot", 0)
	hot := r.measure(ctx, "ceiling/hot-key", "check", clients, r.opts.Duration, func(ctx context.Context, _ uint64) error {
		return consume(ctx, hotKey)
	})
	hotRow := engineRow("ceiling/hot-key", "check", clients, hot, engine)
	hotRow.Note = "every check updates one row"

	measureFresh := func(half int, d time.Duration) *sample {
		kind := "fresh" + strconv.Itoa(half)
		return r.measure(ctx, fmt.Sprintf("%s (%d/2)", rowCeilingFresh, half), "check", clients, d, func(ctx context.Context, seq uint64) error {
			return consume(ctx, r.key(kind, seq))
		})
	}
	firstHalf := max(r.opts.Duration/2, time.Millisecond)
	fresh := measureFresh(1, firstHalf)
	r.pairBound = fresh.rate() / 2

	r.later(func() {
		fresh.add(measureFresh(2, max(r.opts.Duration-firstHalf, time.Millisecond)))
	}, func() {
		freshRow := engineRow(rowCeilingFresh, "check", clients, fresh, engine)
		freshRow.Note = "new key per check: one INSERT; half measured before http-many-ips, half after"
		pairRow := &Row{
			Scenario: rowCeilingPair,
			Unit:     "pair",
			Requests: fresh.requests / 2,
			Seconds:  freshRow.Seconds,
			Rate:     round(fresh.rate()/2, 1),
			Derived:  true,
			// Its measurement's load, so that http-many-ips is checked for noise against it.
			OthersPercent: freshRow.OthersPercent,
			Note: "fresh-keys ÷ 2: a request from a new client costs two checks on fresh keys (IP and email), here two statements " +
				"and two round trips; postguard's limiter spends both in one statement (RateLimitCounterConsumeChain), so " +
				"http-many-ips's ratio to this row can exceed what two round trips would allow",
		}
		r.report.Rows = append(r.report.Rows, freshRow, existingRow, hotRow, pairRow)
		r.report.compare(existingRow, rowCeilingFresh, 0)
		r.report.compare(hotRow, rowCeilingFresh, 0)
	}, nil)
	return nil
}

// key is a 32-byte counter key, spread over the index as the service's HMAC keys are.
func (r *runner) key(kind string, n uint64) []byte {
	h := sha256.New()
	h.Write([]byte(r.tag + ":" + kind + ":"))
	_ = binary.Write(h, binary.BigEndian, n)
	return h.Sum(nil)
}

// forgotPasswordRules admits every forgot-password request.
func forgotPasswordRules() abuse.Rules {
	return abuse.DefaultRules().
		With(abuse.Rule{Action: abuse.ActionForgotPassword, Scope: abuse.ScopeIP, Limit: unlimited, Window: 15 * time.Minute}).
		With(abuse.Rule{Action: abuse.ActionForgotPassword, Scope: abuse.ScopeEmail, Limit: unlimited, Window: time.Hour})
}

// manyIPsNote describes the requests of every held row.
const manyIPsNote = "forgot-password, new client IP (X-Forwarded-For from 127.0.0.1, a trusted proxy) and new unknown email per request, " +
	"every one admitted (202) and held ≥ 100ms by the service (uniform timing), hence many clients"

// manyIPs measures http-many-ips: POST /v1/auth/forgot-password, each request from a new client
// IP with a new, unknown email, every one admitted (202): two limiter checks on fresh keys plus
// one user lookup (an unknown email opens no transaction and inserts no job). When
// redis/http-many-ips runs too, the measurement is split in two halves around it, as the
// ceiling's is around both. Its row is added with the ceiling's (see later).
func (r *runner) manyIPs(ctx context.Context, d *database) error {
	h, err := r.startHeld(ctx, d, scenarioManyIPs, nil)
	if err != nil {
		return err
	}
	report := func(s *sample, split bool) {
		row := r.heldRow(scenarioManyIPs, s, d.engine, manyIPsNote+
			": 2 limiter checks on fresh keys and 1 user lookup (no transaction, no job)")
		if split {
			row.addNote("half measured before " + r.nested() + ", half after")
		}
		r.report.Rows = append(r.report.Rows, row)
		r.report.compare(row, rowCeilingPair, targetManyIPs)
	}

	if !r.opts.selected(scenarioRedis) && !r.measuresSQLite() {
		s := h.measure(ctx, "", r.opts.Duration)
		h.close()
		r.later(nil, func() { report(s, false) }, nil)
		return nil
	}
	h.measureAround(ctx, func(s *sample) { report(s, true) }, h.close)
	return nil
}

// measureAround measures the service's first half now and queues its second half to measure
// around the rows that follow (see interleavedScenarios), then report and done; done alone when
// the run stops before the second half.
func (h *heldService) measureAround(ctx context.Context, report func(s *sample), done func()) {
	firstHalf := max(h.r.opts.Duration/2, time.Millisecond)
	s := h.measure(ctx, " (1/2)", firstHalf)
	h.settle(ctx)
	// Its connections are made again in the second half's warm-up: meanwhile the file
	// descriptors are the nested rows'.
	h.client.CloseIdleConnections()
	h.r.later(func() {
		s.add(h.measure(ctx, " (2/2)", max(h.r.opts.Duration-firstHalf, time.Millisecond)))
		done()
	}, func() { report(s) }, done)
}

// heldService is a service whose forgot-password requests a held row measures, with the clients
// holdSizing chose.
type heldService struct {
	*loadService
	r       *runner
	name    string
	clients int
}

// startHeld starts the service of a held row, with the limiter opts gives (the service's own
// when nil).
func (r *runner) startHeld(ctx context.Context, d *database, name string, opts *serviceOpts) (*heldService, error) {
	sizing := r.holdSizing()
	svc, err := r.startService(ctx, name, d, forgotPasswordRules(), sizing.clients, opts)
	if err != nil {
		return nil, err
	}
	return &heldService{loadService: svc, r: r, name: name, clients: sizing.clients}, nil
}

// measure posts forgot-password for duration from the clients, each request from a new IP with
// a new unknown email.
func (h *heldService) measure(ctx context.Context, part string, duration time.Duration) *sample {
	h.r.heldBatches++
	prefix := `{"email":"nobody-` + h.r.tag + `-` + strconv.Itoa(h.r.heldBatches) + `-`
	return h.r.measure(ctx, h.name+part, "req", h.clients, duration, func(ctx context.Context, seq uint64) error {
		body := prefix + strconv.FormatUint(seq, 10) + `@example.com"}`
		return h.post(ctx, "/v1/auth/forgot-password", h.r.nextIP(), body, http.StatusAccepted)
	})
}

// heldRow is the row of a held measurement: its client cap (clients over the hold), and the
// flag "capped by clients" when its rate comes near that cap.
func (r *runner) heldRow(name string, s *sample, engine, note string) *Row {
	sizing := r.holdSizing()
	row := engineRow(name, "req", sizing.clients, s, engine)
	row.Note = note
	clientCap := round(sizing.clientCap(), 1)
	row.ClientCap = &clientCap
	if cappedByClients(row.Rate, clientCap) {
		row.CappedByClients = true
		row.addNote(fmt.Sprintf("CAPPED BY CLIENTS: %.0f req/s is ≥ %.0f%% of the %.0f req/s that %d clients waiting ≥ %s per answer can make, "+
			"so it measures the clients; rerun with a larger -hold-concurrency", row.Rate, 100*cappedFraction, clientCap, sizing.clients, fmtSeconds(sizing.hold)))
	}
	return row
}

// holdSizing is the clients of the held rows, chosen once per run: from the first half of the
// ceiling's pair rate when it was measured (see sizeHoldClients). The report notes it.
func (r *runner) holdSizing() *holdSizing {
	if r.sizing == nil {
		r.sizing = sizeHoldClients(r.opts.HoldConcurrency, r.pairBound,
			"pairs/s ("+rowCeilingPair+", the first half of "+rowCeilingFresh+" ÷ 2)", heldHold, r.clientLimit)
		r.report.Notes = append(r.report.Notes, r.sizing.note())
	}
	return r.sizing
}

// compareWithRedis adds http-many-ips/vs-redis, http-many-ips's figure compared with the
// redis_rate-backed row, once both are in the report.
func (r *runner) compareWithRedis(redisRow *Row) {
	manyIPs := r.report.row(scenarioManyIPs)
	if manyIPs == nil {
		redisRow.addNote("no comparison: " + scenarioManyIPs + " was not measured in this run")
		return
	}
	row := &Row{
		Scenario:        rowManyIPsRedis,
		Unit:            "req",
		Requests:        manyIPs.Requests,
		Errors:          manyIPs.Errors,
		Seconds:         manyIPs.Seconds,
		Rate:            manyIPs.Rate,
		Derived:         true,
		OthersPercent:   manyIPs.OthersPercent,
		ClientCap:       manyIPs.ClientCap,
		CappedByClients: manyIPs.CappedByClients,
		Note:            scenarioManyIPs + "'s figure again, compared with the same requests limited by redis_rate (a row has one baseline)",
	}
	r.report.Rows = append(r.report.Rows, row)
	r.report.compare(row, rowRedis, targetManyIPsRedis)
}

// hotIP measures one client IP over its forgot-password limit: every answer is a 429, which the
// limiter's deny cache gives without the database.
func (r *runner) hotIP(ctx context.Context, d *database) error {
	rules := abuse.DefaultRules().
		// A day-long window, so that no window ends during the run and readmits the IP.
		With(abuse.Rule{Action: abuse.ActionForgotPassword, Scope: abuse.ScopeIP, Limit: 1, Window: 24 * time.Hour}).
		With(abuse.Rule{Action: abuse.ActionForgotPassword, Scope: abuse.ScopeEmail, Limit: unlimited, Window: time.Hour})
	clients := r.opts.Concurrency
	svc, err := r.startService(ctx, scenarioHotIP, d, rules, clients, nil)
	if err != nil {
		return err
	}
	defer svc.close()

	ip := r.nextIP()
	prefix := `{"email":"hot-` + r.tag + `-`
	// Spend the limit first: the first request is admitted, the next refused (and cached).
	if err := svc.post(ctx, "/v1/auth/forgot-password", ip, prefix+`first@example.com"}`, http.StatusAccepted); err != nil {
		return fmt.Errorf("error spending the hot IP's limit: %w", err)
	}
	if err := svc.post(ctx, "/v1/auth/forgot-password", ip, prefix+`second@example.com"}`, http.StatusTooManyRequests); err != nil {
		return fmt.Errorf("error exhausting the hot IP's limit: %w", err)
	}

	s := r.measure(ctx, scenarioHotIP, "req", clients, r.opts.Duration, func(ctx context.Context, seq uint64) error {
		body := prefix + strconv.FormatUint(seq, 10) + `@example.com"}`
		return svc.post(ctx, "/v1/auth/forgot-password", ip, body, http.StatusTooManyRequests)
	})
	row := engineRow(scenarioHotIP, "req", clients, s, d.engine)
	row.Note = "one client IP over its limit: every answer a 429 from the limiter's deny cache, no database"
	r.report.Rows = append(r.report.Rows, row)
	r.report.compare(row, scenarioManyIPs, targetHotIP)
	return nil
}

// register measures the argon2id hash rate of this process (hashConcurrency goroutines, as many
// as the service may hash at once, hashing with the service's parameters), then POST /v1/auth/register with real hashing at -registrations
// concurrent clients (new IP and email each), and the peak RSS meanwhile.
func (r *runner) register(ctx context.Context, d *database) error {
	// The hash baseline runs half before and half after the registrations, so that a drift in
	// the machine's load weighs on both alike.
	procs := hashConcurrency()
	password := []byte(loadPassword)
	// The same implementation and parameters as the service's hasher (golang.org/x/crypto/argon2),
	// so the ratio is what HTTP, the limiter, the database and River add.
	hashOnce := func(context.Context, uint64) error {
		salt := make([]byte, 16)
		_, _ = rand.Read(salt)
		_ = argon2.IDKey(password, salt, argonTime, argonMemoryKiB, argonThreads, argonKeyLen)
		return nil
	}
	firstHalf := max(r.opts.Duration/2, time.Millisecond)
	hash := r.measure(ctx, rowHash+" (1/2)", "hash", procs, firstHalf, hashOnce)

	rules := abuse.DefaultRules().
		With(abuse.Rule{Action: abuse.ActionRegister, Scope: abuse.ScopeIP, Limit: unlimited, Window: 15 * time.Minute}).
		With(abuse.Rule{Action: abuse.ActionRegister, Scope: abuse.ScopeEmail, Limit: unlimited, Window: time.Hour})
	clients := r.opts.Registrations
	svc, err := r.startService(ctx, scenarioRegister, d, rules, clients, nil)
	if err != nil {
		return err
	}
	defer svc.close()

	// Give back what earlier scenarios left, so that the peak is this scenario's.
	debug.FreeOSMemory()
	rssErr := resetPeakRSS()
	rssBefore, _ := peakRSS()

	prefix := `{"email":"reg-` + r.tag + `-`
	s := r.measure(ctx, scenarioRegister, "req", clients, r.opts.Duration, func(ctx context.Context, seq uint64) error {
		body := prefix + strconv.FormatUint(seq, 10) + `@example.com","password":"` + loadPassword + `","name":"Load Test"}`
		return svc.post(ctx, "/v1/auth/register", r.nextIP(), body, http.StatusCreated)
	})
	rssPeak, err := peakRSS()
	if err != nil {
		return err
	}
	svc.close()

	hash.add(r.measure(ctx, rowHash+" (2/2)", "hash", procs, max(r.opts.Duration-firstHalf, time.Millisecond), hashOnce))
	hashRow := engineRow(rowHash, "hash", procs, hash, "")
	hashRow.Note = "argon2id m=19456 t=2 p=1 (api's parameters) at GOMAXPROCS goroutines (the service's HashConcurrency), no HTTP, no database; half measured before register, half after"
	r.report.Rows = append(r.report.Rows, hashRow)

	row := engineRow(scenarioRegister, "req", clients, s, d.engine)
	row.Note = "new IP and email per request: 2 limiter checks, argon2id (HashConcurrency = GOMAXPROCS, the baseline's goroutines), user + welcome and verification jobs in one transaction"
	if s.requests > 0 {
		row.addNote(fmt.Sprintf("GC: %.2f ms of CPU per registration (runtime/metrics %s over the measurement ÷ its %d registrations; "+
			"service and clients together), %.1f%% of the runtime's CPU time (%s: GOMAXPROCS × wall time) and %.1f%% of the CPU the "+
			"process used", float64(s.cpu.proc.gc)/float64(time.Millisecond)/float64(s.requests), metricGCCPU, s.requests,
			row.GCCPUPercent, metricRuntimeCPU, row.GCCPUBusyPercent))
	}
	r.report.Rows = append(r.report.Rows, row)
	r.report.compare(row, rowHash, targetRegister)

	check := Check{
		Name:   fmt.Sprintf("register peak RSS (VmHWM) under %d concurrent registrations", clients),
		Value:  fmt.Sprintf("%d MiB (RSS at start %d MiB)", rssPeak>>20, rssBefore>>20),
		Target: fmt.Sprintf("≤ %d MiB", maxPeakRSS>>20),
		Pass:   rssPeak <= maxPeakRSS,
	}
	if rssErr != nil {
		check.Value += " — could not reset VmHWM (" + rssErr.Error() + "), so this is the peak of the whole run"
	}
	r.report.Checks = append(r.report.Checks, check)
	return nil
}

// measuresSQLite is whether the run measures sqlite/http-many-ips: on a PostgreSQL run, when
// asked to.
func (r *runner) measuresSQLite() bool {
	return r.engine == enginePostgres && r.opts.selected(scenarioSQLite)
}

// nested are the rows that http-many-ips's halves are measured around.
func (r *runner) nested() string {
	var rows []string
	if r.measuresSQLite() {
		rows = append(rows, rowSQLite)
	}
	if r.opts.selected(scenarioRedis) {
		rows = append(rows, rowRedis)
	}
	return strings.Join(rows, " and ")
}

// sqliteManyIPs runs http-many-ips on a temporary SQLite file, when the run is on PostgreSQL,
// with as many clients: half before redis/http-many-ips, half after, inside http-many-ips's
// halves (see interleavedScenarios), so that both engines' figures are of the same minute.
func (r *runner) sqliteManyIPs(ctx context.Context) error {
	if !r.measuresSQLite() {
		if r.engine == engineSQLite {
			r.report.Notes = append(r.report.Notes, "sqlite: skipped, the run is on SQLite already (http-many-ips is its figure)")
		}
		return nil
	}
	d, cleanup, err := r.newDatabase(ctx, engineSQLite, "http")
	if err != nil {
		return err
	}
	h, err := r.startHeld(ctx, d, rowSQLite, nil)
	if err != nil {
		cleanup()
		return err
	}
	done := func() {
		h.close()
		cleanup()
	}
	report := func(s *sample) {
		row := r.heldRow(rowSQLite, s, d.engine, manyIPsNote+" on SQLite")
		if r.opts.selected(scenarioRedis) {
			row.addNote("half measured before " + rowRedis + ", half after")
		}
		r.report.Rows = append(r.report.Rows, row)
		r.report.compare(row, scenarioManyIPs, targetSQLite)
	}
	h.measureAround(ctx, report, done)
	return nil
}
