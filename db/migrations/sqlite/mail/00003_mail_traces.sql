-- The trace a mail belongs to: see the PostgreSQL migration of the same name for the why.

-- +goose Up
ALTER TABLE email_messages ADD COLUMN trace_parent TEXT;

-- +goose Down
ALTER TABLE email_messages DROP COLUMN trace_parent;
