-- Times are INTEGER microseconds since the Unix epoch: they compare and sort as numbers, with no
-- text format to agree on (River keeps its own times as text in its own tables).

-- +goose Up
CREATE TABLE users (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    email TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL DEFAULT '',
    password_hash TEXT NOT NULL,
    email_verified_at INTEGER,
    unsubscribed_at INTEGER,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

CREATE TABLE email_tokens (
    token_hash BLOB PRIMARY KEY,
    user_id INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    purpose TEXT NOT NULL CHECK (purpose IN ('verify', 'reset')),
    expires_at INTEGER NOT NULL,
    used_at INTEGER,
    created_at INTEGER NOT NULL
);

CREATE INDEX email_tokens_user_id_purpose_idx ON email_tokens (user_id, purpose);
CREATE INDEX email_tokens_expires_at_idx ON email_tokens (expires_at);

CREATE TABLE rate_limit_counters (
    key_hash BLOB NOT NULL,
    window_start INTEGER NOT NULL,
    window_end INTEGER NOT NULL,
    count INTEGER NOT NULL,
    limit_count INTEGER NOT NULL,
    PRIMARY KEY (key_hash, window_start)
) WITHOUT ROWID;

CREATE INDEX rate_limit_counters_window_end_idx ON rate_limit_counters (window_end);

CREATE TABLE send_pacer (
    name TEXT PRIMARY KEY,
    tat_us INTEGER NOT NULL,
    interval_us INTEGER NOT NULL
);

-- Settings the embedded default keeps for itself, such as the APP_SECRET it generated.
CREATE TABLE app_settings (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- +goose Down
DROP TABLE app_settings;
DROP TABLE send_pacer;
DROP TABLE rate_limit_counters;
DROP TABLE email_tokens;
DROP TABLE users;
