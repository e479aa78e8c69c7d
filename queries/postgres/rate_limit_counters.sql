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

-- name: RateLimitCounterConsumeChain :one
-- RateLimitCounterConsumeChain spends one request of up to three fixed windows, in order, in one
-- statement and so one round trip: each window is spent as RateLimitCounterConsume spends it, and
-- only when the one before it admitted (a data-modifying CTE runs once, and "second" reads
-- "first"'s RETURNING, so it inserts nothing when "first" refused). A window whose key is NULL is
-- not part of the chain, nor is any after it. A count of 0 says that window refused or was not
-- spent (an admitted window counts at least 1). The windows' keys are of different scopes, so no
-- two CTEs touch one row, and every statement locks its rows in the same order of scopes:
-- concurrent chains cannot deadlock. It names no table but the counters: the limiter's part of
-- postguard's tables is all it needs (RateLimitCounterConsumeChainUser reads a user too).
WITH first AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    VALUES (@key_hash_1::bytea, @window_start_1::timestamptz, @window_end_1::timestamptz, 1, @limit_count_1::bigint)
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING count
),
second AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    SELECT sqlc.narg(key_hash_2)::bytea, @window_start_2::timestamptz, @window_end_2::timestamptz, 1, @limit_count_2::bigint
    FROM first
    WHERE sqlc.narg(key_hash_2)::bytea IS NOT NULL
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING count
),
third AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    SELECT sqlc.narg(key_hash_3)::bytea, @window_start_3::timestamptz, @window_end_3::timestamptz, 1, @limit_count_3::bigint
    FROM second
    WHERE sqlc.narg(key_hash_3)::bytea IS NOT NULL
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING count
),
counts AS (
    SELECT
        coalesce((SELECT count FROM first), 0)::bigint AS count_1,
        coalesce((SELECT count FROM second), 0)::bigint AS count_2,
        coalesce((SELECT count FROM third), 0)::bigint AS count_3
)
SELECT
    counts.count_1,
    counts.count_2,
    counts.count_3
FROM counts;

-- name: RateLimitCounterConsumeChainUser :one
-- RateLimitCounterConsumeChainUser is RateLimitCounterConsumeChain, whose CTEs it repeats, and,
-- when every window of the chain admitted, a read of the user with @user_email in the same
-- statement (its columns NULL when there is none): the service's users table with the limiter's
-- counters, in one round trip.
WITH first AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    VALUES (@key_hash_1::bytea, @window_start_1::timestamptz, @window_end_1::timestamptz, 1, @limit_count_1::bigint)
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING count
),
second AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    SELECT sqlc.narg(key_hash_2)::bytea, @window_start_2::timestamptz, @window_end_2::timestamptz, 1, @limit_count_2::bigint
    FROM first
    WHERE sqlc.narg(key_hash_2)::bytea IS NOT NULL
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING count
),
third AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    SELECT sqlc.narg(key_hash_3)::bytea, @window_start_3::timestamptz, @window_end_3::timestamptz, 1, @limit_count_3::bigint
    FROM second
    WHERE sqlc.narg(key_hash_3)::bytea IS NOT NULL
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING count
),
counts AS (
    SELECT
        coalesce((SELECT count FROM first), 0)::bigint AS count_1,
        coalesce((SELECT count FROM second), 0)::bigint AS count_2,
        coalesce((SELECT count FROM third), 0)::bigint AS count_3
)
SELECT
    counts.count_1,
    counts.count_2,
    counts.count_3,
    users.id AS user_id,
    users.email AS user_email,
    users.name AS user_name,
    users.password_hash AS user_password_hash,
    users.email_verified_at AS user_email_verified_at,
    users.unsubscribed_at AS user_unsubscribed_at,
    users.created_at AS user_created_at,
    users.updated_at AS user_updated_at,
    users.locale AS user_locale
FROM counts
LEFT JOIN users
    ON users.email = @user_email::text
    AND counts.count_1 > 0
    AND (sqlc.narg(key_hash_2)::bytea IS NULL OR counts.count_2 > 0)
    AND (sqlc.narg(key_hash_3)::bytea IS NULL OR counts.count_3 > 0);

-- name: RateLimitCounterGetMany :many
-- RateLimitCounterGetMany reads the counts of several fixed windows in one statement, spending
-- nothing: the i-th key with the i-th window start. A window with nothing counted has no row.
SELECT rate_limit_counters.key_hash, rate_limit_counters.window_start, rate_limit_counters.count
FROM rate_limit_counters
WHERE (rate_limit_counters.key_hash, rate_limit_counters.window_start) IN (
    SELECT unnest(@key_hashes::bytea[]), unnest(@window_starts::timestamptz[])
);
