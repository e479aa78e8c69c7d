-- name: SendPacerReserve :one
-- SendPacerReserve takes the next send slot of a shared budget, GCRA-style, on the database's
-- clock: the slot is the later of now and the previous slot plus one interval. It returns the
-- theoretical arrival time after this send (the caller's slot is that minus the interval) and
-- the now it used, both in microseconds since the Unix epoch.
WITH clock AS (
    SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us
)
INSERT INTO send_pacer (
    name,
    tat_us,
    interval_us
)
SELECT
    @name::text,
    clock.now_us + @interval_us::bigint,
    @interval_us::bigint
FROM clock
ON CONFLICT (name) DO UPDATE
SET tat_us = greatest(send_pacer.tat_us, excluded.tat_us - excluded.interval_us) + excluded.interval_us,
    interval_us = excluded.interval_us
RETURNING
    tat_us,
    (SELECT now_us FROM clock)::bigint AS now_us;

-- name: SendPacerNow :one
-- SendPacerNow is the database's clock, the one the send pacer's schedule runs on, in
-- microseconds since the Unix epoch.
SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us;
