-- The service part: postguard's own server's tables, which a host app never needs. A database
-- postguard migrated before revision 3 has them already (revision2/); MigrateTables records this
-- migration as applied there instead of running it.

-- +goose Up
-- postguard's users. locale: the user's language as a BCP 47 tag (register's locale, or the first
-- language of its Accept-Language), '' when unknown. Mail goes out in the best match among the
-- locales that have templates.
CREATE TABLE users (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email text NOT NULL UNIQUE,
    name text NOT NULL DEFAULT '',
    password_hash text NOT NULL,
    email_verified_at timestamptz,
    unsubscribed_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    locale text NOT NULL DEFAULT ''
);

-- One row that /readyz writes: a database that can be read but not written (a read-only server
-- after a failover, default_transaction_read_only) is not ready.
CREATE TABLE readiness_heartbeat (
    id smallint PRIMARY KEY CHECK (id = 1),
    beat_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE readiness_heartbeat;
DROP TABLE users;
