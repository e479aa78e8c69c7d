#!/usr/bin/env bash
# postguard measured from outside its process (issue 26): the service's own binary, `postguard
# serve` on a throwaway PostgreSQL database, driven over loopback by wrk, a separate client.
#
#   many IPs  wrk, CONNECTIONS (1024) connections on 2 threads for SECS (20) seconds after a
#             WARMUP_SECS (2) warm-up: POST /v1/auth/forgot-password, each request from a new
#             client IP (X-Forwarded-For in 10.0.0.0/8, the service trusting 127.0.0.1/32) with a
#             new unknown email. Every answer is held ≥ 100 ms (uniform timing), so N connections
#             cannot pass N/0.1 s: a figure at ≥ 90 % of that is flagged "capped by clients".
#   ceiling   pgbench on the same server, 16 clients, 2 threads, -M prepared,
#             synchronous_commit=off (as the service's rate-limit pool runs), a script of the
#             fresh-key upsert of scripts/pgbench/fresh_keys.sql twice, each statement its own
#             autocommit (-n, no BEGIN): one script run is one pair, so pgbench's tps is pairs/s.
#             SECS/2 before many IPs and SECS/2 after, so a drift of the machine weighs on both.
#   idle      one connection, one thread, sequential, for IDLE_SECS (10) after the warm-up,
#             with the service otherwise idle: POST /v1/limits/outside {"key": new} (bearer
#             LIMITS_API_TOKEN, rule RATE_LIMIT_OUTSIDE_KEY), one check on a fresh key; p50, p99.
#
# A round is one binary on a fresh database and a fresh process: idle first, then the ceiling's
# first half, many IPs, the ceiling's second half. With -baseline REV the rounds alternate,
# baseline then current, ROUNDS (2) times, so that drift shows; and then both binaries run at
# once, each idle on a fresh database of its own, while IDLE_SLICES (20) pairs of 1 s idle slices
# alternate between them, each binary first in every other pair: a drift of the machine (other
# work on it) then weighs on both alike. The pairs' p50 ratios give their median, and how many
# pairs the current binary was the faster of. One summary table ends the run.
#
# Usage: scripts/outside/run.sh [-baseline REV] [-rounds N] [-connections N] [-threads N]
# Environment: PGBASE (postgres://postgres@127.0.0.1:5432; its user needs CREATEDB), SECS,
# IDLE_SECS, IDLE_SLICES, WARMUP_SECS, ROUNDS, CONNECTIONS, THREADS; KEEP=1 keeps the temporary directory of
# logs and outputs, which a failed run always keeps.
#
# Needs go, curl, openssl, psql and pgbench (PostgreSQL's client), and wrk, the HTTP load
# generator of Debian's `wrk` package: installed here with apt-get when missing.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

pgbase="${PGBASE:-postgres://postgres@127.0.0.1:5432}"
pgbase="${pgbase%/}"
secs="${SECS:-20}"
idle_secs="${IDLE_SECS:-10}"
idle_slices="${IDLE_SLICES:-20}"
warmup_secs="${WARMUP_SECS:-2}"
rounds="${ROUNDS:-2}"
connections="${CONNECTIONS:-1024}"
threads="${THREADS:-2}"
baseline=""
ceiling_clients=16

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    -baseline) [ $# -ge 2 ] || usage; baseline="$2"; shift 2 ;;
    -rounds) [ $# -ge 2 ] || usage; rounds="$2"; shift 2 ;;
    -connections) [ $# -ge 2 ] || usage; connections="$2"; shift 2 ;;
    -threads) [ $# -ge 2 ] || usage; threads="$2"; shift 2 ;;
    -h | -help | --help) usage ;;
    *) echo "run.sh: unknown argument $1" >&2; usage ;;
  esac
done
for v in secs idle_secs idle_slices warmup_secs rounds connections threads; do
  if ! [[ ${!v} =~ ^[0-9]+$ ]] || [ "${!v}" -lt 1 ]; then
    echo "run.sh: $v must be a whole number ≥ 1, not '${!v}'" >&2
    exit 2
  fi
