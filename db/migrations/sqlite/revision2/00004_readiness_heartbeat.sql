-- +goose Up
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
