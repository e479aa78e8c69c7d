#!/usr/bin/env bash
# pgbench of the rate-limit statement, to set beside the Go benchmark
# (go test -bench Store_RateLimitCounterConsume ./db): 16 clients on two cores, fresh keys and one
# hot key, with synchronous_commit off (as the service's rate-limit pool runs it) and on.
# Usage: scripts/pgbench/run.sh [seconds]   (uses a throwaway schema in $PGBENCH_URL)
set -euo pipefail
cd "$(dirname "$0")"
url="${PGBENCH_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
secs="${1:-10}"
schema="pgbench_ratelimit_$$"
psql -q "$url" -c "CREATE SCHEMA $schema" -c "CREATE TABLE $schema.rate_limit_counters (key_hash bytea NOT NULL, window_start timestamptz NOT NULL, window_end timestamptz NOT NULL, count bigint NOT NULL, limit_count bigint NOT NULL, PRIMARY KEY (key_hash, window_start)) WITH (fillfactor = 70)"
trap 'psql -q "$url" -c "SET client_min_messages = warning" -c "DROP SCHEMA $schema CASCADE"' EXIT
for sync in off on; do
  for script in fresh_keys hot_key; do
    tps=$(PGOPTIONS="-c search_path=$schema -c synchronous_commit=$sync" \
      pgbench -n -c 16 -j 2 -T "$secs" -f "$script.sql" "$url" 2>/dev/null | awk '/^tps/ {print $3; exit}')
    printf '%-11s synchronous_commit=%-3s %10.0f statements/s\n' "$script" "$sync" "$tps"
  done
done
