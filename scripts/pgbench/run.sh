#!/usr/bin/env bash
# pgbench of the rate-limit statements, to set beside the Go benchmarks
# (go test -bench 'Store_RateLimitCounterConsume' ./db) and `make load`: 16 clients on two cores,
# one check on fresh keys and on one hot key, and a request's chain (two fresh checks and a user
# lookup, one statement), with synchronous_commit off (as the service's rate-limit pool runs it)
# and on; prepared, as pgx sends them (its statement cache).
# Usage: scripts/pgbench/run.sh [seconds]   (uses a throwaway schema in $PGBENCH_URL)
set -euo pipefail
cd "$(dirname "$0")"
url="${PGBENCH_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
secs="${1:-10}"
schema="pgbench_ratelimit_$$"
psql -q "$url" -c "CREATE SCHEMA $schema" -c "CREATE TABLE $schema.rate_limit_counters (key_hash bytea NOT NULL, window_start timestamptz NOT NULL, window_end timestamptz NOT NULL, count bigint NOT NULL, limit_count bigint NOT NULL, PRIMARY KEY (key_hash, window_start)) WITH (fillfactor = 70)" -c "CREATE TABLE $schema.users (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, email text NOT NULL UNIQUE, password_hash text NOT NULL)"
trap 'psql -q "$url" -c "SET client_min_messages = warning" -c "DROP SCHEMA $schema CASCADE"' EXIT
for sync in off on; do
  for script in fresh_keys hot_key fresh_pair; do
    tps=$(PGOPTIONS="-c search_path=$schema -c synchronous_commit=$sync" \
      pgbench -n -M prepared -c 16 -j 2 -T "$secs" -f "$script.sql" "$url" 2>/dev/null | awk '/^tps/ {print $3; exit}')
    printf '%-11s synchronous_commit=%-3s %10.0f statements/s\n' "$script" "$sync" "$tps"
  done
done
