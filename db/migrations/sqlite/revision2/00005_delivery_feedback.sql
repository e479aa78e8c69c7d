-- Delivery feedback: each message's lifecycle as Resend's webhooks report it, the suppression
-- list, and the webhook deliveries already seen. See the PostgreSQL migration of the same name
-- for the why of each column.

-- +goose Up
ALTER TABLE email_messages ADD COLUMN status_at INTEGER;
ALTER TABLE email_messages ADD COLUMN sent_at INTEGER;
ALTER TABLE email_messages ADD COLUMN delivered_at INTEGER;
ALTER TABLE email_messages ADD COLUMN delayed_at INTEGER;
ALTER TABLE email_messages ADD COLUMN bounced_at INTEGER;
ALTER TABLE email_messages ADD COLUMN complained_at INTEGER;
ALTER TABLE email_messages ADD COLUMN suppressed_at INTEGER;
ALTER TABLE email_messages ADD COLUMN failed_at INTEGER;
ALTER TABLE email_messages ADD COLUMN bounce_type TEXT;
ALTER TABLE email_messages ADD COLUMN bounce_sub_type TEXT;

UPDATE email_messages SET sent_at = accepted_at WHERE accepted_at IS NOT NULL;

CREATE INDEX email_messages_provider_id_idx ON email_messages (provider_id);

CREATE TABLE email_suppressions (
    address_hash BLOB PRIMARY KEY,
    reason TEXT NOT NULL CHECK (reason IN ('bounced', 'complained', 'suppressed')),
    detail TEXT NOT NULL,
    email_id TEXT NOT NULL,
    suppressed_at INTEGER NOT NULL,
    created_at INTEGER NOT NULL
) WITHOUT ROWID;

CREATE INDEX email_suppressions_list_idx ON email_suppressions (suppressed_at, address_hash);

CREATE TABLE webhook_events (
    svix_id TEXT PRIMARY KEY,
    received_at INTEGER NOT NULL
) WITHOUT ROWID;

CREATE INDEX webhook_events_received_at_idx ON webhook_events (received_at);

-- +goose Down
DROP TABLE webhook_events;
DROP TABLE email_suppressions;
DROP INDEX email_messages_provider_id_idx;
ALTER TABLE email_messages DROP COLUMN bounce_sub_type;
ALTER TABLE email_messages DROP COLUMN bounce_type;
ALTER TABLE email_messages DROP COLUMN failed_at;
ALTER TABLE email_messages DROP COLUMN suppressed_at;
ALTER TABLE email_messages DROP COLUMN complained_at;
ALTER TABLE email_messages DROP COLUMN bounced_at;
ALTER TABLE email_messages DROP COLUMN delayed_at;
ALTER TABLE email_messages DROP COLUMN delivered_at;
ALTER TABLE email_messages DROP COLUMN sent_at;
ALTER TABLE email_messages DROP COLUMN status_at;
