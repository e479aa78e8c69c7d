-- A request's two checks and its user lookup, the statement RateLimitCounterConsumeChain sends
-- (queries/postgres/rate_limit_counters.sql) for forgot-password: a fresh IP key and a fresh
-- email key, and an email with no account.
\set n random(1, 1000000000)
WITH first AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    VALUES (decode(md5('ip' || :n || clock_timestamp()::text), 'hex'), date_trunc('hour', now()), date_trunc('hour', now()) + interval '1 hour', 1, 5)
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING count
),
second AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    SELECT decode(md5('email' || :n || clock_timestamp()::text), 'hex'), date_trunc('hour', now()), date_trunc('hour', now()) + interval '1 hour', 1, 3
    FROM first
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING count
),
counts AS (
    SELECT coalesce((SELECT count FROM first), 0)::bigint AS count_1, coalesce((SELECT count FROM second), 0)::bigint AS count_2
)
SELECT counts.count_1, counts.count_2, users.id, users.email, users.password_hash
FROM counts
LEFT JOIN users ON users.email = 'nobody-' || :n || '@example.com' AND counts.count_1 > 0 AND counts.count_2 > 0;
