-- The rate-limit statement (queries/postgres/rate_limit_counters.sql) on a fresh key per check.
INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
VALUES (decode(md5(random()::text || clock_timestamp()::text), 'hex'), date_trunc('hour', now()), date_trunc('hour', now()) + interval '1 hour', 1, 5)
ON CONFLICT (key_hash, window_start) DO UPDATE
SET count = rate_limit_counters.count + 1
WHERE rate_limit_counters.count < excluded.limit_count
RETURNING count;
