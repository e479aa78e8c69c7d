-- The counters become one WITHOUT ROWID table whose primary key starts with window_end. In the
-- rowid table of 00003 every counter was three B-tree entries (its row, its primary key's entry,
-- its window_end index's), each inserted by its own B-tree search, and prune walked the
-- window_end index and then deleted each row's primary key entry from a random page. Now a
-- counter is one entry: a check finds it by the whole key (its window's end, its HMAC key, its
-- window's start), which every caller knows, a fresh key's insert is one B-tree search, and the
-- expired counters are the front of the table, which prune deletes in order, page after page.
-- A fresh key still lands on a random page among its window's counters: its HMAC key is random.
-- The primary key holds 00003's (key_hash, window_start), so no two counters of 00003 collide.

-- +goose Up
CREATE TABLE rate_limit_counters_by_window (
    key_hash BLOB NOT NULL,
    window_start INTEGER NOT NULL,
    window_end INTEGER NOT NULL,
    count INTEGER NOT NULL,
    limit_count INTEGER NOT NULL,
    PRIMARY KEY (window_end, key_hash, window_start)
) WITHOUT ROWID;

INSERT INTO rate_limit_counters_by_window (key_hash, window_start, window_end, count, limit_count)
SELECT key_hash, window_start, window_end, count, limit_count
FROM rate_limit_counters
ORDER BY window_end, key_hash, window_start;

DROP TABLE rate_limit_counters;

ALTER TABLE rate_limit_counters_by_window RENAME TO rate_limit_counters;

-- +goose Down
-- 00003's table. Two counters of one key and window start with different ends (a rule whose
-- window changed) are one in it: the later window's is kept.
CREATE TABLE rate_limit_counters_by_rowid (
    key_hash BLOB NOT NULL,
    window_start INTEGER NOT NULL,
    window_end INTEGER NOT NULL,
    count INTEGER NOT NULL,
    limit_count INTEGER NOT NULL,
    PRIMARY KEY (key_hash, window_start)
);

INSERT OR REPLACE INTO rate_limit_counters_by_rowid (key_hash, window_start, window_end, count, limit_count)
SELECT key_hash, window_start, window_end, count, limit_count
FROM rate_limit_counters
ORDER BY window_end;

DROP TABLE rate_limit_counters;

ALTER TABLE rate_limit_counters_by_rowid RENAME TO rate_limit_counters;

CREATE INDEX rate_limit_counters_window_end_idx ON rate_limit_counters (window_end);
