-- +goose Up
CREATE TABLE users (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email text NOT NULL UNIQUE,
    name text NOT NULL DEFAULT '',
    password_hash text NOT NULL,
    email_verified_at timestamptz,
    unsubscribed_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE email_tokens (
    token_hash bytea PRIMARY KEY,
    user_id bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    purpose text NOT NULL CHECK (purpose IN ('verify', 'reset')),
    expires_at timestamptz NOT NULL,
    used_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX email_tokens_user_id_purpose_idx ON email_tokens (user_id, purpose);
CREATE INDEX email_tokens_expires_at_idx ON email_tokens (expires_at);

-- Counters are updated in place many times per window; a lower fillfactor leaves room on each
-- page for HOT updates, so a hot key does not bloat the index.
CREATE TABLE rate_limit_counters (
    key_hash bytea NOT NULL,
    window_start timestamptz NOT NULL,
    window_end timestamptz NOT NULL,
    count bigint NOT NULL,
    limit_count bigint NOT NULL,
    PRIMARY KEY (key_hash, window_start)
) WITH (fillfactor = 70);

CREATE INDEX rate_limit_counters_window_end_idx ON rate_limit_counters (window_end);

-- One row per shared send budget: the GCRA "theoretical arrival time" of the next send, in
-- microseconds since the Unix epoch, shared by every worker process.
CREATE TABLE send_pacer (
    name text PRIMARY KEY,
    tat_us bigint NOT NULL,
    interval_us bigint NOT NULL
);

-- +goose Down
DROP TABLE send_pacer;
DROP TABLE rate_limit_counters;
DROP TABLE email_tokens;
DROP TABLE users;
