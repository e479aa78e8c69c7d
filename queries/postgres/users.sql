-- name: UserInsert :one
-- UserInsert creates a user. No row comes back when the email is taken, so the caller's
-- transaction stays usable.
INSERT INTO users (
    email,
    name,
    password_hash,
    locale,
    created_at,
    updated_at
) VALUES (
    @email::text,
    @name::text,
    @password_hash::text,
    @locale::text,
    @now::timestamptz,
    @now::timestamptz
)
ON CONFLICT (email) DO NOTHING
RETURNING *;

-- name: UserGetByEmail :one
-- UserGetByEmail finds a user by normalised email.
SELECT *
FROM users
WHERE email = @email::text;

-- name: UserGetByID :one
-- UserGetByID finds a user by id.
SELECT *
FROM users
WHERE id = @id::bigint;

-- name: UserMarkEmailVerified :one
-- UserMarkEmailVerified records the first verification of a user's email (later calls keep it),
-- and returns the user's locale, the language of the page that says so.
UPDATE users
SET email_verified_at = coalesce(email_verified_at, @now::timestamptz),
    updated_at = @now::timestamptz
WHERE id = @id::bigint
RETURNING locale;

-- name: UserSetPassword :execrows
-- UserSetPassword replaces a user's password hash. A completed reset proves the user reads the
-- mailbox, so it marks the email verified too.
UPDATE users
SET password_hash = @password_hash::text,
    email_verified_at = coalesce(email_verified_at, @now::timestamptz),
    updated_at = @now::timestamptz
WHERE id = @id::bigint;

-- name: UserUnsubscribe :one
-- UserUnsubscribe records a user's unsubscribe from non-essential mail (repeating it is
-- harmless), and returns the user's locale, the language of the page that says so.
UPDATE users
SET unsubscribed_at = coalesce(unsubscribed_at, @now::timestamptz),
    updated_at = @now::timestamptz
WHERE id = @id::bigint
RETURNING locale;
