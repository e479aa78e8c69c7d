-- The limiter's part: see the PostgreSQL migration of the same name. Times are INTEGER
-- microseconds since the Unix epoch: they compare and sort as numbers, with no text format to
-- agree on.

-- +goose Up
CREATE TABLE rate_limit_counters (
    key_hash BLOB NOT NULL,
    window_start INTEGER NOT NULL,
    window_end INTEGER NOT NULL,
    count INTEGER NOT NULL,
    limit_count INTEGER NOT NULL,
    PRIMARY KEY (key_hash, window_start)
) WITHOUT ROWID;

CREATE INDEX rate_limit_counters_window_end_idx ON rate_limit_counters (window_end);

-- +goose Down
DROP TABLE rate_limit_counters;
