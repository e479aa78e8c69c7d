-- A link token's user may live in a host app's own table: see the PostgreSQL migration of the
-- same name. SQLite drops no constraint in place, so the table is made anew, its rows kept.

-- +goose Up
CREATE TABLE email_tokens_new (
    token_hash BLOB PRIMARY KEY,
    user_id INTEGER NOT NULL,
    purpose TEXT NOT NULL CHECK (purpose IN ('verify', 'reset')),
    job_id INTEGER NOT NULL,
    sealed BLOB,
    expires_at INTEGER NOT NULL,
    used_at INTEGER,
    created_at INTEGER NOT NULL
);
INSERT INTO email_tokens_new (token_hash, user_id, purpose, job_id, sealed, expires_at, used_at, created_at)
SELECT token_hash, user_id, purpose, job_id, sealed, expires_at, used_at, created_at FROM email_tokens;
DROP TABLE email_tokens;
ALTER TABLE email_tokens_new RENAME TO email_tokens;

CREATE INDEX email_tokens_user_id_purpose_idx ON email_tokens (user_id, purpose);
CREATE INDEX email_tokens_expires_at_idx ON email_tokens (expires_at);
CREATE UNIQUE INDEX email_tokens_job_id_idx ON email_tokens (job_id);
CREATE INDEX email_tokens_sealed_created_at_idx ON email_tokens (created_at) WHERE sealed IS NOT NULL;

-- +goose Down
CREATE TABLE email_tokens_old (
    token_hash BLOB PRIMARY KEY,
    user_id INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    purpose TEXT NOT NULL CHECK (purpose IN ('verify', 'reset')),
    job_id INTEGER NOT NULL,
    sealed BLOB,
    expires_at INTEGER NOT NULL,
    used_at INTEGER,
    created_at INTEGER NOT NULL
);
INSERT INTO email_tokens_old (token_hash, user_id, purpose, job_id, sealed, expires_at, used_at, created_at)
SELECT token_hash, user_id, purpose, job_id, sealed, expires_at, used_at, created_at FROM email_tokens;
DROP TABLE email_tokens;
ALTER TABLE email_tokens_old RENAME TO email_tokens;

CREATE INDEX email_tokens_user_id_purpose_idx ON email_tokens (user_id, purpose);
CREATE INDEX email_tokens_expires_at_idx ON email_tokens (expires_at);
CREATE UNIQUE INDEX email_tokens_job_id_idx ON email_tokens (job_id);
CREATE INDEX email_tokens_sealed_created_at_idx ON email_tokens (created_at) WHERE sealed IS NOT NULL;
