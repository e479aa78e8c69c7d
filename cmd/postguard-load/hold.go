package main

import (
	"fmt"
	"math"
	"syscall"
	"time"

	"github.com/postguard/postguard/internal/uniform"
)

// The held scenarios (http-many-ips, redis/http-many-ips, sqlite/http-many-ips) post
// forgot-password, whose every answer the service holds for at least uniform.AnswerMin. A
// client that waits for its answers makes at most one request per hold, so N clients can never
// measure more than N/hold requests a second: the tool sizes N from a measured bound on the rate,
// with a margin, and flags a row that comes near N/hold anyway.
const (
	// holdSafety is the margin over the expected rate: N clients can make holdSafety times the
	// rate the bound expects.
	holdSafety = 2
	// fallbackHeldRate is the expected rate (requests a second) when no ceiling was measured in
	// the run: above what two checks and a lookup reach on a small machine (the ceiling's pair
	// rate on this project's 2-core machine is about 15k a second), so that the clients do not
	// cap the row; a row that comes near its cap is flagged all the same.
	fallbackHeldRate = 25_000
	// cappedFraction is the share of its client cap at which a row is "capped by clients": its
	// rate says more about the clients than the service.
	cappedFraction = 0.9
	// fdsPerClient are the file descriptors one held client takes in this process: its
	// connection's two ends, the client's and the server's, both in-process.
	fdsPerClient = 2
	// fdReserve are the file descriptors kept for everything else: database and Redis pools,
	// listeners, /proc reads, the Go runtime.
	fdReserve = 512
)

// holdSizing is the number of clients of the held scenarios and how it was chosen.
type holdSizing struct {
	clients int
	hold    time.Duration
	// why says where clients comes from, for the report.
	why string
}

// clientCap is the most requests a second the clients can make when each waits hold per answer.
func (s *holdSizing) clientCap() float64 { return float64(s.clients) / s.hold.Seconds() }

// note is the report's sentence on the sizing.
func (s *holdSizing) note() string {
	return fmt.Sprintf("held rows (forgot-password answers are held ≥ %s): %s; the hold caps each of them at %d/%s = %.0f req/s, "+
		"and a row at ≥ %.0f%% of that is flagged \"capped by clients\"",
		fmtSeconds(s.hold), s.why, s.clients, fmtSeconds(s.hold), s.clientCap(), 100*cappedFraction)
}

// sizeHoldClients chooses the clients of the held scenarios: explicit when it is positive
// (-hold-concurrency N), else ceil(rate × hold × holdSafety) with rate the measured bound, whose
// unit and name are boundName ("pairs/s (ceiling/pair)"; fallbackHeldRate when rate is not
// positive: no bound measured). Either is clamped to
// limit, the most clients the process can hold (see maxHoldClients), and the reason says so.
func sizeHoldClients(explicit int, rate float64, boundName string, hold time.Duration, limit clientLimit) *holdSizing {
	s := &holdSizing{hold: hold}
	switch {
	case explicit > 0:
		s.clients = explicit
		s.why = fmt.Sprintf("clients %d (-hold-concurrency)", explicit)
	default:
		what := fmt.Sprintf("%.0f %s", rate, boundName)
		if rate <= 0 {
			rate = fallbackHeldRate
			what = fmt.Sprintf("%d req/s, a fixed bound as no ceiling was measured in this run,", fallbackHeldRate)
		}
		// In nanoseconds over a second, so that a round rate × hold is exact and not rounded up.
		s.clients = max(int(math.Ceil(rate*float64(hold)*holdSafety/float64(time.Second))), 1)
		s.why = fmt.Sprintf("clients %d = ceil(%s × %s × %d)", s.clients, what, fmtSeconds(hold), holdSafety)
	}
	if s.clients > limit.clients {
		s.why += fmt.Sprintf(", CLAMPED to %d (%s)", limit.clients, limit.why)
		s.clients = limit.clients
	}
	return s
}

// clientLimit is the most held clients the process can keep connected, and why.
type clientLimit struct {
	clients int
	why     string
}

// maxHoldClients is the most held clients the process can keep connected with fileLimit file
// descriptors: maxConcurrency, or fewer when the limit cannot give fdsPerClient to each beside
// fdReserve.
func maxHoldClients(fileLimit uint64) clientLimit {
	byFiles := 1
	if fileLimit > fdReserve+fdsPerClient {
		byFiles = int(min((fileLimit-fdReserve)/fdsPerClient, uint64(maxConcurrency)+1))
	}
	if byFiles > maxConcurrency {
		return clientLimit{clients: maxConcurrency, why: fmt.Sprintf("the tool's bound on concurrency, %d", maxConcurrency)}
	}
	return clientLimit{clients: byFiles, why: fmt.Sprintf(
		"RLIMIT_NOFILE %d: %d file descriptors a client, the connection's two ends, beside %d for the rest", fileLimit, fdsPerClient, fdReserve)}
}

// cappedByClients says a rate is so close to what the clients can make that it measures them.
func cappedByClients(rate, clientCap float64) bool {
	return clientCap > 0 && rate >= cappedFraction*clientCap
}

// raiseFileLimit raises this process's soft RLIMIT_NOFILE to its hard limit (the Go runtime
// already does at start since Go 1.19; this says so in numbers) and returns the soft limit in
// force and the one found.
func raiseFileLimit() (soft, was uint64, err error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, 0, fmt.Errorf("error reading RLIMIT_NOFILE: %w", err)
	}
	was = lim.Cur
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
			return lim.Cur, was, fmt.Errorf("error raising RLIMIT_NOFILE from %d to %d: %w", lim.Cur, lim.Max, err)
		}
		lim = raised
	}
	return lim.Cur, was, nil
}

// fmtSeconds writes a duration in seconds, "0.1 s".
func fmtSeconds(d time.Duration) string {
	return fmt.Sprintf("%g s", d.Seconds())
}

// heldHold is the hold of the held scenarios: the service's own.
const heldHold = uniform.AnswerMin
