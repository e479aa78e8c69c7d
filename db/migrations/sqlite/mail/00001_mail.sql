-- The mail part: see the PostgreSQL migration of the same name for the why of each column. Times
-- are INTEGER microseconds since the Unix epoch.

-- +goose Up
CREATE TABLE email_tokens (
    token_hash BLOB PRIMARY KEY,
    user_id INTEGER NOT NULL,
    purpose TEXT NOT NULL CHECK (purpose IN ('verify', 'reset')),
    job_id INTEGER NOT NULL,
    sealed BLOB,
    expires_at INTEGER NOT NULL,
    used_at INTEGER,
    created_at INTEGER NOT NULL
);

CREATE INDEX email_tokens_user_id_purpose_idx ON email_tokens (user_id, purpose);
CREATE INDEX email_tokens_expires_at_idx ON email_tokens (expires_at);
CREATE UNIQUE INDEX email_tokens_job_id_idx ON email_tokens (job_id);
CREATE INDEX email_tokens_sealed_created_at_idx ON email_tokens (created_at) WHERE sealed IS NOT NULL;

CREATE TABLE email_messages (
    job_id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    user_id INTEGER NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE,
    key_created_at INTEGER NOT NULL,
    status TEXT NOT NULL,
    provider_id TEXT,
    accepted_at INTEGER,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    status_at INTEGER,
    sent_at INTEGER,
    delivered_at INTEGER,
    delayed_at INTEGER,
    bounced_at INTEGER,
    complained_at INTEGER,
    suppressed_at INTEGER,
    failed_at INTEGER,
    bounce_type TEXT,
    bounce_sub_type TEXT,
    locale TEXT NOT NULL DEFAULT '',
    payload_sha256 BLOB
);

CREATE INDEX email_messages_user_id_idx ON email_messages (user_id);
CREATE INDEX email_messages_created_at_idx ON email_messages (created_at);
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

CREATE TABLE send_pacer (
    name TEXT PRIMARY KEY,
    tat_us INTEGER NOT NULL,
    interval_us INTEGER NOT NULL
);

-- +goose Down
DROP TABLE send_pacer;
DROP TABLE webhook_events;
DROP TABLE email_suppressions;
DROP TABLE email_messages;
DROP TABLE email_tokens;
