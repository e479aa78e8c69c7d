-- Mail in the user's language, and the means to tell whether a retry would send other bytes.
-- See the PostgreSQL migration of the same name for the why of each column.

-- +goose Up
ALTER TABLE users ADD COLUMN locale TEXT NOT NULL DEFAULT '';
ALTER TABLE email_messages ADD COLUMN locale TEXT NOT NULL DEFAULT '';
ALTER TABLE email_messages ADD COLUMN payload_sha256 BLOB;

-- +goose Down
ALTER TABLE email_messages DROP COLUMN payload_sha256;
ALTER TABLE email_messages DROP COLUMN locale;
ALTER TABLE users DROP COLUMN locale;
