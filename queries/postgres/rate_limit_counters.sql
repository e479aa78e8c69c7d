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
-- concurrent chains cannot deadlock. It names no table but the limiter's part of postguard's
-- tables, all a host of the limiter alone has (RateLimitCounterConsumeChainUser reads a user too).
--
-- A trusted device (@device_key_hash not NULL) is checked in the same statement: while no
-- revocation of its account's devices (@device_revocation_hash) is later than @device_since, the
-- window at position @device_window (1-based) is the device's own, @device_key_hash, instead of
-- the account's; device_trusted says which was spent.
WITH device AS (
    SELECT (
        sqlc.narg(device_key_hash)::bytea IS NOT NULL
        AND NOT EXISTS (
            SELECT 1
            FROM rate_limit_device_revocations
            WHERE rate_limit_device_revocations.key_hash = sqlc.narg(device_revocation_hash)::bytea
                AND rate_limit_device_revocations.revoked_at > @device_since::timestamptz
        )
    ) AS trusted
),
keys AS (
    SELECT
        CASE WHEN device.trusted AND @device_window::integer = 1 THEN sqlc.narg(device_key_hash)::bytea ELSE @key_hash_1::bytea END AS key_1,
        CASE WHEN device.trusted AND @device_window::integer = 2 THEN sqlc.narg(device_key_hash)::bytea ELSE sqlc.narg(key_hash_2)::bytea END AS key_2,
        CASE WHEN device.trusted AND @device_window::integer = 3 THEN sqlc.narg(device_key_hash)::bytea ELSE sqlc.narg(key_hash_3)::bytea END AS key_3,
        device.trusted
    FROM device
),
first AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    SELECT keys.key_1, @window_start_1::timestamptz, @window_end_1::timestamptz, 1, @limit_count_1::bigint
    FROM keys
    WHERE keys.key_1 IS NOT NULL
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING count
),
second AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    SELECT keys.key_2, @window_start_2::timestamptz, @window_end_2::timestamptz, 1, @limit_count_2::bigint
    FROM first, keys
    WHERE keys.key_2 IS NOT NULL
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING count
),
third AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    SELECT keys.key_3, @window_start_3::timestamptz, @window_end_3::timestamptz, 1, @limit_count_3::bigint
    FROM second, keys
    WHERE keys.key_3 IS NOT NULL
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING count
),
counts AS (
    SELECT
        coalesce((SELECT count FROM first), 0)::bigint AS count_1,
        coalesce((SELECT count FROM second), 0)::bigint AS count_2,
        coalesce((SELECT count FROM third), 0)::bigint AS count_3,
        (SELECT trusted FROM keys)::boolean AS device_trusted
)
SELECT
    counts.count_1,
    counts.count_2,
    counts.count_3,
    counts.device_trusted
FROM counts;

