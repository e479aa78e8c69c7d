-- name: EmailMessageInsert :one
-- EmailMessageInsert creates the message row of an email job at its first attempt. No row comes
-- back when the job has one already (another attempt created it), so a transaction around the
-- insert stays usable.
INSERT INTO email_messages (
    job_id,
    kind,
    user_id,
    idempotency_key,
    key_created_at,
    locale,
    payload_sha256,
    status,
    created_at,
    updated_at
) VALUES (
    @job_id,
    @kind,
    @user_id,
    @idempotency_key,
    @now,
    @locale,
    @payload_sha256,
    'queued',
    @now,
    @now
)
ON CONFLICT (job_id) DO NOTHING
RETURNING *;

-- name: EmailMessageGetByJob :one
-- EmailMessageGetByJob finds the message row of an email job.
SELECT *
FROM email_messages
WHERE job_id = @job_id;

-- name: EmailMessageRekey :execrows
-- EmailMessageRekey gives a message the provider has not accepted a new idempotency key, with the
-- locale and payload digest of what is sent under it: for a job that starts over after its key's
-- life, or whose mail renders other bytes than before.
UPDATE email_messages
SET idempotency_key = @idempotency_key,
    key_created_at = @now,
    locale = @locale,
    payload_sha256 = @payload_sha256,
    updated_at = @now
WHERE job_id = @job_id
    AND accepted_at IS NULL;

-- name: EmailMessageMarkAccepted :execrows
-- EmailMessageMarkAccepted records that the provider accepted a message (status sent) and the id
-- it gave it. The first acceptance stays.
UPDATE email_messages
SET status = 'sent',
    provider_id = coalesce(provider_id, @provider_id),
    accepted_at = coalesce(accepted_at, @now),
    updated_at = @now
WHERE job_id = @job_id;

-- name: EmailMessageDeleteBefore :execrows
-- EmailMessageDeleteBefore deletes up to @max message rows created before @before.
DELETE FROM email_messages
WHERE job_id IN (
    SELECT m.job_id
    FROM email_messages AS m
    WHERE m.created_at < @before
    LIMIT @max
);
