-- name: RateLimitDeviceRevocationUpsert :exec
-- RateLimitDeviceRevocationUpsert records that every trusted-device token of a key issued so far
-- is revoked: the key's revocation time becomes the database's clock, and always moves forward
-- (by a microsecond at least), so that a token issued under the previous revocation is revoked too
-- whatever the clock did.
INSERT INTO rate_limit_device_revocations (
    key_hash,
    revoked_at
) VALUES (
    @key_hash::bytea,
    clock_timestamp()
)
ON CONFLICT (key_hash) DO UPDATE
SET revoked_at = greatest(excluded.revoked_at, rate_limit_device_revocations.revoked_at + interval '1 microsecond');

-- name: RateLimitDeviceRevocationGet :one
-- RateLimitDeviceRevocationGet reads a key's last revocation time, the one a token issued now
-- carries. No row back means its devices were never revoked (or so long ago that prune forgot).
SELECT revoked_at
FROM rate_limit_device_revocations
WHERE key_hash = @key_hash::bytea;

-- name: RateLimitDeviceRevocationDeleteBefore :execrows
-- RateLimitDeviceRevocationDeleteBefore deletes up to @max revocations recorded before @before.
DELETE FROM rate_limit_device_revocations
WHERE key_hash IN (
    SELECT key_hash
    FROM rate_limit_device_revocations
    WHERE revoked_at < @before::timestamptz
    LIMIT @max::bigint
    FOR UPDATE SKIP LOCKED
);
