-- The generated APP_SECRET lives in PATH.secret beside the database, never inside it, so that a
-- copy of the database file alone opens nothing. The store moves a secret the first version kept
-- here to that file before this migration runs (db/sqlite: Store.Migrate), and erases it.

-- +goose Up
DROP TABLE app_settings;

-- +goose Down
CREATE TABLE app_settings (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
