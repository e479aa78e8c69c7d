-- The service part: see the PostgreSQL migration of the same name.

-- +goose Up
CREATE TABLE users (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    email TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL DEFAULT '',
    password_hash TEXT NOT NULL,
    email_verified_at INTEGER,
    unsubscribed_at INTEGER,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    locale TEXT NOT NULL DEFAULT ''
);

-- One row that /readyz writes: a database that cannot take a write (busy, full, failing its
-- I/O) is not ready. room is written in a transaction that is rolled back, to check that the
-- database can still grow by a page; it is always NULL.
CREATE TABLE readiness_heartbeat (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    beat_at INTEGER NOT NULL,
    room BLOB
);

-- +goose Down
DROP TABLE readiness_heartbeat;
DROP TABLE users;
