package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// histogram counts latencies in log-linear buckets: exact below 64ns, then 32 buckets per power
// of two (under 3% error), up to about 68s (longer ones land in the last bucket). 4 KiB, so each
// client keeps its own and nothing is shared on the hot path.
type histogram struct {
	counts [histogramBuckets]uint32
	total  uint64
}

const (
	histogramSubBits = 5
	histogramSub     = 1 << histogramSubBits // buckets per power of two
	histogramBuckets = 1024
)

func histogramIndex(d time.Duration) int {
	v := uint64(max(d, 0))
	if v < 2*histogramSub {
		return int(v)
	}
	shift := bits.Len64(v) - histogramSubBits - 1
	return min(shift*histogramSub+int(v>>uint(shift)), histogramBuckets-1)
}

// histogramValue is the middle of bucket i.
func histogramValue(i int) time.Duration {
	if i < 2*histogramSub {
		return time.Duration(i)
	}
	shift := i/histogramSub - 1
	low := uint64(i-shift*histogramSub) << uint(shift)
	return time.Duration(low + (uint64(1)<<uint(shift))/2)
}

func (h *histogram) record(d time.Duration) {
	h.counts[histogramIndex(d)]++
	h.total++
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.total += o.total
}

// quantile returns the latency below which a fraction q of the samples fall; 0 without samples.
func (h *histogram) quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := uint64(q*float64(h.total-1)) + 1
	var seen uint64
	for i, c := range h.counts {
		seen += uint64(c)
		if seen >= rank {
			return histogramValue(i)
		}
	}
	return histogramValue(histogramBuckets - 1)
}

// sample is one measurement: completed requests, their latencies, the time and CPU they took.
type sample struct {
	requests int64
	errors   int64
	firstErr error
	elapsed  time.Duration
	cpu      cpuDelta
	hist     histogram
}

// add merges o into s, as if both had been one measurement.
func (s *sample) add(o *sample) {
	if s.firstErr == nil {
		s.firstErr = o.firstErr
	}
	if total := s.elapsed + o.elapsed; total > 0 && s.cpu.others >= 0 && o.cpu.others >= 0 {
		s.cpu.others = (s.cpu.others*float64(s.elapsed) + o.cpu.others*float64(o.elapsed)) / float64(total)
	} else {
		s.cpu.others = -1
	}
	s.requests += o.requests
	s.errors += o.errors
	s.elapsed += o.elapsed
	s.cpu.self += o.cpu.self
	s.cpu.proc.add(o.cpu.proc)
	s.cpu.db += o.cpu.db
	s.cpu.redis += o.cpu.redis
	s.cpu.dbSeen = s.cpu.dbSeen && o.cpu.dbSeen
	s.hist.merge(&o.hist)
}

func (s *sample) rate() float64 {
	if s.elapsed <= 0 {
		return 0
	}
	return float64(s.requests) / s.elapsed.Seconds()
}

// loadFunc makes one request; seq numbers the requests of a measurement from 0, so that each can
// use its own client IP, email or key. An error is a failed request.
type loadFunc func(ctx context.Context, seq uint64) error

// measure runs fn from clients goroutines in closed loops, with a progress line on stderr:
// first a warm-up (connections, pools, caches; a tenth of duration, at most 500ms) whose
// requests are not counted, then duration (extended, up to maxWindowExtension, until a first
// request completes), after which requests in flight are cancelled and not counted either. The
// rate is the requests completed within the window over the window. At most
// maxRequestsPerScenario requests are made.
func (r *runner) measure(ctx context.Context, name, unit string, clients int, duration time.Duration, fn loadFunc) *sample {
	return r.measureFrom(ctx, name, unit, clients, duration, fn, nil)
}

