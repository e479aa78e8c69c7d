-- +goose Up
-- One row that /readyz writes: a database that can be read but not written (a read-only server
-- after a failover, default_transaction_read_only) is not ready.
CREATE TABLE readiness_heartbeat (
    id smallint PRIMARY KEY CHECK (id = 1),
    beat_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE readiness_heartbeat;