-- name: RateLimitCounterConsumeChainUser :one
-- RateLimitCounterConsumeChainUser is RateLimitCounterConsumeChain, whose CTEs it repeats, and,
-- when every window of the chain admitted, a read of the user with @user_email in the same
-- statement (its columns NULL when there is none): the service's users table with the limiter's
-- counters, in one round trip.
WITH device AS (
    SELECT (
        sqlc.narg(device_key_hash)::bytea IS NOT NULL
        AND NOT EXISTS (
            SELECT 1
            FROM rate_limit_device_revocations
            WHERE rate_limit_device_revocations.key_hash = sqlc.narg(device_revocation_hash)::bytea
                AND rate_limit_device_revocations.revoked_at > @device_since::timestamptz
        )
    ) AS trusted
),
keys AS (
    SELECT
        CASE WHEN device.trusted AND @device_window::integer = 1 THEN sqlc.narg(device_key_hash)::bytea ELSE @key_hash_1::bytea END AS key_1,
        CASE WHEN device.trusted AND @device_window::integer = 2 THEN sqlc.narg(device_key_hash)::bytea ELSE sqlc.narg(key_hash_2)::bytea END AS key_2,
        CASE WHEN device.trusted AND @device_window::integer = 3 THEN sqlc.narg(device_key_hash)::bytea ELSE sqlc.narg(key_hash_3)::bytea END AS key_3,
        device.trusted
    FROM device
),
first AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    SELECT keys.key_1, @window_start_1::timestamptz, @window_end_1::timestamptz, 1, @limit_count_1::bigint
    FROM keys
    WHERE keys.key_1 IS NOT NULL
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING count
),
second AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    SELECT keys.key_2, @window_start_2::timestamptz, @window_end_2::timestamptz, 1, @limit_count_2::bigint
    FROM first, keys
    WHERE keys.key_2 IS NOT NULL
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING count
),
third AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    SELECT keys.key_3, @window_start_3::timestamptz, @window_end_3::timestamptz, 1, @limit_count_3::bigint
    FROM second, keys
    WHERE keys.key_3 IS NOT NULL
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING count
),
counts AS (
    SELECT
        coalesce((SELECT count FROM first), 0)::bigint AS count_1,
        coalesce((SELECT count FROM second), 0)::bigint AS count_2,
        coalesce((SELECT count FROM third), 0)::bigint AS count_3,
        (SELECT trusted FROM keys)::boolean AS device_trusted
)
SELECT
    counts.count_1,
    counts.count_2,
    counts.count_3,
    counts.device_trusted,
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
-- nothing: the i-th key with the i-th window start, one row per window in that order (ord, from
-- 1), 0 for a window with nothing counted. A trusted device is checked as in
-- RateLimitCounterConsumeChain: while it stands, the window at @device_window is the device's own.
WITH device AS (
    SELECT (
        sqlc.narg(device_key_hash)::bytea IS NOT NULL
        AND NOT EXISTS (
            SELECT 1
            FROM rate_limit_device_revocations
            WHERE rate_limit_device_revocations.key_hash = sqlc.narg(device_revocation_hash)::bytea
                AND rate_limit_device_revocations.revoked_at > @device_since::timestamptz
        )
    ) AS trusted
),
windows AS (
    SELECT
        CASE WHEN device.trusted AND w.ord = @device_window::bigint THEN sqlc.narg(device_key_hash)::bytea ELSE w.key_hash END AS key_hash,
        (@window_starts::timestamptz[])[w.ord] AS window_start,
        w.ord
    FROM unnest(@key_hashes::bytea[]) WITH ORDINALITY AS w (key_hash, ord)
    CROSS JOIN device
)
SELECT
    windows.ord::bigint AS ord,
    coalesce(rate_limit_counters.count, 0)::bigint AS count,
    device.trusted::boolean AS device_trusted
FROM windows
CROSS JOIN device
LEFT JOIN rate_limit_counters
    ON rate_limit_counters.key_hash = windows.key_hash
    AND rate_limit_counters.window_start = windows.window_start
ORDER BY windows.ord;

