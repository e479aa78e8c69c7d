-- Revocations of trusted-device tokens; see the PostgreSQL migration of the same name. Times are
-- unix microseconds.

-- +goose Up
CREATE TABLE rate_limit_device_revocations (
    key_hash BLOB PRIMARY KEY,
    revoked_at INTEGER NOT NULL
) WITHOUT ROWID;

CREATE INDEX rate_limit_device_revocations_revoked_at_idx ON rate_limit_device_revocations (revoked_at);

-- +goose Down
DROP TABLE rate_limit_device_revocations;
