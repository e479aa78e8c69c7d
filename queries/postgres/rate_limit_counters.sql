-- name: RateLimitCounterConsume :one
-- RateLimitCounterConsume spends one request of a fixed window in one atomic statement: it
-- inserts the counter at 1, or increments it only while it is below its limit. No row back means
-- the request is refused, and a refused request is never counted.
INSERT INTO rate_limit_counters (
    key_hash,
    window_start,
    window_end,
    count,
    limit_count
) VALUES (
    @key_hash::bytea,
    @window_start::timestamptz,
    @window_end::timestamptz,
    1,
    @limit_count::bigint
)
ON CONFLICT (key_hash, window_start) DO UPDATE
SET count = rate_limit_counters.count + 1
WHERE rate_limit_counters.count < excluded.limit_count
RETURNING count;

-- name: RateLimitCounterGet :one
-- RateLimitCounterGet reads the count of one fixed window without spending any of it. No row back
-- means nothing was counted in that window yet.
SELECT count
FROM rate_limit_counters
WHERE key_hash = @key_hash::bytea
    AND window_start = @window_start::timestamptz;

-- name: RateLimitCounterDeleteExpired :execrows
-- RateLimitCounterDeleteExpired deletes up to @max counters whose window ended before @before.
DELETE FROM rate_limit_counters
WHERE (key_hash, window_start) IN (
    SELECT key_hash, window_start
    FROM rate_limit_counters
    WHERE window_end < @before::timestamptz
    LIMIT @max::bigint
    FOR UPDATE SKIP LOCKED
);

-- name: RateLimitCounterDelete :exec
-- RateLimitCounterDelete deletes the counter of one fixed window (none is fine): the key starts
-- the window afresh (the limits API's clear, a login that succeeded).
DELETE FROM rate_limit_counters
WHERE key_hash = @key_hash::bytea
    AND window_start = @window_start::timestamptz;
