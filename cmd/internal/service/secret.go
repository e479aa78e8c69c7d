package service

import (
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/sqlite"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/tokens"
)

// SecretChangeBreaks says what a process with another secret than its database's breaks, for the
// messages that refuse one and for `postguard secret reset`, which records one anyway.
const SecretChangeBreaks = `unsubscribe links already mailed stop working (they answer 400); the suppression list matches no address any more, so mail goes again to addresses that bounced or complained; rate-limit counters start afresh (and, while processes with both secrets run, each secret gets its own full budget); links in mail not yet sent are made anew, since their sealed copies do not open; and trusted-device tokens stop working, so their owners meet the account's shared limit`

// ErrSecretMismatch is returned (wrapped, with what to do) when a process's secret is not the one
// its database was made with, or the embedded default's secret file is missing beside a database
// that was made with one.
var ErrSecretMismatch = errors.New("the secret is not the one this database was made with")

// SecretSource names where config's secret comes from, for the messages that say what to
// restore: APP_SECRET, or on the embedded default without it, the secret file beside the
// database.
func SecretSource(config *Config) string {
	if config.AppSecret != nil || config.Engine != EngineSQLite {
		return "APP_SECRET"
	}
	return "the secret file " + sqlite.SecretPath(config.SQLitePath)
}

// CheckSecret checks secret against the check value the database recorded
// (tokens.SecretCheck: an HMAC of a fixed label under a key derived from the secret, never the
// secret), and records it when there is none: a new database, or one migrated before the check
// existed. A process whose secret differs refuses to start (ErrSecretMismatch, naming source and
// what another secret would break) rather than silently breaking what the first one made.
func CheckSecret(ctx context.Context, store riverstore.Store, secret []byte, source string) error {
	check := tokens.SecretCheck(secret)
	recorded, err := store.SecretCheckRecord(ctx, &db.SecretCheckParams{CheckValue: check, Now: time.Now()})
	if err != nil {
		return fmt.Errorf("error checking the secret against the database's: %w", err)
	}
	if !hmac.Equal(recorded, check) {
		return fmt.Errorf("%w: %s is not the secret this database was made with (their check values differ).\n"+
			"With another secret, %s.\n"+
			"Start it with the database's own secret (%s). To make this one the database's instead, run `postguard secret reset --yes` with it",
			ErrSecretMismatch, source, SecretChangeBreaks, restoreHint(source))
	}
	return nil
}

// restoreHint says where the database's own secret is to be found.
func restoreHint(source string) string {
	if source == "APP_SECRET" {
		return "the APP_SECRET its other processes have, or had until now"
	}
	return "restore the secret file from where the database came from: a backup must hold both"
}

// secretFileMissing is the error of an embedded default whose secret file was lost.
func secretFileMissing(config *Config) error {
	path := sqlite.SecretPath(config.SQLitePath)
	return fmt.Errorf("%w: the secret file %s is missing, and the database %s was made with a secret.\n"+
		"A new secret would mean that %s.\n"+
		"Restore %s from where the database came from (a backup must hold both, and a restore must bring both back), or set APP_SECRET to the secret it held. To start over with a new secret instead, run `postguard secret reset --yes`",
		ErrSecretMismatch, path, config.SQLitePath, SecretChangeBreaks, path)
}

// Migrate applies River's migrations and then the app's to the database config names, under the
// migration lock, and checks the secret against the database's (CheckSecret) when it has one:
// APP_SECRET, or on the embedded default its secret file (made for a new database, as `serve`
// would). Without APP_SECRET on PostgreSQL the check is left to the first process that has it.
// It returns whether a secret was checked.
func Migrate(ctx context.Context, config *Config, logger *slog.Logger) (checked bool, err error) {
	s := &Service{Config: config, Logger: logger}
	secret, err := s.open(ctx, true, nil)
	if err != nil {
		return false, err
	}
	defer s.Store.Close()

	if err := s.Store.Migrate(ctx); err != nil {
		return false, fmt.Errorf("error migrating %s database: %w", s.Store.Engine(), err)
	}
	if secret == nil {
		return false, nil
	}
	return true, CheckSecret(ctx, s.Store, secret, SecretSource(config))
}

// ResetSecret records the check value of config's secret as the database's, in place of the
// one it was made with: APP_SECRET, or on the embedded default its secret file, made anew when
// it was lost. The schema must be current (on the embedded default it is migrated, as `serve`
// would). It returns false when the database already records that secret (nothing changed). It
// breaks what SecretChangeBreaks says; the caller says so first.
func ResetSecret(ctx context.Context, config *Config, logger *slog.Logger) (changed bool, err error) {
	s := &Service{Config: config, Logger: logger}
	if _, err := s.open(ctx, false, nil); err != nil {
		return false, err
	}
	defer s.Store.Close()

	secret := config.AppSecret
	if s.lite != nil {
		if err := s.Store.Migrate(ctx); err != nil {
			return false, fmt.Errorf("error migrating SQLite database %s: %w", config.SQLitePath, err)
		}
		if secret == nil {
			if secret, err = s.lite.AppSecret(ctx); errors.Is(err, sqlite.ErrSecretFileMissing) {
				secret, err = s.lite.CreateAppSecret()
			}
			if err != nil {
				return false, err
			}
		}
	} else if err := s.Store.CheckSchema(ctx); err != nil {
		return false, err
	}

	check := tokens.SecretCheck(secret)
	recorded, err := s.Store.SecretCheckRecord(ctx, &db.SecretCheckParams{CheckValue: check, Now: time.Now()})
	if err != nil {
		return false, fmt.Errorf("error reading the database's secret check value: %w", err)
	}
	if hmac.Equal(recorded, check) {
		return false, nil
	}
	if err := s.Store.SecretCheckReplace(ctx, &db.SecretCheckParams{CheckValue: check, Now: time.Now()}); err != nil {
		return false, fmt.Errorf("error recording the new secret's check value: %w", err)
	}
	logger.WarnContext(ctx, "the database records a new secret", slog.String("secret", SecretSource(config)))
	return true, nil
}
