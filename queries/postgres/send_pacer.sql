-- name: SendPacerReserve :one
-- SendPacerReserve takes the next send slot of a shared budget, GCRA-style: the slot is the later
-- of now and the previous slot plus one interval. @tat_us is now plus one interval. It returns the
-- theoretical arrival time after this send; the caller's slot is that minus the interval.
INSERT INTO send_pacer (
    name,
    tat_us,
    interval_us
) VALUES (
    @name::text,
    @tat_us::bigint,
    @interval_us::bigint
)
ON CONFLICT (name) DO UPDATE
SET tat_us = greatest(send_pacer.tat_us, excluded.tat_us - excluded.interval_us) + excluded.interval_us,
    interval_us = excluded.interval_us
RETURNING tat_us;
