-- name: ReadinessHeartbeatUpsert :exec
-- ReadinessHeartbeatUpsert writes the heartbeat row: the write /readyz needs to succeed.
INSERT INTO readiness_heartbeat (
    id,
    beat_at
) VALUES (
    1,
    clock_timestamp()
)
ON CONFLICT (id) DO UPDATE
SET beat_at = excluded.beat_at;
