-- +goose Up
-- The database remembers which secret it was made with: one row holding a check value, an HMAC
-- of a fixed label under a key derived from APP_SECRET (never the secret), recorded by the first
-- process that has the secret (postguard migrate, serve, api or worker). A process whose secret's
-- check value differs refuses to start: another secret would silently break unsubscribe links,
-- the suppression list, the rate-limit counters and sealed tokens. `postguard secret reset`
-- records a new one.
CREATE TABLE secret_check (
    id smallint PRIMARY KEY CHECK (id = 1),
    check_value bytea NOT NULL,
    recorded_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE secret_check;
