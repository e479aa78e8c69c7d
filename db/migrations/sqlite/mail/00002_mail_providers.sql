-- Mail that more than one provider may send: see the PostgreSQL migration of the same name for
-- the why of each column.

-- +goose Up
ALTER TABLE email_messages ADD COLUMN provider TEXT;
ALTER TABLE email_messages ADD COLUMN provider_in_doubt TEXT;

-- +goose Down
ALTER TABLE email_messages DROP COLUMN provider_in_doubt;
ALTER TABLE email_messages DROP COLUMN provider;
