-- Mail that more than one provider may send (Resend, SMTP), so that a mail one provider took is
-- never sent again by another.

-- +goose Up
-- provider: the provider that accepted the mail (resend, smtp, log...), written with accepted_at;
-- NULL until then, and for mail accepted before this migration (Resend's, or the log mailer's).
-- provider_in_doubt: the provider an attempt handed the mail to without hearing its answer (the
-- answer was lost, or the worker died meanwhile), written before each send: while it is set, the
-- job's later attempts go to that provider only, never to another, which might deliver the mail
-- a second time. Cleared when that provider accepts the mail, answers that it did not take it,
-- or when the job starts over under a new idempotency key.
ALTER TABLE email_messages
    ADD COLUMN provider text,
    ADD COLUMN provider_in_doubt text;

-- +goose Down
ALTER TABLE email_messages
    DROP COLUMN provider_in_doubt,
    DROP COLUMN provider;