done
if [ "$secs" -lt 2 ]; then echo "run.sh: SECS must be ≥ 2 (the ceiling is measured in two halves)" >&2; exit 2; fi
if [ "$threads" -gt "$connections" ]; then echo "run.sh: threads ($threads) exceed connections ($connections)" >&2; exit 2; fi

if ! command -v wrk >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
fi
for tool in go curl openssl psql pgbench wrk; do
  command -v "$tool" >/dev/null || { echo "run.sh: $tool is needed and not found" >&2; exit 1; }
done

# wrk keeps a descriptor per connection, and so does the service (Go raises its own soft limit).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt $((connections + 64)) ]; then
  echo "run.sh: $connections connections need more file descriptors than ulimit -n $(ulimit -n)" >&2
  exit 1
fi

tmp="$(mktemp -d /tmp/outside.XXXXXX)"
services=()    # the pids of the services started and not yet stopped
child_pid=""   # wrk or pgbench while it runs
sampler_pid="" # sample_backends while many IPs runs
databases=()   # the databases made and not yet dropped
status=0

# stop_service PID: SIGTERM, then SIGKILL after 10 s.
stop_service() {
  local pid=$1 rest=() p
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  for p in "${services[@]}"; do [ "$p" = "$pid" ] || rest+=("$p"); done
  services=("${rest[@]}")
}

stop_sampler() {
  [ -n "$sampler_pid" ] || return 0
  kill -TERM "$sampler_pid" 2>/dev/null || true
  wait "$sampler_pid" 2>/dev/null || true
  sampler_pid=""
}

# drop_database DB, with any connection it still has.
drop_database() {
  local rest=() d
  psql -q "$pgbase/postgres?sslmode=disable" -c "SET client_min_messages = warning" \
    -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" >/dev/null 2>&1 || echo "run.sh: could not drop database $1" >&2
  for d in "${databases[@]}"; do [ "$d" = "$1" ] || rest+=("$d"); done
  databases=("${rest[@]}")
}

