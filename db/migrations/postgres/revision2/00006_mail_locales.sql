-- Mail in the user's language, and the means to tell whether a retry would send other bytes.

-- +goose Up
-- locale: the user's language as a BCP 47 tag (register's locale, or the first language of its
-- Accept-Language), '' when unknown. Mail goes out in the best match among the locales that have
-- templates.
ALTER TABLE users
    ADD COLUMN locale text NOT NULL DEFAULT '';

-- locale: the locale the job's mail is rendered in, chosen at its first attempt and kept for every
-- later one. payload_sha256: the SHA-256 of what the job's attempts send under its idempotency key
-- (recipient, subject, bodies, headers), never the bytes themselves (they hold the link's token);
-- an attempt that renders other bytes (a deploy changed the templates) sends under a new key.
-- NULL for a message of before this migration.
ALTER TABLE email_messages
    ADD COLUMN locale text NOT NULL DEFAULT '',
    ADD COLUMN payload_sha256 bytea;

-- +goose Down
ALTER TABLE email_messages
    DROP COLUMN payload_sha256,
    DROP COLUMN locale;
ALTER TABLE users
    DROP COLUMN locale;
