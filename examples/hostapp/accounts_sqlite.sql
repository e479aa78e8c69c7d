-- The host app's own users: postguard never reads this table itself; the app's Recipients do.
CREATE TABLE IF NOT EXISTS accounts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    email TEXT NOT NULL UNIQUE,
    display_name TEXT NOT NULL DEFAULT '',
    locale TEXT NOT NULL DEFAULT '',
    password_hash BLOB NOT NULL,
    welcome_opt_out BOOLEAN NOT NULL DEFAULT false
);