cleanup() {
  status=$?
  trap - EXIT INT TERM
  if [ -n "$child_pid" ]; then
    kill -TERM "$child_pid" 2>/dev/null || true
    wait "$child_pid" 2>/dev/null || true
  fi
  stop_sampler
  local pid db
  for pid in "${services[@]}"; do stop_service "$pid"; done
  for db in "${databases[@]}"; do drop_database "$db"; done
  if [ "$status" -eq 0 ] && [ -z "${KEEP:-}" ]; then
    rm -rf "$tmp"
  elif [ "$status" -eq 0 ]; then
    echo "run.sh: logs and outputs kept in $tmp (KEEP)" >&2
  else
    echo "run.sh: failed (exit $status); logs kept in $tmp" >&2
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# bounded OUT COMMAND...: runs a client in the background, its output into OUT, and waits for
# it, so that a signal reaches the trap (and the trap the client) at once, not after the
# client's duration. (Redirected here, not around the call: the trap would inherit that.)
bounded() {
  local out=$1
  shift
  "$@" >"$out" 2>&1 &
  child_pid=$!
  local rc=0
  wait "$child_pid" || rc=$?
  child_pid=""
  return "$rc"
}

# free_port: a port of 127.0.0.1 that nothing answers on, below the kernel's ephemeral range
# (wrk's and pgbench's own ends take ports from that range, and a port bound there is refused to
# a connect yet taken for a listen).
free_port() {
  local low port
  low="$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)"
  [ "$low" -gt 11024 ] || low=61000 # an odd range: above it instead
  for _ in $(seq 1 200); do
    port=$((10000 + RANDOM % (low - 10000 - 1024)))
    [ "$low" -ne 61000 ] || port=$((61000 + RANDOM % 4000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
  echo "run.sh: no free port found on 127.0.0.1" >&2
  return 1
}

# --- binaries -----------------------------------------------------------------------------------

echo "building bin/postguard from the working tree" >&2
(cd "$root" && env -u GOWORK go build -o bin/postguard ./cmd/postguard)
current_bin="$root/bin/postguard"
head_rev="$(git -C "$root" rev-parse --short HEAD)"
current_name="working tree at $head_rev"
if [ -n "$(git -C "$root" status --porcelain --untracked-files=no)" ]; then
  current_name="$current_name (with uncommitted changes)"
fi

baseline_bin=""
if [ -n "$baseline" ]; then
  baseline_rev="$(git -C "$root" rev-parse --verify --quiet "$baseline^{commit}")" ||
    { echo "run.sh: $baseline is not a git revision" >&2; exit 2; }
  echo "building the baseline, $baseline ($baseline_rev), from git archive" >&2
  mkdir "$tmp/baseline-src"
  git -C "$root" archive "$baseline_rev" | tar -x -C "$tmp/baseline-src"
  (cd "$tmp/baseline-src" && env -u GOWORK go build -o "$tmp/postguard-baseline" ./cmd/postguard)
  baseline_bin="$tmp/postguard-baseline"
fi

# --- one round ----------------------------------------------------------------------------------

# The two fresh-key upserts per script run, each its own statement (and, with -n and no BEGIN,
# its own transaction): the statement of record, twice.
ceiling_sql="$tmp/two_upserts.sql"
cat "$root/scripts/pgbench/fresh_keys.sql" "$root/scripts/pgbench/fresh_keys.sql" >"$ceiling_sql"

results="$tmp/results.tsv"
: >"$results"
db_seq=0

# wrk_run MODE CONNECTIONS THREADS SECONDS URL TOKEN OUT: one wrk run; OUT gets its output,
# whose "outside …" line is the figures.
wrk_run() {
  local mode=$1 conns=$2 thr=$3 dur=$4 url=$5 token=$6 out=$7
  OUTSIDE_MODE=$mode OUTSIDE_TAG="$$-$RANDOM-$RANDOM" OUTSIDE_THREADS=$thr OUTSIDE_TOKEN=$token \
    bounded "$out" wrk -c "$conns" -t "$thr" -d "${dur}s" --timeout 10s --latency -s "$here/requests.lua" "$url" ||
    { echo "run.sh: wrk failed:" >&2; tail -n 20 "$out" >&2; return 1; }
  grep -q '^outside ' "$out" || { echo "run.sh: wrk printed no figures:" >&2; tail -n 20 "$out" >&2; return 1; }
}

# field NAME FILE: the value of NAME= in FILE's "outside …" line.
field() { grep '^outside ' "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"; }

# ceiling_run SECONDS URL SCHEMA OUT: pgbench's pairs over SECONDS, and its tps, into OUT.
ceiling_run() {
  local dur=$1 url=$2 schema=$3 out=$4
  PGOPTIONS="-c search_path=$schema -c synchronous_commit=off" \
    bounded "$out" pgbench -n -M prepared -c "$ceiling_clients" -j 2 -T "$dur" -f "$ceiling_sql" "$url" ||
    { echo "run.sh: pgbench failed:" >&2; tail -n 20 "$out" >&2; return 1; }
}

# ticks FILE FIELD: utime + stime (FIELD utime, FIELD+1 stime, counting from the state field)
# of /proc/PID/stat, whose command name may hold spaces.
ticks() { sed 's/^.*) //' "$1" 2>/dev/null | awk -v f="$2" '{print $f + $(f + 1)}'; }

# cpu_snapshot OUT PID: the machine's busy and total clock ticks (every CPU), the service PID's,
# and the reaped children's of this script (wrk's, as a window holds no other client), into OUT.
cpu_snapshot() {
  {
    awk '/^cpu / {busy = $2 + $3 + $4 + $7 + $8 + $9; print "machine", busy, busy + $5 + $6}' /proc/stat
    echo "service $(ticks "/proc/$2/stat" 12)"
    echo "wrk $(ticks "/proc/$$/stat" 14)"
  } >"$1"
}

# backend_ticks DB: "pid ticks" of each PostgreSQL backend of DB, found by its process title
# ("postgres: 15/main: user DB host(port) state"), with no connection of its own.
backend_ticks() {
  local pids
  pids="$(grep -las -- "^postgres: .* $1 " /proc/[0-9]*/cmdline | cut -d/ -f3)" || true
  [ -n "$pids" ] || return 0
  # A backend may end between the two looks: its stat is then skipped.
  (cd /proc && for pid in $pids; do cat "$pid/stat" 2>/dev/null || true; done) | awk '{print $1, $14 + $15}'
}

# sample_backends DB OUT: backend_ticks every 0.25 s, appended to OUT, until killed. The
# service's pool replaces a connection whose query a client's disconnect cancelled, so the
# backends of a window are not those of its start: each one's last sample counts.
sample_backends() {
  while :; do
    backend_ticks "$1" >>"$2"
    sleep 0.25
  done
}

# cpu_shares BEFORE AFTER BACKENDS_BEFORE BACKENDS: the window's CPU as percentages of the
# machine: the service, DB's backends, wrk, and the rest.
cpu_shares() {
  awk 'FILENAME == ARGV[1] {b[$1] = $2; bt[$1] = $3; next}
    FILENAME == ARGV[2] {a[$1] = $2; at[$1] = $3; next}
    FILENAME == ARGV[3] {first[$1] = $2; next}
    {if ($2 > last[$1]) last[$1] = $2}
    END {
      total = at["machine"] - bt["machine"]; busy = a["machine"] - b["machine"]
      svc = a["service"] - b["service"]; wrk = a["wrk"] - b["wrk"]
      for (p in last) pg += last[p] - (p in first ? first[p] : 0)
      if (total <= 0) total = 1
      printf "%.0f\t%.0f\t%.0f\t%.0f", 100 * svc / total, 100 * pg / total, 100 * wrk / total, 100 * (busy - svc - pg - wrk) / total
    }' "$1" "$2" "$3" "$4"
}

# start_service NAME BINARY: a fresh database, migrated by BINARY, and BINARY's `postguard serve`
# on it, ready; sets S_PID, S_DB, S_URL (the database's), S_BASE (the service's) and S_TOKEN
# (LIMITS_API_TOKEN). Its log is $tmp/NAME.log.
start_service() {
  local name=$1 bin=$2
  db_seq=$((db_seq + 1))
  S_DB="outside_$$_$db_seq"
  S_URL="$pgbase/$S_DB?sslmode=disable"
  local log="$tmp/$name.log"
  psql -q "$pgbase/postgres?sslmode=disable" -c "CREATE DATABASE $S_DB" >/dev/null
  databases+=("$S_DB")

  local secret admin
  secret="$(openssl rand -hex 32)"
  admin="$(openssl rand -hex 32)"
  S_TOKEN="$(openssl rand -hex 32)"
  # A clean environment: no RATE_LIMIT_, OTEL_ or other variable of the caller's reaches it.
  local env=(env -i "PATH=$PATH" "HOME=${HOME:-/tmp}"
    "DATABASE_URL=$S_URL" "APP_SECRET=$secret" "ADMIN_TOKEN=$admin" "LIMITS_API_TOKEN=$S_TOKEN"
    "METRICS_ADDR=off" "MAILER=log" "TRUSTED_PROXIES=127.0.0.1/32" "RATE_LIMIT_OUTSIDE_KEY=1000000000/1h")

  echo "$name: migrating $S_DB" >&2
  "${env[@]}" "$bin" migrate >>"$log" 2>&1 ||
    { echo "run.sh: migrate failed; its log:" >&2; tail -n 30 "$log" >&2; return 1; }
  local port ready="" attempt
  for attempt in 1 2 3 4 5; do
    port="$(free_port)"
    S_BASE="http://127.0.0.1:$port"
    "${env[@]}" "HTTP_ADDR=127.0.0.1:$port" "APP_URL=$S_BASE" "$bin" serve >>"$log" 2>&1 &
    S_PID=$!
    services+=("$S_PID")
    for _ in $(seq 1 300); do
      if ! kill -0 "$S_PID" 2>/dev/null; then break; fi
      if curl -fsS -o /dev/null "$S_BASE/readyz" 2>/dev/null; then ready=1; break; fi
      sleep 0.1
    done
    [ -z "$ready" ] || break
    stop_service "$S_PID"
    # Taken between the check and the listen: another port.
    tail -n 1 "$log" | grep -q 'address already in use' || break
    echo "run.sh: port $port was taken (attempt $attempt); another" >&2
  done
  if [ -z "$ready" ]; then
    echo "run.sh: postguard serve did not become ready on $S_BASE within 30 s; the last lines of its log:" >&2
    tail -n 30 "$log" >&2
    return 1
  fi

  # The exact answers, once each, before anything is counted.
  local code
  code="$(curl -s -o /dev/null -w '%{http_code}' -X POST "$S_BASE/v1/auth/forgot-password" \
    -H 'Content-Type: application/json' -H 'X-Forwarded-For: 192.0.2.1' -d '{"email":"probe@example.com"}')"
  [ "$code" = 202 ] || { echo "run.sh: forgot-password answered $code, want 202" >&2; tail -n 30 "$log" >&2; return 1; }
  code="$(curl -s -o /dev/null -w '%{http_code}' -X POST "$S_BASE/v1/limits/outside" \
    -H "Authorization: Bearer $S_TOKEN" -H 'Content-Type: application/json' -d '{"key":"probe"}')"
  [ "$code" = 200 ] || { echo "run.sh: the limits API answered $code, want 200" >&2; tail -n 30 "$log" >&2; return 1; }
}

# round LABEL BINARY N: one binary on a fresh database and process; appends a line to results.
round() {
  local label=$1 bin=$2 n=$3
  start_service "$label-$n" "$bin"
  local pid=$S_PID db=$S_DB url=$S_URL base=$S_BASE token=$S_TOKEN

  echo "round $n, $label: idle latency, 1 connection, ${idle_secs}s" >&2
  wrk_run limits 1 1 "$warmup_secs" "$base" "$token" "$tmp/$label-$n-idle-warmup.txt"
  wrk_run limits 1 1 "$idle_secs" "$base" "$token" "$tmp/$label-$n-idle.txt"

  local schema="outside_ceiling"
  psql -q "$url" -c "CREATE SCHEMA $schema" -c "CREATE TABLE $schema.rate_limit_counters (key_hash bytea NOT NULL, window_start timestamptz NOT NULL, window_end timestamptz NOT NULL, count bigint NOT NULL, limit_count bigint NOT NULL, PRIMARY KEY (key_hash, window_start)) WITH (fillfactor = 70)" >/dev/null
  local half1=$((secs / 2)) half2=$((secs - secs / 2))
  echo "round $n, $label: ceiling (1/2), pgbench ${half1}s" >&2
  ceiling_run "$half1" "$url" "$schema" "$tmp/$label-$n-ceiling1.txt"

  echo "round $n, $label: many IPs, $connections connections, ${secs}s" >&2
  wrk_run forgot "$connections" "$threads" "$warmup_secs" "$base" "$token" "$tmp/$label-$n-many-warmup.txt"
  local cpu="$tmp/$label-$n-cpu"
  backend_ticks "$db" >"$cpu-backends-before.txt"
  cp "$cpu-backends-before.txt" "$cpu-backends.txt"
  sample_backends "$db" "$cpu-backends.txt" &
  sampler_pid=$!
  cpu_snapshot "$cpu-before.txt" "$pid"
  wrk_run forgot "$connections" "$threads" "$secs" "$base" "$token" "$tmp/$label-$n-many.txt"
  cpu_snapshot "$cpu-after.txt" "$pid"
  stop_sampler
  backend_ticks "$db" >>"$cpu-backends.txt"

  echo "round $n, $label: ceiling (2/2), pgbench ${half2}s" >&2
  ceiling_run "$half2" "$url" "$schema" "$tmp/$label-$n-ceiling2.txt"

  stop_service "$pid"
  drop_database "$db"

  local idle="$tmp/$label-$n-idle.txt" many="$tmp/$label-$n-many.txt"
  local tps1 tps2
  tps1="$(awk '/^tps/ {print $3; exit}' "$tmp/$label-$n-ceiling1.txt")"
  tps2="$(awk '/^tps/ {print $3; exit}' "$tmp/$label-$n-ceiling2.txt")"
  local failed
  failed="$(cat "$tmp/$label-$n-ceiling1.txt" "$tmp/$label-$n-ceiling2.txt" | awk '/^number of failed transactions/ {s += $5} END {print s + 0}')"
  # Columns: label round idle_requests idle_us idle_p50 idle_p99 idle_errors many_requests many_us
  # many_status many_socket ceiling_tps ceiling_failed, then many IPs' CPU: service postgres wrk
  # other, percentages of the machine
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$n" \
    "$(field requests "$idle")" "$(field duration_us "$idle")" "$(field p50_us "$idle")" "$(field p99_us "$idle")" \
    "$(($(field status_errors "$idle") + $(field connect "$idle") + $(field read "$idle") + $(field write "$idle") + $(field timeout "$idle")))" \
    "$(field requests "$many")" "$(field duration_us "$many")" "$(field status_errors "$many")" \
    "$(($(field connect "$many") + $(field read "$many") + $(field write "$many") + $(field timeout "$many")))" \
    "$(awk -v a="$tps1" -v b="$tps2" -v h1="$half1" -v h2="$half2" 'BEGIN {printf "%.1f", (a * h1 + b * h2) / (h1 + h2)}')" \
    "$failed" "$(cpu_shares "$cpu-before.txt" "$cpu-after.txt" "$cpu-backends-before.txt" "$cpu-backends.txt")" >>"$results"
}

# --- the rounds ---------------------------------------------------------------------------------

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
for n in $(seq 1 "$rounds"); do
  if [ -n "$baseline_bin" ]; then round baseline "$baseline_bin" "$n"; fi
  round current "$current_bin" "$n"
done

# Both binaries up at once, idle, each on its own database; 1 s slices alternate between them.
slices="$tmp/slices.tsv"
: >"$slices"
if [ -n "$baseline_bin" ]; then
  start_service interleaved-baseline "$baseline_bin"
  b_pid=$S_PID b_db=$S_DB b_base=$S_BASE b_token=$S_TOKEN
  start_service interleaved-current "$current_bin"
  c_pid=$S_PID c_db=$S_DB c_base=$S_BASE c_token=$S_TOKEN
  echo "interleaved idle: $idle_slices pairs of 1 s slices, alternating" >&2
  wrk_run limits 1 1 "$warmup_secs" "$b_base" "$b_token" "$tmp/interleaved-baseline-warmup.txt"
  wrk_run limits 1 1 "$warmup_secs" "$c_base" "$c_token" "$tmp/interleaved-current-warmup.txt"
  for i in $(seq 1 "$idle_slices"); do
    # Each goes first in every other pair, so that the order weighs on neither.
    if [ $((i % 2)) -eq 1 ]; then
      wrk_run limits 1 1 1 "$b_base" "$b_token" "$tmp/slice-baseline-$i.txt"
      wrk_run limits 1 1 1 "$c_base" "$c_token" "$tmp/slice-current-$i.txt"
    else
      wrk_run limits 1 1 1 "$c_base" "$c_token" "$tmp/slice-current-$i.txt"
      wrk_run limits 1 1 1 "$b_base" "$b_token" "$tmp/slice-baseline-$i.txt"
    fi
    for label in baseline current; do
      f="$tmp/slice-$label-$i.txt"
      printf '%s\t%s\t%s\t%s\t%s\n' "$label" "$i" "$(field p50_us "$f")" "$(field p99_us "$f")" \
        "$(($(field status_errors "$f") + $(field connect "$f") + $(field read "$f") + $(field write "$f") + $(field timeout "$f")))" >>"$slices"
    done
  done
  stop_service "$b_pid"
  stop_service "$c_pid"
  drop_database "$b_db"
  drop_database "$c_db"
fi
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

# --- the summary --------------------------------------------------------------------------------

cap=$((connections * 10))
busy=20 # the rest's share of the machine, in %, from which a round is flagged "machine busy"
pg_version="$(psql -Atq "$pgbase/postgres?sslmode=disable" -c 'SHOW server_version')"
wrk_version="$( (wrk -v 2>&1 || true) | awk 'NR == 1 {print $2}')" # wrk -v exits 1
{
  echo
  echo "## postguard from outside its process"
  echo
  echo "- machine: nproc $(nproc), $(uname -m), PostgreSQL $pg_version, wrk $wrk_version; load average $load_before before, $load_after after"
  echo "- current: $current_name${baseline:+; baseline: $baseline ($(git -C "$root" rev-parse --short "$baseline_rev"))}"
  echo "- each round: its binary's \`postguard serve\` on a fresh database, then in order:"
  echo "  - idle: wrk -c1 -t1, ${idle_secs} s after a $warmup_secs s warm-up, POST /v1/limits/outside with a new key per request (one check on a fresh key)"
  echo "  - ceiling: pgbench -n -M prepared -c $ceiling_clients -j 2, synchronous_commit=off, two fresh-key upserts (scripts/pgbench/fresh_keys.sql twice) per script run, each its own autocommit; $((secs / 2)) s before many IPs and $((secs - secs / 2)) s after; pairs/s = script runs/s"
  echo "  - many IPs: wrk -c $connections -t $threads, $secs s after a $warmup_secs s warm-up, POST /v1/auth/forgot-password, new X-Forwarded-For (10.0.0.0/8) and new unknown email per request; cap $cap req/s ($connections connections ÷ 100 ms hold)"
  echo "- errors: HTTP statuses > 399 and socket errors as wrk counts them (each run's exact answers, 202 and 200, are checked once with curl first)"
  echo
  echo "- CPU during many IPs, % of the machine's $(nproc) CPUs: the service, its database's backends, wrk, and the rest (PostgreSQL's own processes and whatever else runs)"
  echo
  echo "| binary | round | idle p50 ms | idle p99 ms | idle checks/s | many IPs req/s | many IPs errors | ceiling pairs/s | many IPs ÷ ceiling | CPU % service/backends/wrk/rest | note |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  awk -F'\t' -v cap="$cap" -v busy="$busy" '{
    idle_rate = $3 / ($4 / 1e6); many = $8 / ($9 / 1e6); ratio = many / $12
    note = ""
    if (many >= 0.9 * cap) note = "capped by clients"
    if ($7 > 0) note = note (note ? "; " : "") $7 " idle errors"
    if ($13 > 0) note = note (note ? "; " : "") $13 " failed pgbench transactions"
    if ($17 >= busy) note = note (note ? "; " : "") "machine busy"
    printf "| %s | %d | %.3f | %.3f | %.0f | %.0f | %d status, %d socket | %.0f | %.2f | %d/%d/%d/%d | %s |\n",
      $1, $2, $5 / 1000, $6 / 1000, idle_rate, many, $10, $11, $12, ratio, $14, $15, $16, $17, note
  }' "$results"
  echo
  awk -F'\t' -v cap="$cap" -v busy="$busy" '
    { many = $8 / ($9 / 1e6); ratio[$1] += many / $12; p50[$1] += $5; rounds[$1]++; p50r[$1, $2] = $5
      errors += $10 + $11 + $7; if (many >= 0.9 * cap) capped++; if ($17 >= busy) busied++ }
    END {
      printf "- many IPs ÷ ceiling, current, mean of %d rounds: %.2f (target ≥ 0.50)\n", rounds["current"], ratio["current"] / rounds["current"]
      if (rounds["baseline"] > 0) {
        printf "- many IPs ÷ ceiling, baseline, mean of %d rounds: %.2f\n", rounds["baseline"], ratio["baseline"] / rounds["baseline"]
        per = ""
        for (i = 1; i <= rounds["current"]; i++) per = per (i > 1 ? ", " : "") sprintf("%.2f", p50r["current", i] / p50r["baseline", i])
        printf "- idle p50 in the rounds, current ÷ baseline: %.2f (mean p50 %.3f ms ÷ %.3f ms; per round %s)\n",
          (p50["current"] / rounds["current"]) / (p50["baseline"] / rounds["baseline"]),
          p50["current"] / rounds["current"] / 1000, p50["baseline"] / rounds["baseline"] / 1000, per
      }
      if (errors > 0) printf "- ERRORS: %d answers were errors (see the table): the figures are not to be quoted\n", errors
      else print "- every answer a success: 0 HTTP statuses > 399, 0 socket errors"
      if (busied > 0) printf "- %d round(s) shared the machine with other work (the rest ≥ %d %% of it during many IPs, about 10 %% when quiet): their figures measure that too; quote a run on a quiet machine\n", busied, busy
      if (capped > 0) printf "- %d many-IPs figure(s) at ≥ 90 %% of the clients cap: raise -connections\n", capped
    }' "$results"
  if [ -s "$slices" ]; then
    # median FIELD LABEL: the median of FIELD over LABEL's slices.
    median() { awk -F'\t' -v f="$1" -v l="$2" '$1 == l {print $f}' "$slices" | sort -n | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
    b50="$(median 3 baseline)" c50="$(median 3 current)" b99="$(median 4 baseline)" c99="$(median 4 current)"
    echo "- idle, interleaved (both binaries up at once, each idle on its own fresh database; $idle_slices pairs of 1 s slices, wrk -c1 -t1, alternating):" \
      "median p50 current $(awk -v v="$c50" 'BEGIN {printf "%.3f", v / 1000}') ms, baseline $(awk -v v="$b50" 'BEGIN {printf "%.3f", v / 1000}') ms;" \
      "median p99 current $(awk -v v="$c99" 'BEGIN {printf "%.3f", v / 1000}') ms, baseline $(awk -v v="$b99" 'BEGIN {printf "%.3f", v / 1000}') ms"
    # Each pair's current ÷ baseline p50: their median, and the pairs the current binary won.
    awk -F'\t' '$1 == "baseline" {b[$2] = $3} $1 == "current" {c[$2] = $3}
      END {for (i in c) print c[i] / b[i]}' "$slices" | sort -n | awk '
      {v[NR] = $1; if ($1 < 1) won++}
      END {printf "  - p50 current ÷ baseline, median of the %d pairs: %.2f (quartiles %.2f–%.2f); current the faster in %d of %d pairs\n",
        NR, NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, v[int((NR + 3) / 4)], v[int((3 * NR + 3) / 4)], won, NR}'
    echo "  - slices' p50 ms, baseline: $(awk -F'\t' '$1 == "baseline" {printf "%s%.3f", (n++ ? " " : ""), $3 / 1000}' "$slices")"
    echo "  - slices' p50 ms, current:  $(awk -F'\t' '$1 == "current" {printf "%s%.3f", (n++ ? " " : ""), $3 / 1000}' "$slices")"
    slice_errors="$(awk -F'\t' '{s += $5} END {print s + 0}' "$slices")"
    [ "$slice_errors" -eq 0 ] || echo "  - ERRORS: $slice_errors idle answers in the slices were errors"
  fi
}
