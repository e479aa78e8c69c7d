-- Delivery feedback: each message's lifecycle as Resend's webhooks report it, the suppression
-- list, and the webhook deliveries already seen.

-- +goose Up
-- The time of each status a message reached, the earliest event of that status (an event that
-- comes again, or late, never moves it). status_at is the time of the event that set the current
-- status, so that an older event never overwrites a newer status; it is NULL while the status is
-- postguard's own (queued, sent as the worker recorded the acceptance, suppressed before any
-- send), which any provider event may follow whatever the clocks say. The queued time is
-- created_at. bounce_type and bounce_sub_type are Resend's classification of a bounce
-- (Permanent/General, Transient/MailboxFull…), never its message, which may quote the address.
ALTER TABLE email_messages
    ADD COLUMN status_at timestamptz,
    ADD COLUMN sent_at timestamptz,
    ADD COLUMN delivered_at timestamptz,
    ADD COLUMN delayed_at timestamptz,
    ADD COLUMN bounced_at timestamptz,
    ADD COLUMN complained_at timestamptz,
    ADD COLUMN suppressed_at timestamptz,
    ADD COLUMN failed_at timestamptz,
    ADD COLUMN bounce_type text,
    ADD COLUMN bounce_sub_type text;

UPDATE email_messages SET sent_at = accepted_at WHERE accepted_at IS NOT NULL;

-- Webhook events name the message by Resend's id. Not unique: Resend's ids are, but a Sender
-- that repeats one (a test's, a host app's) must not make sends fail.
CREATE INDEX email_messages_provider_id_idx ON email_messages (provider_id);

-- The suppression list: no mail goes to these addresses. address_hash is HMAC-SHA-256 under
-- APP_SECRET of "suppression:v1:" and the normalised address: no address is stored. reason says
-- what put it there (a permanent bounce, a complaint, Resend's own suppression), detail Resend's
-- classification of it, email_id the mail whose event did, suppressed_at that event's time.
CREATE TABLE email_suppressions (
    address_hash bytea PRIMARY KEY,
    reason text NOT NULL CHECK (reason IN ('bounced', 'complained', 'suppressed')),
    detail text NOT NULL,
    email_id text NOT NULL,
    suppressed_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL
);

CREATE INDEX email_suppressions_list_idx ON email_suppressions (suppressed_at, address_hash);

-- The svix-id of every webhook delivery applied, so that a replay changes nothing again; pruned
-- after a retention longer than Resend's retries last.
CREATE TABLE webhook_events (
    svix_id text PRIMARY KEY,
    received_at timestamptz NOT NULL
);

CREATE INDEX webhook_events_received_at_idx ON webhook_events (received_at);

-- +goose Down
DROP TABLE webhook_events;
DROP TABLE email_suppressions;
DROP INDEX email_messages_provider_id_idx;
ALTER TABLE email_messages
    DROP COLUMN bounce_sub_type,
    DROP COLUMN bounce_type,
    DROP COLUMN failed_at,
    DROP COLUMN suppressed_at,
    DROP COLUMN complained_at,
    DROP COLUMN bounced_at,
    DROP COLUMN delayed_at,
    DROP COLUMN delivered_at,
    DROP COLUMN sent_at,
    DROP COLUMN status_at;
