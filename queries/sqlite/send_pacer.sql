-- name: SendPacerReserve :one
-- SendPacerReserve takes the next send slot of a shared budget, GCRA-style; see the PostgreSQL
-- query of the same name. Parameters reach DO UPDATE through excluded.*.
INSERT INTO send_pacer (
    name,
    tat_us,
    interval_us
) VALUES (
    @name,
    @tat_us,
    @interval_us
)
ON CONFLICT (name) DO UPDATE
SET tat_us = max(send_pacer.tat_us, excluded.tat_us - excluded.interval_us) + excluded.interval_us,
    interval_us = excluded.interval_us
RETURNING tat_us;
