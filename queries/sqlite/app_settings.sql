-- name: AppSettingInsert :exec
-- AppSettingInsert stores a setting unless it is already set: the first writer wins.
INSERT INTO app_settings (
    name,
    value
) VALUES (
    @name,
    @value
)
ON CONFLICT (name) DO NOTHING;

-- name: AppSettingGet :one
-- AppSettingGet reads a setting.
SELECT value
FROM app_settings
WHERE name = @name;
