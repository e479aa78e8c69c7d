-- name: RateLimitCounterConsume :one
-- RateLimitCounterConsume spends one request of a fixed window in one atomic statement. The limit
-- is read from excluded.limit_count because sqlc's SQLite engine drops parameters inside
-- DO UPDATE. No row back means the request is refused and was not counted.
INSERT INTO rate_limit_counters (
    key_hash,
    window_start,
    window_end,
    count,
    limit_count
) VALUES (
    @key_hash,
    @window_start,
    @window_end,
    1,
    @limit_count
)
ON CONFLICT (window_end, key_hash, window_start) DO UPDATE
SET count = rate_limit_counters.count + 1
WHERE rate_limit_counters.count < excluded.limit_count
RETURNING count;

-- name: RateLimitCounterGet :one
-- RateLimitCounterGet reads the count of one fixed window without spending any of it. No row back
-- means nothing was counted in that window yet.
SELECT count
FROM rate_limit_counters
WHERE window_end = @window_end
    AND key_hash = @key_hash
    AND window_start = @window_start;

-- name: RateLimitCounterDeleteExpired :execrows
-- RateLimitCounterDeleteExpired deletes up to @max counters whose window ended before @before:
-- the front of the table, whose primary key starts with window_end.
DELETE FROM rate_limit_counters
WHERE (window_end, key_hash, window_start) IN (
    SELECT c.window_end, c.key_hash, c.window_start
    FROM rate_limit_counters AS c
    WHERE c.window_end < @before
    ORDER BY c.window_end
    LIMIT @max
);

-- name: RateLimitCounterDelete :exec
-- RateLimitCounterDelete deletes the counter of one fixed window (none is fine): the key starts
-- the window afresh (the limits API's clear, a login that succeeded).
DELETE FROM rate_limit_counters
WHERE window_end = @window_end
    AND key_hash = @key_hash
    AND window_start = @window_start;

-- name: RateLimitCounterRefund :execrows
-- RateLimitCounterRefund gives one request back to a fixed window, never below zero: a window at
-- 0, or with no counter, is left alone.
UPDATE rate_limit_counters
SET count = count - 1
WHERE window_end = @window_end
    AND key_hash = @key_hash
    AND window_start = @window_start
    AND count > 0;
