-- +goose Up
-- The database remembers which secret it was made with: one row holding a check value, an HMAC
-- of a fixed label under a key derived from the secret (never the secret, which lives in
-- PATH.secret beside the database), recorded by the first `serve` (or `migrate`). A process whose
-- secret's check value differs, or whose secret file is missing, refuses to start: another secret
-- would silently break unsubscribe links, the suppression list, the rate-limit counters and
-- sealed tokens. `postguard secret reset` records a new one.
CREATE TABLE secret_check (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    check_value BLOB NOT NULL,
    recorded_at INTEGER NOT NULL
);

-- +goose Down
DROP TABLE secret_check;
