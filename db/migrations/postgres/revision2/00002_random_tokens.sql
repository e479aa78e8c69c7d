-- Link tokens become random, and each email job gets a message row holding its idempotency key.

-- +goose Up
-- Tokens of the first scheme were derived from APP_SECRET and a job id: whoever held both could
-- compute a working link, and a recreated database re-issued old links to new users. Their hashes
-- cannot be told from those of random tokens, so all are deleted: a link mailed before this
-- migration stops working, and its user asks for a new one.
DELETE FROM email_tokens;

-- job_id: the email job that mailed the token (one token per job). sealed: the token encrypted
-- under a key derived from APP_SECRET, kept only while the job may still send it, so that every
-- attempt mails the same bytes; erased once the provider accepted the mail, or after 24 hours.
ALTER TABLE email_tokens
    ADD COLUMN job_id bigint NOT NULL,
    ADD COLUMN sealed bytea;

CREATE UNIQUE INDEX email_tokens_job_id_idx ON email_tokens (job_id);
CREATE INDEX email_tokens_sealed_created_at_idx ON email_tokens (created_at) WHERE sealed IS NOT NULL;

-- One row per email job, from its first attempt: the idempotency key it sends under on every
-- attempt (<kind>:<user_id>:<random>), and when the provider accepted the mail, so that a later
-- attempt (a rescue after a crash) completes without sending again.
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
    updated_at timestamptz NOT NULL
);

CREATE INDEX email_messages_user_id_idx ON email_messages (user_id);
CREATE INDEX email_messages_created_at_idx ON email_messages (created_at);

-- +goose Down
DROP TABLE email_messages;
DROP INDEX email_tokens_sealed_created_at_idx;
DROP INDEX email_tokens_job_id_idx;
ALTER TABLE email_tokens
    DROP COLUMN sealed,
    DROP COLUMN job_id;