-- name: RateLimitCounterRefund :one
-- RateLimitCounterRefund gives one request back to each of several fixed windows (the i-th key
-- with the i-th window start) in one statement, never below zero: a window at 0, or with no
-- counter, is left alone. The rows are locked in the order given (the chain's order of scopes),
-- so a refund and a chain cannot deadlock. A trusted device is checked as in
-- RateLimitCounterConsumeChain: while it stands, the window at @device_window is the device's own.
WITH device AS (
    SELECT (
        sqlc.narg(device_key_hash)::bytea IS NOT NULL
        AND NOT EXISTS (
            SELECT 1
            FROM rate_limit_device_revocations
            WHERE rate_limit_device_revocations.key_hash = sqlc.narg(device_revocation_hash)::bytea
                AND rate_limit_device_revocations.revoked_at > @device_since::timestamptz
        )
    ) AS trusted
),
windows AS (
    SELECT
        CASE WHEN device.trusted AND w.ord = @device_window::bigint THEN sqlc.narg(device_key_hash)::bytea ELSE w.key_hash END AS key_hash,
        (@window_starts::timestamptz[])[w.ord] AS window_start,
        w.ord
    FROM unnest(@key_hashes::bytea[]) WITH ORDINALITY AS w (key_hash, ord)
    CROSS JOIN device
),
locked AS (
    SELECT rate_limit_counters.key_hash, rate_limit_counters.window_start
    FROM rate_limit_counters
    JOIN windows
        ON rate_limit_counters.key_hash = windows.key_hash
        AND rate_limit_counters.window_start = windows.window_start
    WHERE rate_limit_counters.count > 0
    ORDER BY windows.ord
    FOR UPDATE OF rate_limit_counters
),
refunded AS (
    UPDATE rate_limit_counters
    SET count = rate_limit_counters.count - 1
    FROM locked
    WHERE rate_limit_counters.key_hash = locked.key_hash
        AND rate_limit_counters.window_start = locked.window_start
        AND rate_limit_counters.count > 0
    RETURNING rate_limit_counters.key_hash
)
SELECT
    (SELECT count(*) FROM refunded)::bigint AS refunded,
    device.trusted::boolean AS device_trusted
FROM device;

-- name: RateLimitCounterDeleteMany :one
-- RateLimitCounterDeleteMany deletes the counters of several fixed windows (the i-th key with the
-- i-th window start; none is fine) in one statement: those keys start their windows afresh. The
-- rows are locked in the order given, as RateLimitCounterRefund locks them. A trusted device is
-- checked as in RateLimitCounterConsumeChain: while it stands, the window at @device_window is the
-- device's own.
WITH device AS (
    SELECT (
        sqlc.narg(device_key_hash)::bytea IS NOT NULL
        AND NOT EXISTS (
            SELECT 1
            FROM rate_limit_device_revocations
            WHERE rate_limit_device_revocations.key_hash = sqlc.narg(device_revocation_hash)::bytea
                AND rate_limit_device_revocations.revoked_at > @device_since::timestamptz
        )
    ) AS trusted
),
windows AS (
    SELECT
        CASE WHEN device.trusted AND w.ord = @device_window::bigint THEN sqlc.narg(device_key_hash)::bytea ELSE w.key_hash END AS key_hash,
        (@window_starts::timestamptz[])[w.ord] AS window_start,
        w.ord
    FROM unnest(@key_hashes::bytea[]) WITH ORDINALITY AS w (key_hash, ord)
    CROSS JOIN device
),
locked AS (
    SELECT rate_limit_counters.key_hash, rate_limit_counters.window_start
    FROM rate_limit_counters
    JOIN windows
        ON rate_limit_counters.key_hash = windows.key_hash
        AND rate_limit_counters.window_start = windows.window_start
    ORDER BY windows.ord
    FOR UPDATE OF rate_limit_counters
),
deleted AS (
    DELETE FROM rate_limit_counters
    USING locked
    WHERE rate_limit_counters.key_hash = locked.key_hash
        AND rate_limit_counters.window_start = locked.window_start
    RETURNING rate_limit_counters.key_hash
)
SELECT
    (SELECT count(*) FROM deleted)::bigint AS deleted,
    device.trusted::boolean AS device_trusted
FROM device;

-- name: RateLimitCounterConsumeBatch :many
-- RateLimitCounterConsumeBatch spends the chains of several requests (a batch, see db's Tables) in
-- one statement: chain i's windows are the i-th elements of the arrays (@key_hashes_2 and
-- @key_hashes_3 NULL past a chain's last window), each spent as RateLimitCounterConsumeChain spends
-- it and only when the one before it in its chain admitted. No key is in two chains of a batch, so
-- no row is touched twice, and a key's RETURNING row is its chain's. Every batch locks its rows in
-- one order, all first windows by key, then all second ones, then the third: "second" joins the
-- array of "first"'s keys, which PostgreSQL computes whole before second's first row, so no second
-- window is locked before every first one is. Batches of several processes then cannot deadlock,
-- neither with each other nor with the single chains, which lock in the same order of positions.
-- One row per chain, in order (ord, from 1), counts 0 past its refusal as in
-- RateLimitCounterConsumeChain. A trusted device (@device_key_hashes[i] not NULL) is checked per
-- chain as there, its window at @device_windows[i] (1-based).
WITH input AS (
    SELECT
        i.ord,
        (
            (@device_key_hashes::bytea[])[i.ord] IS NOT NULL
            AND NOT EXISTS (
                SELECT 1
                FROM rate_limit_device_revocations
                WHERE rate_limit_device_revocations.key_hash = (@device_revocation_hashes::bytea[])[i.ord]
                    AND rate_limit_device_revocations.revoked_at > (@device_sinces::timestamptz[])[i.ord]
            )
        ) AS trusted
    FROM generate_subscripts(@key_hashes_1::bytea[], 1) AS i (ord)
),
chains AS (
    SELECT
        input.ord,
        input.trusted,
        CASE WHEN input.trusted AND (@device_windows::integer[])[input.ord] = 1 THEN (@device_key_hashes::bytea[])[input.ord] ELSE (@key_hashes_1::bytea[])[input.ord] END AS key_1,
        CASE WHEN input.trusted AND (@device_windows::integer[])[input.ord] = 2 THEN (@device_key_hashes::bytea[])[input.ord] ELSE (@key_hashes_2::bytea[])[input.ord] END AS key_2,
        CASE WHEN input.trusted AND (@device_windows::integer[])[input.ord] = 3 THEN (@device_key_hashes::bytea[])[input.ord] ELSE (@key_hashes_3::bytea[])[input.ord] END AS key_3,
        (@window_starts_1::timestamptz[])[input.ord] AS window_start_1,
        (@window_starts_2::timestamptz[])[input.ord] AS window_start_2,
        (@window_starts_3::timestamptz[])[input.ord] AS window_start_3,
        (@window_ends_1::timestamptz[])[input.ord] AS window_end_1,
        (@window_ends_2::timestamptz[])[input.ord] AS window_end_2,
        (@window_ends_3::timestamptz[])[input.ord] AS window_end_3,
        (@limit_counts_1::bigint[])[input.ord] AS limit_count_1,
        (@limit_counts_2::bigint[])[input.ord] AS limit_count_2,
        (@limit_counts_3::bigint[])[input.ord] AS limit_count_3
    FROM input
),
first AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    SELECT chains.key_1, chains.window_start_1, chains.window_end_1, 1, chains.limit_count_1
    FROM chains
    ORDER BY chains.key_1
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING rate_limit_counters.key_hash, rate_limit_counters.count
),
second AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    SELECT chains.key_2, chains.window_start_2, chains.window_end_2, 1, chains.limit_count_2
    FROM chains
    JOIN unnest(ARRAY(SELECT first.key_hash FROM first)) AS admitted (key_hash)
        ON admitted.key_hash = chains.key_1
    WHERE chains.key_2 IS NOT NULL
    ORDER BY chains.key_2
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING rate_limit_counters.key_hash, rate_limit_counters.count
),
third AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    SELECT chains.key_3, chains.window_start_3, chains.window_end_3, 1, chains.limit_count_3
    FROM chains
    JOIN unnest(ARRAY(SELECT second.key_hash FROM second)) AS admitted (key_hash)
        ON admitted.key_hash = chains.key_2
    WHERE chains.key_3 IS NOT NULL
    ORDER BY chains.key_3
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING rate_limit_counters.key_hash, rate_limit_counters.count
)
SELECT
    chains.ord::bigint AS ord,
    coalesce(first.count, 0)::bigint AS count_1,
    coalesce(second.count, 0)::bigint AS count_2,
    coalesce(third.count, 0)::bigint AS count_3,
    chains.trusted::boolean AS device_trusted
