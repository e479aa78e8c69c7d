-- +goose Up
-- Trusted-device tokens (the login pattern's device cookies) hold no state of their own: each
-- carries the time its account's devices were last revoked when it was issued. Revoking an
-- account's devices records a later time here, so every token issued before it stops counting as
-- a device at once, in every process. Rows are keyed by an HMAC of the action and key (never the
-- key itself); prune deletes one once every token it revoked has expired.
CREATE TABLE rate_limit_device_revocations (
    key_hash bytea PRIMARY KEY,
    revoked_at timestamptz NOT NULL
);

CREATE INDEX rate_limit_device_revocations_revoked_at_idx ON rate_limit_device_revocations (revoked_at);

-- +goose Down
DROP TABLE rate_limit_device_revocations;
