-- name: RateLimitDeviceRevocationUpsert :exec
-- RateLimitDeviceRevocationUpsert records that every trusted-device token of a key issued so far
-- is revoked; see the PostgreSQL query of the same name. The database's clock is the process's
-- (SQLite runs in it), in unix microseconds.
INSERT INTO rate_limit_device_revocations (
    key_hash,
    revoked_at
) VALUES (
    @key_hash,
    CAST(unixepoch('now', 'subsec') * 1000000 AS INTEGER)
)
ON CONFLICT (key_hash) DO UPDATE
SET revoked_at = max(excluded.revoked_at, rate_limit_device_revocations.revoked_at + 1);

-- name: RateLimitDeviceRevocationGet :one
-- RateLimitDeviceRevocationGet reads a key's last revocation time. No row back means its devices
-- were never revoked (or so long ago that prune forgot).
SELECT revoked_at
FROM rate_limit_device_revocations
WHERE key_hash = @key_hash;

-- name: RateLimitDeviceRevocationTrusted :one
-- RateLimitDeviceRevocationTrusted says whether a device token issued under the key's revocation
-- time @since still stands: 1 while no later revocation is recorded, else 0.
SELECT NOT EXISTS (
    SELECT 1
    FROM rate_limit_device_revocations
    WHERE key_hash = @key_hash
        AND revoked_at > @since
) AS trusted;

-- name: RateLimitDeviceRevocationDeleteBefore :execrows
-- RateLimitDeviceRevocationDeleteBefore deletes up to @max revocations recorded before @before.
DELETE FROM rate_limit_device_revocations
WHERE key_hash IN (
    SELECT r.key_hash
    FROM rate_limit_device_revocations AS r
    WHERE r.revoked_at < @before
    LIMIT @max
);

-- name: RateLimitDeviceRevocationListTimes :many
-- RateLimitDeviceRevocationListTimes reads the revocation times of several accounts' devices (a
-- batch of checks' devices), in no particular order; an account never revoked has no row.
SELECT key_hash, revoked_at
FROM rate_limit_device_revocations
WHERE key_hash IN (sqlc.slice(key_hashes));