FROM chains
LEFT JOIN first ON first.key_hash = chains.key_1
LEFT JOIN second ON second.key_hash = chains.key_2
LEFT JOIN third ON third.key_hash = chains.key_3
ORDER BY chains.ord;

-- name: RateLimitCounterConsumeBatchUser :many
-- RateLimitCounterConsumeBatchUser is RateLimitCounterConsumeBatch, whose CTEs it repeats (sqlc
-- has no way to share them), and, for each chain whose every window admitted, a read of the user
-- with @user_emails[i] ('' reads none) in the same statement: the service's users table with the
-- limiter's counters, as RateLimitCounterConsumeChainUser.
WITH input AS (
    SELECT
        i.ord,
        (
            (@device_key_hashes::bytea[])[i.ord] IS NOT NULL
            AND NOT EXISTS (
                SELECT 1
                FROM rate_limit_device_revocations
                WHERE rate_limit_device_revocations.key_hash = (@device_revocation_hashes::bytea[])[i.ord]
                    AND rate_limit_device_revocations.revoked_at > (@device_sinces::timestamptz[])[i.ord]
            )
        ) AS trusted
    FROM generate_subscripts(@key_hashes_1::bytea[], 1) AS i (ord)
),
chains AS (
    SELECT
        input.ord,
        input.trusted,
        CASE WHEN input.trusted AND (@device_windows::integer[])[input.ord] = 1 THEN (@device_key_hashes::bytea[])[input.ord] ELSE (@key_hashes_1::bytea[])[input.ord] END AS key_1,
        CASE WHEN input.trusted AND (@device_windows::integer[])[input.ord] = 2 THEN (@device_key_hashes::bytea[])[input.ord] ELSE (@key_hashes_2::bytea[])[input.ord] END AS key_2,
        CASE WHEN input.trusted AND (@device_windows::integer[])[input.ord] = 3 THEN (@device_key_hashes::bytea[])[input.ord] ELSE (@key_hashes_3::bytea[])[input.ord] END AS key_3,
        (@window_starts_1::timestamptz[])[input.ord] AS window_start_1,
        (@window_starts_2::timestamptz[])[input.ord] AS window_start_2,
        (@window_starts_3::timestamptz[])[input.ord] AS window_start_3,
        (@window_ends_1::timestamptz[])[input.ord] AS window_end_1,
        (@window_ends_2::timestamptz[])[input.ord] AS window_end_2,
        (@window_ends_3::timestamptz[])[input.ord] AS window_end_3,
        (@limit_counts_1::bigint[])[input.ord] AS limit_count_1,
        (@limit_counts_2::bigint[])[input.ord] AS limit_count_2,
        (@limit_counts_3::bigint[])[input.ord] AS limit_count_3
    FROM input
),
first AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    SELECT chains.key_1, chains.window_start_1, chains.window_end_1, 1, chains.limit_count_1
    FROM chains
    ORDER BY chains.key_1
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING rate_limit_counters.key_hash, rate_limit_counters.count
),
second AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    SELECT chains.key_2, chains.window_start_2, chains.window_end_2, 1, chains.limit_count_2
    FROM chains
    JOIN unnest(ARRAY(SELECT first.key_hash FROM first)) AS admitted (key_hash)
        ON admitted.key_hash = chains.key_1
    WHERE chains.key_2 IS NOT NULL
    ORDER BY chains.key_2
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING rate_limit_counters.key_hash, rate_limit_counters.count
),
third AS (
    INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count)
    SELECT chains.key_3, chains.window_start_3, chains.window_end_3, 1, chains.limit_count_3
    FROM chains
    JOIN unnest(ARRAY(SELECT second.key_hash FROM second)) AS admitted (key_hash)
        ON admitted.key_hash = chains.key_2
    WHERE chains.key_3 IS NOT NULL
    ORDER BY chains.key_3
    ON CONFLICT (key_hash, window_start) DO UPDATE
    SET count = rate_limit_counters.count + 1
    WHERE rate_limit_counters.count < excluded.limit_count
    RETURNING rate_limit_counters.key_hash, rate_limit_counters.count
)
SELECT
    chains.ord::bigint AS ord,
    coalesce(first.count, 0)::bigint AS count_1,
    coalesce(second.count, 0)::bigint AS count_2,
    coalesce(third.count, 0)::bigint AS count_3,
    chains.trusted::boolean AS device_trusted,
    users.id AS user_id,
    users.email AS user_email,
    users.name AS user_name,
    users.password_hash AS user_password_hash,
    users.email_verified_at AS user_email_verified_at,
    users.unsubscribed_at AS user_unsubscribed_at,
    users.created_at AS user_created_at,
    users.updated_at AS user_updated_at,
    users.locale AS user_locale
FROM chains
LEFT JOIN first ON first.key_hash = chains.key_1
LEFT JOIN second ON second.key_hash = chains.key_2
LEFT JOIN third ON third.key_hash = chains.key_3
LEFT JOIN users
    ON users.email = (@user_emails::text[])[chains.ord]
    AND first.count IS NOT NULL
    AND (chains.key_2 IS NULL OR second.count IS NOT NULL)
    AND (chains.key_3 IS NULL OR third.count IS NOT NULL)
ORDER BY chains.ord;
