-- The trace a mail belongs to, so that the webhook event that reports its fate links to it.

-- +goose Up
-- trace_parent: the W3C traceparent of the insert of the mail's job (the request that caused
-- it), as the job's metadata carried it to its first attempt when tracing is on; NULL when it
-- was off, and for mail of before this migration. A trace id and a span id, nothing of the user.
ALTER TABLE email_messages
    ADD COLUMN trace_parent text;

-- +goose Down
ALTER TABLE email_messages
    DROP COLUMN trace_parent;
