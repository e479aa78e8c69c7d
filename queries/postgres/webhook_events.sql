-- name: WebhookEventInsert :execrows
-- WebhookEventInsert records a webhook delivery's svix-id. No row is inserted when it was seen
-- already (a replay), so a transaction around the insert stays usable.
INSERT INTO webhook_events (
    svix_id,
    received_at
) VALUES (
    @svix_id::text,
    @now::timestamptz
)
ON CONFLICT (svix_id) DO NOTHING;

-- name: WebhookEventDeleteBefore :execrows
-- WebhookEventDeleteBefore deletes up to @max svix-ids received before @before.
DELETE FROM webhook_events
WHERE svix_id IN (
    SELECT svix_id
    FROM webhook_events
    WHERE received_at < @before::timestamptz
    LIMIT @max::bigint
    FOR UPDATE SKIP LOCKED
);
