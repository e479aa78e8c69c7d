-- name: EmailTokenInsert :exec
-- EmailTokenInsert stores a token's hash the first time a job derives it; a retried job finds it
-- there and keeps its original expiry.
INSERT INTO email_tokens (
    token_hash,
    user_id,
    purpose,
    expires_at,
    created_at
) VALUES (
    @token_hash::bytea,
    @user_id::bigint,
    @purpose::text,
    @expires_at::timestamptz,
    @now::timestamptz
)
ON CONFLICT (token_hash) DO NOTHING;

-- name: EmailTokenConsume :one
-- EmailTokenConsume marks an unused, unexpired token of the given purpose used and returns its
-- user. One statement, so of two concurrent uses exactly one gets a row.
UPDATE email_tokens
SET used_at = @now::timestamptz
WHERE token_hash = @token_hash::bytea
    AND purpose = @purpose::text
    AND used_at IS NULL
    AND expires_at > @now::timestamptz
RETURNING user_id;

-- name: EmailTokenLookup :one
-- EmailTokenLookup returns the user of an unused, unexpired token of the given purpose, and
-- changes nothing: a read that lets a request prove its token usable before work only such a
-- token deserves. EmailTokenConsume still decides, atomically, which use wins.
SELECT user_id
FROM email_tokens
WHERE token_hash = @token_hash::bytea
    AND purpose = @purpose::text
    AND used_at IS NULL
    AND expires_at > @now::timestamptz;

-- name: EmailTokenInvalidateUser :execrows
-- EmailTokenInvalidateUser marks every unused token of one purpose of a user used.
UPDATE email_tokens
SET used_at = @now::timestamptz
WHERE user_id = @user_id::bigint
    AND purpose = @purpose::text
    AND used_at IS NULL;

-- name: EmailTokenDeleteExpired :execrows
-- EmailTokenDeleteExpired deletes up to @max tokens that expired before @before.
DELETE FROM email_tokens
WHERE token_hash IN (
    SELECT token_hash
    FROM email_tokens
    WHERE expires_at < @before::timestamptz
    LIMIT @max::bigint
    FOR UPDATE SKIP LOCKED
);
