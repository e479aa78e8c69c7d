-- name: EmailMessageInsert :one
-- EmailMessageInsert creates the message row of an email job at its first attempt. No row comes
-- back when the job has one already (another attempt created it), so a transaction around the
-- insert stays usable.
-- Its trace_parent is the W3C traceparent the job's metadata carries, NULL without one.
INSERT INTO email_messages (
    job_id,
    kind,
    user_id,
    idempotency_key,
    key_created_at,
    locale,
    payload_sha256,
    trace_parent,
    status,
    created_at,
    updated_at
) VALUES (
    @job_id::bigint,
    @kind::text,
    @user_id::bigint,
    @idempotency_key::text,
    @now::timestamptz,
    @locale::text,
    @payload_sha256::bytea,
    sqlc.narg('trace_parent')::text,
    'queued',
    @now::timestamptz,
    @now::timestamptz
)
ON CONFLICT (job_id) DO NOTHING
RETURNING *;

-- name: EmailMessageGetByJob :one
-- EmailMessageGetByJob finds the message row of an email job.
SELECT *
FROM email_messages
WHERE job_id = @job_id::bigint;

-- name: EmailMessageRekey :execrows
-- EmailMessageRekey gives a message the provider has not accepted a new idempotency key, with the
-- locale and payload digest of what is sent under it: for a job that starts over after its key's
-- life, or whose mail renders other bytes than before. It starts over: no provider is in doubt of
-- what is sent under the new key.
UPDATE email_messages
SET idempotency_key = @idempotency_key::text,
    key_created_at = @now::timestamptz,
    locale = @locale::text,
    payload_sha256 = @payload_sha256::bytea,
    provider_in_doubt = NULL,
    updated_at = @now::timestamptz
WHERE job_id = @job_id::bigint
    AND accepted_at IS NULL;

-- name: EmailMessageMarkAccepted :execrows
-- EmailMessageMarkAccepted records that a provider accepted a message (status sent, its own
-- status, so status_at is NULL), which provider and the id it gave it; no provider is in doubt
-- any more. The first acceptance stays, and so does whatever status the provider's events have
-- set since.
UPDATE email_messages
SET status = CASE WHEN accepted_at IS NULL THEN 'sent' ELSE status END,
    status_at = CASE WHEN accepted_at IS NULL THEN NULL ELSE status_at END,
    provider = coalesce(provider, @provider::text),
    provider_id = coalesce(provider_id, @provider_id::text),
    provider_in_doubt = NULL,
    accepted_at = coalesce(accepted_at, @now::timestamptz),
    sent_at = coalesce(sent_at, @now::timestamptz),
    updated_at = @now::timestamptz
WHERE job_id = @job_id::bigint;

-- name: EmailMessageSetProviderInDoubt :execrows
-- EmailMessageSetProviderInDoubt records, before a send, the provider the message is handed to
-- (its answer may be lost, or the worker die meanwhile: the job's later attempts then go to that
-- provider only), or clears it (NULL) once that provider answered that it did not take the mail.
-- A message accepted already is left as it is.
UPDATE email_messages
SET provider_in_doubt = sqlc.narg('provider')::text,
    updated_at = @now::timestamptz
WHERE job_id = @job_id::bigint
    AND accepted_at IS NULL;

-- name: EmailMessageMarkBounced :execrows
-- EmailMessageMarkBounced records that the provider refused a message's recipient for good while
-- it was sent (an SMTP relay's 5xx to RCPT TO): status bounced at @now, with the provider's
-- classification. A message accepted already is left as it is.
UPDATE email_messages
SET status = 'bounced',
    status_at = @now::timestamptz,
    bounced_at = coalesce(bounced_at, @now::timestamptz),
    bounce_type = @bounce_type::text,
    bounce_sub_type = @bounce_sub_type::text,
    provider_in_doubt = NULL,
    updated_at = @now::timestamptz
WHERE job_id = @job_id::bigint
    AND accepted_at IS NULL;

-- name: EmailMessageGetByProviderID :one
-- EmailMessageGetByProviderID finds the message the provider gave an id (the newest, should a
-- sender have repeated one), locked until the end of the transaction, so that two events of one
-- message apply one after the other.
SELECT *
FROM email_messages
WHERE provider_id = @provider_id::text
ORDER BY job_id DESC
LIMIT 1
FOR UPDATE;

-- name: EmailMessageSetLifecycle :execrows
-- EmailMessageSetLifecycle writes a message's status and the times of its statuses, as merged
-- from a provider event by the caller (under EmailMessageGetByProviderID's lock).
UPDATE email_messages
SET status = @status::text,
    status_at = sqlc.narg('status_at')::timestamptz,
    sent_at = sqlc.narg('sent_at')::timestamptz,
    delivered_at = sqlc.narg('delivered_at')::timestamptz,
    delayed_at = sqlc.narg('delayed_at')::timestamptz,
    bounced_at = sqlc.narg('bounced_at')::timestamptz,
    complained_at = sqlc.narg('complained_at')::timestamptz,
    suppressed_at = sqlc.narg('suppressed_at')::timestamptz,
    failed_at = sqlc.narg('failed_at')::timestamptz,
    bounce_type = sqlc.narg('bounce_type')::text,
    bounce_sub_type = sqlc.narg('bounce_sub_type')::text,
    updated_at = @now::timestamptz
WHERE job_id = @job_id::bigint;

-- name: EmailMessageMarkSuppressed :execrows
-- EmailMessageMarkSuppressed records that a job's mail was not sent because its address is
-- suppressed: a new message row with status suppressed, or an unaccepted one turned so. A
-- message the provider accepted already is left as it is (no row changes).
INSERT INTO email_messages (
    job_id,
    kind,
    user_id,
    idempotency_key,
    key_created_at,
    status,
    suppressed_at,
    created_at,
    updated_at
) VALUES (
    @job_id::bigint,
    @kind::text,
    @user_id::bigint,
    @idempotency_key::text,
    @now::timestamptz,
    'suppressed',
    @now::timestamptz,
    @now::timestamptz,
    @now::timestamptz
)
ON CONFLICT (job_id) DO UPDATE
SET status = 'suppressed',
    status_at = NULL,
    suppressed_at = coalesce(email_messages.suppressed_at, excluded.suppressed_at),
    updated_at = excluded.updated_at
WHERE email_messages.accepted_at IS NULL;

-- name: EmailMessageListByUser :many
-- EmailMessageListByUser lists a user's newest @max messages, newest first.
SELECT *
FROM email_messages
WHERE user_id = @user_id::bigint
ORDER BY created_at DESC, job_id DESC
LIMIT @max::bigint;

-- name: EmailMessageDeleteBefore :execrows
-- EmailMessageDeleteBefore deletes up to @max message rows created before @before.
DELETE FROM email_messages
WHERE job_id IN (
    SELECT job_id
    FROM email_messages
    WHERE created_at < @before::timestamptz
    LIMIT @max::bigint
    FOR UPDATE SKIP LOCKED
);
