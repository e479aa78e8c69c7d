-- The rate-limit statement on one hot key (one attacker, one row), with a limit it never reaches.
INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
VALUES ('\x686f74'::bytea, date_trunc('hour', now()), date_trunc('hour', now()) + interval '1 hour', 1, 1000000000000)
ON CONFLICT (key_hash, window_start) DO UPDATE
SET count = rate_limit_counters.count + 1
WHERE rate_limit_counters.count < excluded.limit_count
RETURNING count;
