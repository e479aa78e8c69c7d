-- The app's own users, in the app's own goose history (goose_db_version). postguard never reads
-- this table: the limiter counts by the key the app names.

-- +goose Up
CREATE TABLE users (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    email TEXT NOT NULL UNIQUE,
    password_hash BLOB NOT NULL,
    created_at INTEGER NOT NULL
);

-- +goose Down
DROP TABLE users;
