-- name: UserInsert :one
-- UserInsert creates a user. No row comes back when the email is taken.
INSERT INTO users (
    email,
    name,
    password_hash,
    locale,
    created_at,
    updated_at
) VALUES (
    @email,
    @name,
    @password_hash,
    @locale,
    @now,
    @now
)
ON CONFLICT (email) DO NOTHING
RETURNING *;

-- name: UserGetByEmail :one
-- UserGetByEmail finds a user by normalised email.
SELECT *
FROM users
WHERE email = @email;

-- name: UserGetByID :one
-- UserGetByID finds a user by id.
SELECT *
FROM users
WHERE id = @id;

-- name: UserMarkEmailVerified :one
-- UserMarkEmailVerified records the first verification of a user's email (later calls keep it),
-- and returns the user's locale, the language of the page that says so.
UPDATE users
SET email_verified_at = coalesce(email_verified_at, @now),
    updated_at = @now
WHERE id = @id
RETURNING locale;

-- name: UserSetPassword :execrows
-- UserSetPassword replaces a user's password hash and marks the email verified.
UPDATE users
SET password_hash = @password_hash,
    email_verified_at = coalesce(email_verified_at, @now),
    updated_at = @now
WHERE id = @id;

-- name: UserUnsubscribe :one
-- UserUnsubscribe records a user's unsubscribe from non-essential mail (repeating it is
-- harmless), and returns the user's locale, the language of the page that says so.
UPDATE users
SET unsubscribed_at = coalesce(unsubscribed_at, @now),
    updated_at = @now
WHERE id = @id
RETURNING locale;

-- name: UserListByEmails :many
-- UserListByEmails finds the users of several normalised emails (a batch of checks' lookups), in
-- no particular order; an email without a user has no row.
SELECT *
FROM users
WHERE email IN (sqlc.slice(emails));
