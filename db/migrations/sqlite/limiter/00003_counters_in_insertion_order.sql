-- The counters become a rowid table, so that a fresh key's counter is appended where the last one
-- went. In the WITHOUT ROWID table of 00001 the rows and every index entry are ordered by the
-- HMAC key, at random: each new counter dirtied two random pages, the table's and its window_end
-- index's (whose entries end in the primary key, so they too were random within a window), and
-- in WAL mode every dirtied page is written whole at commit. Now only the primary key's index
-- takes a random page; the rows, and the window_end index (window_end then rowid), grow at their
-- ends. The primary key and the statements are unchanged.

-- +goose Up
CREATE TABLE rate_limit_counters_by_rowid (
    key_hash BLOB NOT NULL,
    window_start INTEGER NOT NULL,
    window_end INTEGER NOT NULL,
    count INTEGER NOT NULL,
    limit_count INTEGER NOT NULL,
    PRIMARY KEY (key_hash, window_start)
);

INSERT INTO rate_limit_counters_by_rowid (key_hash, window_start, window_end, count, limit_count)
SELECT key_hash, window_start, window_end, count, limit_count
FROM rate_limit_counters
ORDER BY window_end;

DROP TABLE rate_limit_counters;

ALTER TABLE rate_limit_counters_by_rowid RENAME TO rate_limit_counters;

CREATE INDEX rate_limit_counters_window_end_idx ON rate_limit_counters (window_end);

-- +goose Down
CREATE TABLE rate_limit_counters_without_rowid (
    key_hash BLOB NOT NULL,
    window_start INTEGER NOT NULL,
    window_end INTEGER NOT NULL,
    count INTEGER NOT NULL,
    limit_count INTEGER NOT NULL,
    PRIMARY KEY (key_hash, window_start)
) WITHOUT ROWID;

INSERT INTO rate_limit_counters_without_rowid (key_hash, window_start, window_end, count, limit_count)
SELECT key_hash, window_start, window_end, count, limit_count
FROM rate_limit_counters;

DROP TABLE rate_limit_counters;

ALTER TABLE rate_limit_counters_without_rowid RENAME TO rate_limit_counters;

CREATE INDEX rate_limit_counters_window_end_idx ON rate_limit_counters (window_end);
