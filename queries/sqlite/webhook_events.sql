-- name: WebhookEventInsert :execrows
-- WebhookEventInsert records a webhook delivery's svix-id. No row is inserted when it was seen
-- already (a replay), so a transaction around the insert stays usable.
INSERT INTO webhook_events (
    svix_id,
    received_at
) VALUES (
    @svix_id,
    @now
)
ON CONFLICT (svix_id) DO NOTHING;

-- name: WebhookEventDeleteBefore :execrows
-- WebhookEventDeleteBefore deletes up to @max svix-ids received before @before.
DELETE FROM webhook_events
WHERE svix_id IN (
    SELECT w.svix_id
    FROM webhook_events AS w
    WHERE w.received_at < @before
    LIMIT @max
);
