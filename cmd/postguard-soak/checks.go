package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Job kinds whose mail the soak counts.
const (
	kindWelcome       = "welcome_email"
	kindVerification  = "verification_email"
	kindPasswordReset = "password_reset_email"
)

// jobRecord is what the checks read of a River job.
type jobRecord struct {
	id       int64
	kind     string
	state    string
	userID   int64
	attempt  int
	rescued  bool
	errCount int
}

// delivery is one mail the fake accepted: its recipient and the kind of job that sent it.
type delivery struct {
	to   string
	kind string
}

// soakData is everything the checks look at.
type soakData struct {
	opts      *options
	database  string
	logDir    string
	loadTook  time.Duration
	drainTook time.Duration
	drainErr  error

	answers       []answer
	registrations []registration
	bursts        []burst
	faults        []fault
	stops         []fault

	users      map[int64]string // id → email, as stored
	jobs       []jobRecord
	deliveries []delivery
}

// collect reads the database and the fake once every process has stopped.
func (s *soak) collect(ctx context.Context) (*soakData, error) {
	data := &soakData{users: make(map[int64]string)}
	s.recorder.mu.Lock()
	data.answers = slices.Clone(s.recorder.answers)
	data.registrations = slices.Clone(s.recorder.registrations)
	data.bursts = slices.Clone(s.recorder.bursts)
	s.recorder.mu.Unlock()

	conn, err := pgx.Connect(ctx, s.soakURL)
	if err != nil {
		return nil, fmt.Errorf("error connecting to the soak's database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	rows, err := conn.Query(ctx, `SELECT id, email FROM users`)
	if err != nil {
		return nil, fmt.Errorf("error reading users: %w", err)
	}
	for rows.Next() {
		var id int64
		var email string
		if err := rows.Scan(&id, &email); err != nil {
			return nil, fmt.Errorf("error reading users: %w", err)
		}
		data.users[id] = email
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("error reading users: %w", err)
	}

	// River's own table, read-only: the one place that says what became of every job.
	rows, err = conn.Query(ctx, `
		SELECT id, kind, state::text, coalesce((args->>'user_id')::bigint, 0), attempt,
			coalesce(cardinality(errors), 0),
			EXISTS (SELECT 1 FROM unnest(errors) e WHERE e->>'error' LIKE 'Stuck job rescued%')
		FROM river_job
		WHERE kind NOT IN ('prune', 'prune_counters')`)
	if err != nil {
		return nil, fmt.Errorf("error reading jobs: %w", err)
	}
	for rows.Next() {
		var j jobRecord
		if err := rows.Scan(&j.id, &j.kind, &j.state, &j.userID, &j.attempt, &j.errCount, &j.rescued); err != nil {
			return nil, fmt.Errorf("error reading jobs: %w", err)
		}
		data.jobs = append(data.jobs, j)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("error reading jobs: %w", err)
	}

	for _, d := range s.fake.Deliveries() {
		data.deliveries = append(data.deliveries, delivery{to: strings.Join(d.To, ","), kind: kindOfKey(d.IdempotencyKey)})
	}
	return data, nil
}

// kindOfKey is the job kind an idempotency key names in its first field: "<kind>:<user_id>:…"
// ("welcome" is welcome_email's older spelling).
func kindOfKey(key string) string {
	kind, _, _ := strings.Cut(key, ":")
	if kind == "welcome" {
		return kindWelcome
	}
	return kind
}

// check is one verdict of the report.
type check struct {
	name   string
	passed bool
	detail string
}

// report is what the soak prints.
type report struct {
	data    *soakData
	counts  map[string]int // answers by status ("transport error" for none)
	checks  []check
	retried int // jobs with at least one failed attempt
	rescued int // jobs rescued after their worker died
}

func (r *report) passed() bool {
	for _, c := range r.checks {
		if !c.passed {
			return false
		}
	}
	return true
}

// evaluate runs every check on data.
func evaluate(data *soakData) *report {
	r := &report{data: data, counts: make(map[string]int)}
	add := func(name string, passed bool, format string, args ...any) {
		r.checks = append(r.checks, check{name: name, passed: passed, detail: fmt.Sprintf(format, args...)})
	}

	// Answers.
	var unexpected []string
	var unavailable, withRetryAfter, errors5xx int
	for _, a := range data.answers {
		key := strconv.Itoa(a.status)
		if a.status == 0 {
			key = "transport error"
		}
		r.counts[key]++
		switch {
		case a.status == http.StatusServiceUnavailable:
			unavailable++
			if a.retryAfter != "" {
				withRetryAfter++
			}
		case a.status >= 500:
			errors5xx++
		case a.status == 0, a.status == http.StatusCreated, a.status == http.StatusAccepted, a.status == http.StatusTooManyRequests:
		default:
			unexpected = append(unexpected, fmt.Sprintf("%d on %s", a.status, a.route))
		}
	}
	add("no 500s", errors5xx == 0, "%d answers 5xx other than 503", errors5xx)
	add("every 503 carried Retry-After", withRetryAfter == unavailable, "%d of %d", withRetryAfter, unavailable)
	add("no unexpected status", len(unexpected) == 0, "%d answers other than 201, 202, 429, 503%s", len(unexpected), examples(unexpected))
	add("load ran", r.counts["201"] > 0, "%d registrations accepted", r.counts["201"])

	// Limits across processes.
	var clean, over int
	for _, b := range data.bursts {
		allowed := b.limit
		if b.straddles {
			allowed = 2 * b.limit
		}
		if b.admitted > allowed {
			over++
		}
		if b.clean() && b.admitted == b.limit {
			clean++
		} else if b.clean() {
			over++ // a clean burst that admitted fewer than the limit counted requests twice
		}
	}
	limit := 0
	if len(data.bursts) > 0 {
		limit = data.bursts[0].limit
	}
	add("limits held across processes", over == 0 && clean > 0,
		"%d bursts of %d forgot-password requests from one IP over %d api processes at once, limit %d: "+
			"exactly %d admitted in each of the %d bursts answered throughout, never more in any (%d broke it)",
		len(data.bursts), 3*limit, data.opts.APIs, limit, limit, clean, over)

	// Registrations and their jobs.
	var missingUsers []string
	for _, reg := range data.registrations {
		if data.users[reg.id] != reg.email {
			missingUsers = append(missingUsers, fmt.Sprintf("%d %s", reg.id, reg.email))
		}
	}
	add("every accepted registration stored", len(missingUsers) == 0, "%d accepted (201), %d users stored, %d missing%s",
		len(data.registrations), len(data.users), len(missingUsers), examples(missingUsers))

	type userKind struct {
		userID int64
		kind   string
	}
	completed := make(map[userKind]int)
	jobsOf := make(map[userKind]int)
	var lost, unfinished []string
	var rescued, retried int
	byState := make(map[string]int)
	for _, j := range data.jobs {
		byState[j.state]++
		if j.rescued {
			rescued++
		}
		if j.errCount > 0 {
			retried++
		}
		jobsOf[userKind{j.userID, j.kind}]++
		switch j.state {
		case "completed":
			completed[userKind{j.userID, j.kind}]++
		case "discarded", "cancelled":
			lost = append(lost, fmt.Sprintf("job %d (%s) %s", j.id, j.kind, j.state))
		default:
			unfinished = append(unfinished, fmt.Sprintf("job %d (%s) %s", j.id, j.kind, j.state))
		}
	}
	var withoutJobs []string
	for id := range data.users {
		if jobsOf[userKind{id, kindWelcome}] != 1 || jobsOf[userKind{id, kindVerification}] < 1 {
			withoutJobs = append(withoutJobs, fmt.Sprintf("user %d: %d welcome, %d verification", id,
				jobsOf[userKind{id, kindWelcome}], jobsOf[userKind{id, kindVerification}]))
		}
	}
	slices.Sort(withoutJobs)
	add("every user has its welcome and verification jobs", len(withoutJobs) == 0, "%d users, %d without%s",
		len(data.users), len(withoutJobs), examples(withoutJobs))
	states := make([]string, 0, len(byState))
	for state, n := range byState {
		states = append(states, fmt.Sprintf("%d %s", n, state))
	}
	slices.Sort(states)
	add("no job lost, discarded or cancelled", len(lost) == 0 && len(unfinished) == 0 && data.drainErr == nil,
		"%d jobs (%s), %d discarded or cancelled, %d unfinished%s; the queue drained %s after the load%s",
		len(data.jobs), strings.Join(states, ", "), len(lost), len(unfinished), examples(append(lost, unfinished...)),
		data.drainTook.Round(time.Second), errSuffix(data.drainErr))

	// Mail, counted at the fake by recipient and kind, against the jobs that completed.
	delivered := make(map[userKind]int)
	userOf := make(map[string]int64, len(data.users))
	for id, email := range data.users {
		userOf[email] = id
	}
	var strangers int
	for _, d := range data.deliveries {
		id, ok := userOf[d.to]
		if !ok {
			strangers++
			continue
		}
		delivered[userKind{id, d.kind}]++
	}
	var wrong []string
	counted := make(map[string]int)
	for key, n := range completed {
		counted[key.kind] += delivered[key]
		if delivered[key] != n {
			wrong = append(wrong, fmt.Sprintf("user %d %s: %d jobs completed, %d delivered", key.userID, key.kind, n, delivered[key]))
		}
	}
	for key, n := range delivered {
		if completed[key] == 0 {
			wrong = append(wrong, fmt.Sprintf("user %d %s: %d delivered, no job completed", key.userID, key.kind, n))
		}
	}
	slices.Sort(wrong)
	add("every mail delivered exactly once", len(wrong) == 0 && strangers == 0,
		"%d deliveries (%d welcome, %d verification, %d password reset), each the one of a completed job: "+
			"%d users or kinds with more or fewer%s, %d to no user",
		len(data.deliveries), counted[kindWelcome], counted[kindVerification], counted[kindPasswordReset],
		len(wrong), examples(wrong), strangers)

	// Processes.
	var badFaults []string
	for _, f := range append(append([]fault(nil), data.faults...), data.stops...) {
		if f.err != nil {
			badFaults = append(badFaults, fmt.Sprintf("%s: %v", f.name, f.err))
		}
	}
	add("every fault played, every SIGTERM exited 0", len(badFaults) == 0, "%d faults, %d final stops, %d failed%s",
		len(data.faults), len(data.stops), len(badFaults), examples(badFaults))

	r.retried, r.rescued = retried, rescued
	return r
}

// write prints the report.
func (r *report) write(w io.Writer) {
	d := r.data
	fmt.Fprintf(w, "postguard soak: %s of load and faults on database %s, %d api + %d worker processes, %d clients\n",
		d.loadTook.Round(time.Second), d.database, d.opts.APIs, d.opts.Workers, d.opts.Clients)

	faults := make(map[string]int)
	for _, f := range d.faults {
		faults[f.name]++
	}
	var parts []string
	for _, name := range faultNames {
		parts = append(parts, fmt.Sprintf("%s ×%d", name, faults[name]))
	}
	fmt.Fprintf(w, "faults (one every %s; refused for %s): %s\n", d.opts.FaultEvery, d.opts.RefuseFor, strings.Join(parts, ", "))

	statuses := make([]string, 0, len(r.counts))
	for status := range r.counts {
		statuses = append(statuses, status)
	}
	slices.Sort(statuses)
	parts = parts[:0]
	total := 0
	for _, status := range statuses {
		parts = append(parts, fmt.Sprintf("%s: %d", status, r.counts[status]))
		total += r.counts[status]
	}
	fmt.Fprintf(w, "requests: %d (%s); transport errors are requests to a process being killed or stopped\n", total, strings.Join(parts, ", "))
	fmt.Fprintf(w, "jobs: %d, %d retried after an error, %d rescued after a worker died\n", len(d.jobs), r.retried, r.rescued)
	for _, c := range r.checks {
		verdict := "PASS"
		if !c.passed {
			verdict = "FAIL"
		}
		fmt.Fprintf(w, "  %s  %s: %s\n", verdict, c.name, c.detail)
	}
	if r.passed() {
		fmt.Fprintln(w, "result: PASS")
		return
	}
	fmt.Fprintf(w, "result: FAIL (the processes' logs are in %s)\n", d.logDir)
}

// examples lists the first few of s, for a check's detail.
func examples(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return " (" + strings.Join(s[:min(len(s), 5)], "; ") + ")"
}

func errSuffix(err error) string {
	if err == nil {
		return ""
	}
	return ": " + err.Error()
}
