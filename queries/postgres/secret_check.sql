-- name: SecretCheckInsert :exec
-- SecretCheckInsert records the check value of the database's secret, unless one is recorded.
INSERT INTO secret_check (
    id,
    check_value,
    recorded_at
) VALUES (
    1,
    @check_value::bytea,
    @now::timestamptz
)
ON CONFLICT (id) DO NOTHING;

-- name: SecretCheckGet :one
-- SecretCheckGet reads the recorded check value of the database's secret.
SELECT check_value
FROM secret_check
WHERE id = 1;

-- name: SecretCheckReplace :exec
-- SecretCheckReplace records the check value of a new secret, in place of any other.
INSERT INTO secret_check (
    id,
    check_value,
    recorded_at
) VALUES (
    1,
    @check_value::bytea,
    @now::timestamptz
)
ON CONFLICT (id) DO UPDATE
SET check_value = excluded.check_value,
    recorded_at = excluded.recorded_at;
