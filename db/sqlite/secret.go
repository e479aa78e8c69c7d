package sqlite

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/postguard/postguard/db/sqlite/dbsqlc"
)

// secretLen is the size in bytes of a generated APP_SECRET.
const secretLen = 32

// fileMode is the mode of every file of the embedded database: the database, its WAL and
// shared-memory files, and the secret beside them. Nobody but the service's user may read them.
const fileMode fs.FileMode = 0o600

// The first version kept the generated secret in the database itself (app_settings); NewEngine
// moves it out before migration 00003 drops that table. sqlc's catalog no longer
// knows the table, hence these hand-written statements.
//
//nolint:gosec // G101: SQL that names the table of the legacy secret, not a credential
const (
	legacySecretTableSQL  = `SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'app_settings')`
	legacySecretGetSQL    = `SELECT value FROM app_settings WHERE name = 'app_secret'`
	legacySecretDeleteSQL = `DELETE FROM app_settings WHERE name = 'app_secret'`
)

// recordsSecretSQL says whether the database records the check value of a secret (migration
// 00008's secret_check), without failing on a database migrated before that table existed.
//
//nolint:gosec // G101: SQL that names the table of the secret's check value, not a credential
const recordsSecretSQL = `SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'secret_check')`

// ErrSecretFileMissing is returned (wrapped, naming the file) by AppSecret when the secret file
// is missing beside a database that records the check value of the secret it was made with:
// the file was lost (or left out of a restore), and a new secret would silently break what the
// old one made.
var ErrSecretFileMissing = errors.New("the secret file is missing")

// SecretPath is where the embedded default keeps its generated APP_SECRET: PATH.secret beside the
// database at PATH, never inside it, so that a copy of the database file alone opens nothing.
func SecretPath(dbPath string) string { return dbPath + ".secret" }

// AppSecret returns the APP_SECRET of the embedded default, kept in SecretPath (mode 0600) beside
// the database: read when the file exists (NewEngine moved a first-version database's secret
// there), else generated (32 random bytes, CreateAppSecret) for a database that records no
// secret yet. A missing file beside a database that records one is ErrSecretFileMissing: it is
// not replaced. A secret file that others may read is refused, naming the file.
func (e *Engine) AppSecret(ctx context.Context) ([]byte, error) {
	if e.secretPath == "" {
		return nil, errors.New("an engine on a *sql.DB of the caller's keeps no generated secret: give APP_SECRET")
	}
	secret, err := readSecret(e.secretPath)
	if !errors.Is(err, fs.ErrNotExist) {
		return secret, err
	}
	switch records, err := e.recordsSecret(ctx); {
	case err != nil:
		return nil, err
	case records:
		return nil, fmt.Errorf("%w: %s", ErrSecretFileMissing, e.secretPath)
	}
	return e.CreateAppSecret()
}

// recordsSecret says whether the database records the check value of a secret.
func (e *Engine) recordsSecret(ctx context.Context) (bool, error) {
	var exists bool
	if err := e.db.QueryRowContext(ctx, recordsSecretSQL).Scan(&exists); err != nil {
		return false, fmt.Errorf("error looking for the secret's check value: %w", interpretError(err))
	}
	if !exists {
		return false, nil
	}
	_, err := dbsqlc.New().SecretCheckGet(ctx, e.db)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("error reading the secret's check value: %w", interpretError(err))
	}
	return true, nil
}

// CreateAppSecret generates the embedded default's secret (32 random bytes) into SecretPath
// when the file does not exist, and returns the file's secret: the new one, or the one another
// opener created first. `postguard secret reset` calls it for a database whose file was lost;
// AppSecret, for a new database.
func (e *Engine) CreateAppSecret() ([]byte, error) {
	if e.secretPath == "" {
		return nil, errors.New("an engine on a *sql.DB of the caller's keeps no generated secret: give APP_SECRET")
	}
	secret := make([]byte, secretLen)
	_, _ = rand.Read(secret) // never fails, per crypto/rand
	if err := writeSecret(e.secretPath, secret); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	// Read back: another opener may have created the file first.
	return readSecret(e.secretPath)
}

