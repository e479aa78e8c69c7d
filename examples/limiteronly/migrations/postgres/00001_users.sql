-- The app's own users, in the app's own goose history (goose_db_version). postguard never reads
-- this table: the limiter counts by the key the app names.

-- +goose Up
CREATE TABLE users (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email text NOT NULL UNIQUE,
    password_hash bytea NOT NULL,
    created_at bigint NOT NULL
);

-- +goose Down
DROP TABLE users;
