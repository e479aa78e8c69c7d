-- name: ReadinessHeartbeatUpsert :exec
-- ReadinessHeartbeatUpsert writes the heartbeat row: the write /readyz needs to succeed.
INSERT INTO readiness_heartbeat (
    id,
    beat_at
) VALUES (
    1,
    @beat_at
)
ON CONFLICT (id) DO UPDATE
SET beat_at = excluded.beat_at;

-- name: ReadinessHeartbeatFillRoom :exec
-- ReadinessHeartbeatFillRoom makes the heartbeat row @room_bytes larger, so that the database
-- must find at least one free page; run it in a transaction that is rolled back.
UPDATE readiness_heartbeat
SET room = zeroblob(@room_bytes)
WHERE id = 1;
