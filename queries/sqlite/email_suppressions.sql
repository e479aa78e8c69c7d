-- name: EmailSuppressionInsert :exec
-- EmailSuppressionInsert puts an address (its HMAC) on the suppression list. An address on it
-- already keeps its first reason and time.
INSERT INTO email_suppressions (
    address_hash,
    reason,
    detail,
    email_id,
    suppressed_at,
    created_at
) VALUES (
    @address_hash,
    @reason,
    @detail,
    @email_id,
    @suppressed_at,
    @now
)
ON CONFLICT (address_hash) DO NOTHING;

-- name: EmailSuppressionGet :one
-- EmailSuppressionGet finds an address (its HMAC) on the suppression list.
SELECT *
FROM email_suppressions
WHERE address_hash = @address_hash;

-- name: EmailSuppressionDelete :execrows
-- EmailSuppressionDelete takes an address (its HMAC) off the suppression list.
DELETE FROM email_suppressions
WHERE address_hash = @address_hash;

-- name: EmailSuppressionList :many
-- EmailSuppressionList lists up to @max suppressions, newest first, that come after the one at
-- (@before_at, @before_hash) in that order: a page of the list, keyed on the last row of the
-- page before.
SELECT *
FROM email_suppressions
WHERE suppressed_at < @before_at
    OR (suppressed_at = @before_at AND address_hash < @before_hash)
ORDER BY suppressed_at DESC, address_hash DESC
LIMIT @max;
