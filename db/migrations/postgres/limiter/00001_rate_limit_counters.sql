-- The limiter's part: the fixed-window counters, keyed by an HMAC of action, scope and value, so
-- no IP, address or key is stored. A database postguard migrated before revision 3 has this
-- table already (revision2/); MigrateTables records this migration as applied there instead of
-- running it.

-- +goose Up
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

-- +goose Down
DROP TABLE rate_limit_counters;
