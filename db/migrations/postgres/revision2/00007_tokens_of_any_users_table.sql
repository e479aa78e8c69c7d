-- +goose Up
-- A link token names the user its mail went to, and that user may live in a host app's own table
-- (the Go library's mail workers read recipients through an interface the host implements), not
-- in postguard's users table: the foreign key goes. The workers only ever make a token for a user
-- they have just read; postguard deletes no users, and prune deletes tokens once expired.
ALTER TABLE email_tokens DROP CONSTRAINT email_tokens_user_id_fkey;

-- +goose Down
ALTER TABLE email_tokens
    ADD CONSTRAINT email_tokens_user_id_fkey FOREIGN KEY (user_id) REFERENCES users (id) ON DELETE CASCADE;