// measureFrom is measure, closing counting (when not nil) as the warm-up ends and the counted
// window starts: a caller that runs something beside the load (the counters' prune of the flood)
// starts it there, and ends the window early by cancelling ctx. With counting, the service's
// warnings stay muted through the warm-up: it follows another measurement on the same service,
// whose requests cut short may still be unwinding.
func (r *runner) measureFrom(ctx context.Context, name, unit string, clients int, duration time.Duration, fn loadFunc, counting chan<- struct{}) *sample {
	// Warnings count from here until the end; requests cut short at the end may unwind in the
	// service until it is closed, so they stay muted until the next measurement.
	r.warnings.mute(counting != nil)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()

	var (
		seq, done, failed atomic.Int64
		isCounting        atomic.Bool
		errOnce           sync.Once
		firstErr          error
		wg                sync.WaitGroup
	)
	hists := make([]histogram, clients)

	for i := range clients {
		// The label marks this measurement's CPU samples (go tool pprof -tagfocus=scenario=…).
		wg.Go(func() {
			pprof.Do(runCtx, pprof.Labels("scenario", name), func(runCtx context.Context) {
				hist := &hists[i]
				for runCtx.Err() == nil {
					n := seq.Add(1) - 1
					if n >= maxRequestsPerScenario {
						return
					}
					t := time.Now()
					err := fn(runCtx, uint64(n))
					d := time.Since(t)
					switch {
					case runCtx.Err() != nil:
						return // cut short at the end (or by an interrupt): not counted
					case err != nil:
						failed.Add(1)
						errOnce.Do(func() { firstErr = err })
					case isCounting.Load():
						hist.record(d)
						done.Add(1)
					}
				}
			})
		})
	}

	warmup := min(duration/10, 500*time.Millisecond)
	stopProgress := r.progress(name, func(elapsed time.Duration) string {
		if !isCounting.Load() {
			return "warming up"
		}
		return fmt.Sprintf("%8.0f %s/s", float64(done.Load())/max(elapsed-warmup, time.Millisecond).Seconds(), unit)
	})
	sleepContext(ctx, warmup)
	cpuStart := takeCPU()
	start := time.Now()
	isCounting.Store(true)
	if counting != nil {
		r.warnings.mute(false)
		close(counting)
	}
	sleepContext(ctx, duration)
	// A window shorter than one request (tiny durations, slow requests such as a registration on
	// a busy machine) is extended until one completes or fails, within a bound, so that no figure
	// is a zero that only says the window was short.
	for extended := time.Duration(0); done.Load() == 0 && failed.Load() == 0 && ctx.Err() == nil &&
		extended < maxWindowExtension; extended += 10 * time.Millisecond {
		sleepContext(ctx, 10*time.Millisecond)
	}
	elapsed := time.Since(start)
	cpu := takeCPU().since(cpuStart)
	r.warnings.mute(true) // the cancelled requests' warnings are the tool's doing
	cancel()
	wg.Wait()
	stopProgress()

	s := &sample{
		requests: done.Load(),
		errors:   failed.Load(),
		firstErr: firstErr,
		elapsed:  elapsed,
		cpu:      cpu,
	}
	for i := range hists {
		s.hist.merge(&hists[i])
	}
	return s
}

// maxWindowExtension bounds how long measure waits past its duration for a first request.
const maxWindowExtension = 30 * time.Second

// sleepContext waits d, or until ctx ends.
func sleepContext(ctx context.Context, d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
}

// progress prints "name 3.2s <status()>" on stderr every 250ms, rewriting its line, until the
// returned func is called; that prints the line a last time and ends it.
func (r *runner) progress(name string, status func(elapsed time.Duration) string) (stop func()) {
	start := time.Now()
	print := func() {
		elapsed := max(time.Since(start), time.Millisecond)
		fmt.Fprintf(r.stderr, "\r%-26s %6.1fs %s   ", name, elapsed.Seconds(), status(elapsed))
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		ticker := time.NewTicker(250 * time.Millisecond)
		defer ticker.Stop()
		for {
			select {
			case <-done:
				return
			case <-ticker.C:
				print()
			}
		}
	}()
	return func() {
		close(done)
		<-finished
		print()
		fmt.Fprintln(r.stderr)
	}
}

// resetPeakRSS resets the kernel's peak RSS of this process (VmHWM) to its current RSS, so that
// a later peakRSS covers only what follows (Linux ≥ 4.0: "5" in /proc/self/clear_refs).
func resetPeakRSS() error {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// peakRSS is VmHWM of /proc/self/status: the largest resident set since start or the last
// resetPeakRSS.
func peakRSS() (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("error reading peak RSS: %w", err)
	}
	defer f.Close()
	return parseVmHWM(f)
}

func parseVmHWM(r io.Reader) (int64, error) {
	scanner := bufio.NewScanner(r)
	for scanner.Scan() {
		rest, ok := strings.CutPrefix(scanner.Text(), "VmHWM:")
		if !ok {
			continue
		}
		kib, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("error parsing VmHWM %q: %w", rest, err)
		}
		return kib << 10, nil
	}
	if err := scanner.Err(); err != nil {
		return 0, fmt.Errorf("error reading peak RSS: %w", err)
	}
	return 0, errors.New("no VmHWM in /proc/self/status")
}
