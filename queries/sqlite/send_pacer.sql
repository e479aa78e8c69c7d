-- name: SendPacerReserve :one
-- SendPacerReserve takes the next send slot of a shared budget, GCRA-style, on the database's
-- clock; see the PostgreSQL query of the same name. Parameters reach DO UPDATE through
-- excluded.*. SQLite's 'now' is one instant for the whole statement, so the now returned is the
-- one the slot was computed from (sqlc's SQLite engine drops the alias: it reads as Column2).
INSERT INTO send_pacer (
    name,
    tat_us,
    interval_us
) VALUES (
    @name,
    CAST(unixepoch('now', 'subsec') * 1000000 AS INTEGER) + @interval_us,
    @interval_us
)
ON CONFLICT (name) DO UPDATE
SET tat_us = max(send_pacer.tat_us, excluded.tat_us - excluded.interval_us) + excluded.interval_us,
    interval_us = excluded.interval_us
RETURNING
    tat_us,
    CAST(unixepoch('now', 'subsec') * 1000000 AS INTEGER) AS now_us;

-- name: SendPacerNow :one
-- SendPacerNow is the database's clock, the one the send pacer's schedule runs on, in
-- microseconds since the Unix epoch.
SELECT CAST(unixepoch('now', 'subsec') * 1000000 AS INTEGER) AS now_us;
