-- Link tokens become random, and each email job gets a message row holding its idempotency key.
-- See the PostgreSQL migration of the same name for the why of each column.

-- +goose Up
-- Tokens of the first scheme were derived from APP_SECRET and a job id; all are dropped (links
-- mailed before this migration stop working). SQLite adds no NOT NULL column without a default,
-- so the table is made anew.
DROP TABLE email_tokens;

CREATE TABLE email_tokens (
    token_hash BLOB PRIMARY KEY,
    user_id INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
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
    updated_at INTEGER NOT NULL
);

CREATE INDEX email_messages_user_id_idx ON email_messages (user_id);
CREATE INDEX email_messages_created_at_idx ON email_messages (created_at);

-- +goose Down
DROP TABLE email_messages;
DROP TABLE email_tokens;
CREATE TABLE email_tokens (
    token_hash BLOB PRIMARY KEY,
    user_id INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    purpose TEXT NOT NULL CHECK (purpose IN ('verify', 'reset')),
    expires_at INTEGER NOT NULL,
    used_at INTEGER,
    created_at INTEGER NOT NULL
);
CREATE INDEX email_tokens_user_id_purpose_idx ON email_tokens (user_id, purpose);
CREATE INDEX email_tokens_expires_at_idx ON email_tokens (expires_at);
