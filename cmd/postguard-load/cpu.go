package main

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is the unit of /proc's CPU times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// cpuSnapshot is the CPU time used so far by this process, by the local PostgreSQL and Redis
// servers' processes, and by the whole machine; two snapshots give a measurement's share of each.
// The machine's figures let the report show how much CPU other processes took meanwhile: on a
// shared machine they explain a rate that moves between runs.
type cpuSnapshot struct {
	self     time.Duration
	proc     procCounters
	db       map[int]time.Duration // by PID; nil when no process named postgres was found
	redis    map[int]time.Duration // by PID; nil when no process named redis-server was found
	busy     time.Duration
	capacity time.Duration // busy + idle, all CPUs
}

func takeCPU() cpuSnapshot {
	proc := processCounters()
	servers := serverCPU(postgresProcess, redisProcess)
	s := cpuSnapshot{self: proc.user + proc.sys, proc: proc, db: servers[postgresProcess], redis: servers[redisProcess]}
	s.busy, s.capacity = machineCPU()
	return s
}

// cpuDelta is what happened between two snapshots.
type cpuDelta struct {
	self   time.Duration
	proc   procCounters // this process's user and sys time, page faults and context switches
	db     time.Duration
	dbSeen bool
	// redis is the local Redis server's CPU time: the redis_rate baseline's counters.
	redis time.Duration
	// others is the fraction of the machine's CPU capacity used by processes other than this one,
	// PostgreSQL's and Redis's; -1 when unknown.
	others float64
}

func (s cpuSnapshot) since(start cpuSnapshot) cpuDelta {
	d := cpuDelta{
		self:   s.self - start.self,
		proc:   s.proc.sub(start.proc),
		dbSeen: s.db != nil && start.db != nil,
		others: -1,
	}
	// Per process: a backend that exited meanwhile takes its time with it (its share is lost,
	// which understates); one that started meanwhile counts from zero.
	for pid, t := range s.db {
		d.db += max(t-start.db[pid], 0)
	}
	for pid, t := range s.redis {
		d.redis += max(t-start.redis[pid], 0)
	}
	if capacity := s.capacity - start.capacity; capacity > 0 {
		others := s.busy - start.busy - d.self - d.db - d.redis
		d.others = min(max(float64(others)/float64(capacity), 0), 1)
	}
	return d
}

// procCounters are this process's resource counters of getrusage(2): CPU time split into user
// and system (page faults and madvise count as system), minor page faults (a page touched for
// the first time since the runtime got it from, or returned it to, the kernel) and context
// switches (voluntary: blocked; involuntary: preempted by the kernel). They tell where CPU
// beyond the work itself goes: faulting memory back in, or threads fighting for the CPUs.
//
// gc, gcCycles and runtimeTotal come from runtime/metrics: the runtime's estimate of the CPU
// time its garbage collector took (mark assists, background and idle marking, pauses), the
// cycles completed, and the CPU time available to Go code and the runtime (GOMAXPROCS integrated
// over wall time, idle included), which gc is a share of.
type procCounters struct {
	user, sys            time.Duration
	minFaults            int64
	voluntary, preempted int64
	gc                   time.Duration
	gcCycles             int64
	runtimeTotal         time.Duration
}

func (c procCounters) sub(o procCounters) procCounters {
	return procCounters{
		user:      c.user - o.user,
		sys:       c.sys - o.sys,
		minFaults: c.minFaults - o.minFaults,
		voluntary: c.voluntary - o.voluntary,
		preempted: c.preempted - o.preempted,
		gc:        c.gc - o.gc,
		gcCycles:  c.gcCycles - o.gcCycles,

		runtimeTotal: c.runtimeTotal - o.runtimeTotal,
	}
}

func (c *procCounters) add(o procCounters) {
	c.user += o.user
	c.sys += o.sys
	c.minFaults += o.minFaults
	c.voluntary += o.voluntary
	c.preempted += o.preempted
	c.gc += o.gc
	c.gcCycles += o.gcCycles
	c.runtimeTotal += o.runtimeTotal
}

// processCounters reads this process's counters; zero when getrusage fails.
func processCounters() procCounters {
	var c procCounters
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		c.user, c.sys = time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
		c.minFaults, c.voluntary, c.preempted = ru.Minflt, ru.Nvcsw, ru.Nivcsw
	}
	samples := []metrics.Sample{{Name: metricGCCPU}, {Name: metricGCCycles}, {Name: metricRuntimeCPU}}
	metrics.Read(samples)
	if samples[0].Value.Kind() == metrics.KindFloat64 {
		c.gc = time.Duration(samples[0].Value.Float64() * float64(time.Second))
	}
	if samples[1].Value.Kind() == metrics.KindUint64 {
		c.gcCycles = int64(samples[1].Value.Uint64()) //nolint:gosec // G115: a count of GC cycles
	}
	if samples[2].Value.Kind() == metrics.KindFloat64 {
		c.runtimeTotal = time.Duration(samples[2].Value.Float64() * float64(time.Second))
	}
	return c
}

// The runtime/metrics of procCounters.
const (
	metricGCCPU      = "/cpu/classes/gc/total:cpu-seconds"
	metricGCCycles   = "/gc/cycles/total:gc-cycles"
	metricRuntimeCPU = "/cpu/classes/total:cpu-seconds"
)

// The command names of the local database servers whose CPU time the report shows.
const (
	postgresProcess = "postgres"     // the server and its backends
	redisProcess    = "redis-server" // the redis_rate baseline's server
)

// serverCPU returns, for each of names, the user and system CPU time of each process of that
// command name (a server running on this machine), by PID; a name without processes has none.
func serverCPU(names ...string) map[string]map[int]time.Duration {
	paths, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return nil
	}
	byName := make(map[string]map[int]time.Duration)
	for _, path := range paths {
		data, err := os.ReadFile(path) //nolint:gosec // G304: path is /proc/<pid>/stat, from the glob above
		if err != nil {
			continue // gone meanwhile
		}
		comm, utime, stime, ok := parseProcStat(data)
		if !ok || !slices.Contains(names, comm) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		if err != nil {
			continue
		}
		if byName[comm] == nil {
			byName[comm] = make(map[int]time.Duration)
		}
		byName[comm][pid] = time.Duration(utime+stime) * clockTick
	}
	return byName
}

// parseProcStat reads the command name and the utime and stime fields (14 and 15, in clock
// ticks) of /proc/PID/stat. The name is in parentheses and may hold spaces.
func parseProcStat(data []byte) (comm string, utime, stime int64, ok bool) {
	open, closing := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
	if open < 0 || closing < open {
		return "", 0, 0, false
	}
	fields := strings.Fields(string(data[closing+1:]))
	// fields[0] is field 3 (state), so field n is fields[n-3].
	if len(fields) < 13 {
		return "", 0, 0, false
	}
	utime, errU := strconv.ParseInt(fields[11], 10, 64)
	stime, errS := strconv.ParseInt(fields[12], 10, 64)
	if errU != nil || errS != nil {
		return "", 0, 0, false
	}
	return string(data[open+1 : closing]), utime, stime, true
}

// machineCPU reads the first line of /proc/stat: CPU time spent busy, and in total (busy, idle
// and waiting), summed over all CPUs.
func machineCPU() (busy, capacity time.Duration) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0
	}
	var idle, all int64
	for i, f := range fields[1:] {
		if i >= 8 { // guest and guest_nice are already counted in user and nice
			break
		}
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, 0
		}
		all += v
		if i == 3 || i == 4 { // idle, iowait
			idle += v
		}
	}
	return time.Duration(all-idle) * clockTick, time.Duration(all) * clockTick
}
