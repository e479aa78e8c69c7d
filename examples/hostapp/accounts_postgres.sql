-- The host app's own users: postguard never reads this table itself; the app's Recipients do.
CREATE TABLE IF NOT EXISTS accounts (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email text NOT NULL UNIQUE,
    display_name text NOT NULL DEFAULT '',
    locale text NOT NULL DEFAULT '',
    password_hash bytea NOT NULL,
    welcome_opt_out boolean NOT NULL DEFAULT false
);
