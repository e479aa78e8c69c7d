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
    @token_hash,
    @user_id,
    @purpose,
    @job_id,
    @sealed,
    @expires_at,
    @now
);

-- name: EmailTokenGetByJob :one
-- EmailTokenGetByJob finds the token a job mails.
SELECT *
FROM email_tokens
WHERE job_id = @job_id;

-- name: EmailTokenDeleteByJob :execrows
-- EmailTokenDeleteByJob deletes the token of a job that starts over with a new one.
DELETE FROM email_tokens
WHERE job_id = @job_id;

-- name: EmailTokenEraseSealed :execrows
-- EmailTokenEraseSealed erases the sealed copy of a job's token once the provider accepted its
-- mail: nothing will send it again.
UPDATE email_tokens
SET sealed = NULL
WHERE job_id = @job_id
    AND sealed IS NOT NULL;

-- name: EmailTokenEraseSealedBefore :execrows
-- EmailTokenEraseSealedBefore erases up to @max sealed copies of tokens created before @before.
UPDATE email_tokens
SET sealed = NULL
WHERE token_hash IN (
    SELECT t.token_hash
    FROM email_tokens AS t
    WHERE t.sealed IS NOT NULL
        AND t.created_at < @before
    LIMIT @max
);

-- name: EmailTokenConsume :one
-- EmailTokenConsume marks an unused, unexpired token of the given purpose used and returns its
-- user, in one statement.
UPDATE email_tokens
SET used_at = @now
WHERE token_hash = @token_hash
    AND purpose = @purpose
    AND used_at IS NULL
    AND expires_at > @now
RETURNING user_id;

-- name: EmailTokenLookup :one
-- EmailTokenLookup returns the user of an unused, unexpired token of the given purpose, and
-- that user's locale ('' when unknown, or when the user is gone), and changes nothing: a read
-- that lets a request prove its token usable before work only such a token deserves, and shows
-- the link's page in its user's language. EmailTokenConsume still decides, atomically, which
-- use wins.
SELECT email_tokens.user_id,
    CAST(coalesce(users.locale, '') AS TEXT) AS locale
FROM email_tokens
LEFT JOIN users ON users.id = email_tokens.user_id
WHERE email_tokens.token_hash = @token_hash
    AND email_tokens.purpose = @purpose
    AND email_tokens.used_at IS NULL
    AND email_tokens.expires_at > @now;

-- name: EmailTokenInvalidateUser :execrows
-- EmailTokenInvalidateUser marks every unused token of one purpose of a user used.
UPDATE email_tokens
SET used_at = @now
WHERE user_id = @user_id
    AND purpose = @purpose
    AND used_at IS NULL;

-- name: EmailTokenDeleteExpired :execrows
-- EmailTokenDeleteExpired deletes up to @max tokens that expired before @before.
DELETE FROM email_tokens
WHERE token_hash IN (
    SELECT t.token_hash
    FROM email_tokens AS t
    WHERE t.expires_at < @before
    LIMIT @max
);
