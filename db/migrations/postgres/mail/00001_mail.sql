-- The mail part: what the mail workers and the delivery webhook keep. A database postguard
-- migrated before revision 3 has these tables already, in this shape (revision2/ 00001 to
-- 00007); MigrateTables records this migration as applied there instead of running it.

-- +goose Up
-- A link token: its hash, never the token, and a sealed copy while its job may still send it.
-- user_id names the user the mail went to, in postguard's users table or a host app's own: no
-- foreign key. job_id: the email job that mailed it (one token per job). sealed: the token
-- encrypted under a key derived from APP_SECRET, kept only while the job may still send it, so
-- that every attempt mails the same bytes; erased once the provider accepted the mail, or after
-- 24 hours.
CREATE TABLE email_tokens (
    token_hash bytea PRIMARY KEY,
    user_id bigint NOT NULL,
    purpose text NOT NULL CHECK (purpose IN ('verify', 'reset')),
    expires_at timestamptz NOT NULL,
    used_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    job_id bigint NOT NULL,
    sealed bytea
);

CREATE INDEX email_tokens_user_id_purpose_idx ON email_tokens (user_id, purpose);
CREATE INDEX email_tokens_expires_at_idx ON email_tokens (expires_at);
CREATE UNIQUE INDEX email_tokens_job_id_idx ON email_tokens (job_id);
CREATE INDEX email_tokens_sealed_created_at_idx ON email_tokens (created_at) WHERE sealed IS NOT NULL;

-- One row per email job, from its first attempt: the idempotency key it sends under on every
-- attempt (<kind>:<user_id>:<random>), and when the provider accepted the mail, so that a later
-- attempt (a rescue after a crash) completes without sending again.
--
-- Then its lifecycle as the provider's webhooks report it: the time of each status it reached,
-- the earliest event of that status (an event that comes again, or late, never moves it).
-- status_at is the time of the event that set the current status, so that an older event never
-- overwrites a newer status; it is NULL while the status is postguard's own (queued, sent as the
-- worker recorded the acceptance, suppressed before any send), which any provider event may
-- follow whatever the clocks say. The queued time is created_at. bounce_type and bounce_sub_type
-- are the provider's classification of a bounce (Permanent/General, Transient/MailboxFull…),
-- never its message, which may quote the address.
--
-- locale: the locale the job's mail is rendered in, chosen at its first attempt and kept for
-- every later one. payload_sha256: the SHA-256 of what the job's attempts send under its
-- idempotency key (recipient, subject, bodies, headers), never the bytes themselves (they hold
-- the link's token); an attempt that renders other bytes (a deploy changed the templates) sends
-- under a new key. NULL for a message of before revision 2's mail locales.
CREATE TABLE email_messages (
    job_id bigint PRIMARY KEY,
    kind text NOT NULL,
    user_id bigint NOT NULL,
    idempotency_key text NOT NULL UNIQUE,
    key_created_at timestamptz NOT NULL,
    status text NOT NULL,
    provider_id text,
    accepted_at timestamptz,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    status_at timestamptz,
    sent_at timestamptz,
    delivered_at timestamptz,
    delayed_at timestamptz,
    bounced_at timestamptz,
    complained_at timestamptz,
    suppressed_at timestamptz,
    failed_at timestamptz,
    bounce_type text,
    bounce_sub_type text,
    locale text NOT NULL DEFAULT '',
    payload_sha256 bytea
);

CREATE INDEX email_messages_user_id_idx ON email_messages (user_id);
CREATE INDEX email_messages_created_at_idx ON email_messages (created_at);
-- Webhook events name the message by the provider's id. Not unique: Resend's ids are, but a
-- Sender that repeats one (a test's, a host app's) must not make sends fail.
CREATE INDEX email_messages_provider_id_idx ON email_messages (provider_id);

-- The suppression list: no mail goes to these addresses. address_hash is HMAC-SHA-256 under
-- APP_SECRET of "suppression:v1:" and the normalised address: no address is stored. reason says
-- what put it there (a permanent bounce, a complaint, the provider's own suppression), detail the
-- provider's classification of it, email_id the mail whose event did, suppressed_at that event's
-- time.
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

-- One row per shared send budget: the GCRA "theoretical arrival time" of the next send, in
-- microseconds since the Unix epoch, shared by every worker process.
CREATE TABLE send_pacer (
    name text PRIMARY KEY,
    tat_us bigint NOT NULL,
    interval_us bigint NOT NULL
);

-- +goose Down
DROP TABLE send_pacer;
DROP TABLE webhook_events;
DROP TABLE email_suppressions;
DROP TABLE email_messages;
DROP TABLE email_tokens;