// moveLegacySecret moves a secret that the first version kept in app_settings to SecretPath, then
// deletes it from the database so that its bytes are gone from the file: secure_delete zeroes the
// row, and a truncating checkpoint empties the WAL that held the zeroed page. A secret file that
// exists already wins (a mismatch is logged). It does nothing on a database without app_settings.
func (e *Engine) moveLegacySecret(ctx context.Context) error {
	var exists bool
	if err := e.db.QueryRowContext(ctx, legacySecretTableSQL).Scan(&exists); err != nil {
		return fmt.Errorf("error looking for a legacy app secret: %w", interpretError(err))
	}
	if !exists {
		return nil
	}
	var value string
	err := e.db.QueryRowContext(ctx, legacySecretGetSQL).Scan(&value)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("error reading the legacy app secret: %w", interpretError(err))
	}

	legacy, err := hex.DecodeString(value)
	if err != nil || len(legacy) < secretLen {
		return fmt.Errorf("the app secret kept in the database (app_settings) is not %d hex-encoded bytes", secretLen)
	}
	switch existing, err := readSecret(e.secretPath); {
	case errors.Is(err, fs.ErrNotExist):
		if err := writeSecret(e.secretPath, legacy); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	case err != nil:
		return err
	case !bytes.Equal(existing, legacy):
		e.logger.WarnContext(ctx, "the database held another app secret than its secret file; keeping the file's",
			slog.String("file", e.secretPath))
	}

	if _, err := e.db.ExecContext(ctx, legacySecretDeleteSQL); err != nil {
		return fmt.Errorf("error deleting the legacy app secret from the database: %w", interpretError(err))
	}
	if _, err := e.db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		return fmt.Errorf("error checkpointing after deleting the legacy app secret: %w", interpretError(err))
	}
	e.logger.InfoContext(ctx, "moved the generated app secret out of the database", slog.String("file", e.secretPath))
	return nil
}

// readSecret reads a secret file: hex, one line.
func readSecret(path string) ([]byte, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("error reading the app secret file: %w", err)
	}
	if perm := info.Mode().Perm(); perm&^fileMode != 0 {
		return nil, fmt.Errorf("the app secret file %s has mode %#o, open to other users: run `chmod 600 %s`", path, perm, path)
	}
	data, err := os.ReadFile(path) //nolint:gosec // G304: the path is the operator's DATABASE_URL
	if err != nil {
		return nil, fmt.Errorf("error reading the app secret file: %w", err)
	}
	secret, err := hex.DecodeString(string(bytes.TrimSpace(data)))
	if err != nil || len(secret) < secretLen {
		return nil, fmt.Errorf("the app secret file %s does not hold %d hex-encoded bytes", path, secretLen)
	}
	return secret, nil
}

// writeSecret creates the secret file with mode 0600, whole or not at all: it writes a temporary
// file, syncs it, and links it into place, which fails with fs.ErrExist when the file exists.
func writeSecret(path string, secret []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*") // mode 0600
	if err != nil {
		return fmt.Errorf("error creating the app secret file: %w", err)
	}
	defer os.Remove(tmp.Name())

	_, err = tmp.WriteString(hex.EncodeToString(secret) + "\n")
	if err == nil {
		err = tmp.Sync()
	}
	if closeErr := tmp.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return fmt.Errorf("error writing the app secret file: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		return fmt.Errorf("error creating the app secret file: %w", err)
	}
	if d, err := os.Open(dir); err == nil { //nolint:gosec // G304: the database's own directory
		_ = d.Sync() // the new name survives a power loss
		_ = d.Close()
	}
	return nil
}

// restrictFiles creates the database file with mode 0600 when it does not exist (SQLite then
// gives its WAL and shared-memory files the same mode), and takes away what others may do with
// the files of a database created before, more open.
func restrictFiles(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, fileMode) //nolint:gosec // G304: the operator's DATABASE_URL
	if err != nil {
		return fmt.Errorf("error opening SQLite database %q: %w", path, err)
	}
	_ = f.Close()
	for _, name := range []string{path, path + "-wal", path + "-shm"} {
		info, err := os.Stat(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("error checking the mode of %s: %w", name, err)
		}
		if info.Mode().Perm()&^fileMode != 0 {
			if err := os.Chmod(name, fileMode); err != nil {
				return fmt.Errorf("error restricting the mode of %s to 0600: %w", name, err)
			}
		}
	}
	return nil
}
