-- name: EmailTokenInsert :exec
-- EmailTokenInsert stores a job's new token: its hash, for lookups, and its sealed copy, for the
-- job's later attempts. A job has one token at a time (job_id is unique).
INSERT INTO email_tokens (
    token_hash,
    user_id,
    purpose,
    job_id,
    sealed,
    expires_at,
    created_at
) VALUES (
    @token_hash::bytea,
    @user_id::bigint,
    @purpose,
    @job_id::bigint,
    @sealed::bytea,
    @expires_at::timestamptz,
    @now::timestamptz
);

-- name: EmailTokenGetByJob :one
-- EmailTokenGetByJob finds the token a job mails.
SELECT *
FROM email_tokens
WHERE job_id = @job_id::bigint;

-- name: EmailTokenDeleteByJob :execrows
-- EmailTokenDeleteByJob deletes the token of a job that starts over with a new one.
DELETE FROM email_tokens
WHERE job_id = @job_id::bigint;

-- name: EmailTokenEraseSealed :execrows
-- EmailTokenEraseSealed erases the sealed copy of a job's token once the provider accepted its
-- mail: nothing will send it again.
UPDATE email_tokens
SET sealed = NULL
WHERE job_id = @job_id::bigint
    AND sealed IS NOT NULL;

-- name: EmailTokenEraseSealedBefore :execrows
-- EmailTokenEraseSealedBefore erases up to @max sealed copies of tokens created before @before.
UPDATE email_tokens
SET sealed = NULL
WHERE token_hash IN (
    SELECT token_hash
    FROM email_tokens
    WHERE sealed IS NOT NULL
        AND created_at < @before::timestamptz
    LIMIT @max::bigint
    FOR UPDATE SKIP LOCKED
);

-- name: EmailTokenConsume :one
-- EmailTokenConsume marks an unused, unexpired token of the given purpose used and returns its
-- user. One statement, so of two concurrent uses exactly one gets a row.
UPDATE email_tokens
SET used_at = @now::timestamptz
WHERE token_hash = @token_hash::bytea
    AND purpose = @purpose
    AND used_at IS NULL
    AND expires_at > @now::timestamptz
RETURNING user_id;

-- name: EmailTokenLookup :one
-- EmailTokenLookup returns the user of an unused, unexpired token of the given purpose, and
-- that user's locale ('' when unknown, or when the user is gone), and changes nothing: a read
-- that lets a request prove its token usable before work only such a token deserves, and shows
-- the link's page in its user's language. EmailTokenConsume still decides, atomically, which
-- use wins.
SELECT email_tokens.user_id,
    coalesce(users.locale, '')::text AS locale
FROM email_tokens
LEFT JOIN users ON users.id = email_tokens.user_id
WHERE email_tokens.token_hash = @token_hash::bytea
    AND email_tokens.purpose = @purpose
    AND email_tokens.used_at IS NULL
    AND email_tokens.expires_at > @now::timestamptz;

-- name: EmailTokenInvalidateUser :execrows
-- EmailTokenInvalidateUser marks every unused token of one purpose of a user used.
UPDATE email_tokens
SET used_at = @now::timestamptz
WHERE user_id = @user_id::bigint
    AND purpose = @purpose
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
