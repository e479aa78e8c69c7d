-- name: MigrationLock :exec
-- MigrationLock waits for the session-level advisory lock that serialises `postguard migrate`
-- runs against one schema: two deploys never apply the same migration at once. The key is derived
-- from the current schema, so stores in other schemas (tests, other apps) do not wait on it.
SELECT pg_advisory_lock(hashtextextended('postguard.migrate.' || coalesce(current_schema(), ''), 0));

-- name: MigrationUnlock :exec
-- MigrationUnlock releases the lock MigrationLock took (closing the session releases it too).
SELECT pg_advisory_unlock(hashtextextended('postguard.migrate.' || coalesce(current_schema(), ''), 0));
