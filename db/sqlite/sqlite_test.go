package sqlite_test

import (
	"bytes"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/sqlite"
	"github.com/postguard/postguard/internal/dbtest"
)

// SQLite-only behaviour; what both engines share is in db's conformance suite.

func TestNewEngine(t *testing.T) {
	t.Parallel()

	// One connection, and the pragmas every connection of the engine's gets.
	store := dbtest.NewSQLite(t)
	require.Equal(t, 1, store.SQLite.DB().Stats().MaxOpenConnections)
	for pragma, want := range map[string]string{
		"busy_timeout":  strconv.FormatInt(sqlite.BusyTimeoutDefault.Milliseconds(), 10),
		"foreign_keys":  "1",
		"journal_mode":  "wal",
		"secure_delete": "1",
		"synchronous":   "1", // NORMAL
		"temp_store":    "2", // MEMORY
	} {
		var got string
		require.NoError(t, store.SQLite.DB().QueryRowContext(t.Context(), "PRAGMA "+pragma).Scan(&got))
		require.Equal(t, want, got, "PRAGMA %s", pragma)
	}

	t.Run("InvalidPath", func(t *testing.T) {
		t.Parallel()

		_, err := sqlite.NewEngine(t.Context(), "", nil)
		require.Error(t, err)

		_, err = sqlite.NewEngine(t.Context(), filepath.Join(t.TempDir(), "a?b.db"), nil)
		require.Error(t, err)

		_, err = sqlite.NewEngine(t.Context(), filepath.Join(t.TempDir(), "missing", "dir", "x.db"), nil)
		require.Error(t, err)
	})

	t.Run("KeepsDataAcrossReopen", func(t *testing.T) {
		t.Parallel()

		ctx := t.Context()
		path := filepath.Join(t.TempDir(), "postguard.db")
		now := time.Now().UTC().Truncate(time.Microsecond)

		store := dbtest.OpenSQLite(t, path)
		require.NoError(t, store.Migrate(ctx))
		user, err := store.UserInsert(ctx, &db.UserInsertParams{Email: "ada@example.com", Now: now, PasswordHash: "hash"})
		require.NoError(t, err)
		require.NoError(t, store.Close())

		reopened := dbtest.OpenSQLite(t, path)
		require.NoError(t, reopened.CheckSchema(ctx))

		got, err := reopened.UserGetByEmail(ctx, "ada@example.com")
		require.NoError(t, err)
		require.Equal(t, user, got)
	})
}

func TestEngine_AppSecret(t *testing.T) {
	t.Parallel()

	t.Run("StableAcrossReopen", func(t *testing.T) {
		t.Parallel()

		ctx := t.Context()
		path := filepath.Join(t.TempDir(), "postguard.db")

		engine, err := sqlite.NewEngine(ctx, path, nil)
		require.NoError(t, err)

		secret, err := engine.AppSecret(t.Context())
		require.NoError(t, err)
		require.Len(t, secret, 32)

		again, err := engine.AppSecret(t.Context())
		require.NoError(t, err)
		require.Equal(t, secret, again)
		require.NoError(t, engine.Close())

		reopened, err := dbtest.OpenSQLite(t, path).SQLite.AppSecret(t.Context())
		require.NoError(t, err)
		require.Equal(t, secret, reopened)

		// It lives beside the database, in PATH.secret, readable by its owner only.
		data, err := os.ReadFile(sqlite.SecretPath(path))
		require.NoError(t, err)
		require.Equal(t, hex.EncodeToString(secret)+"\n", string(data))
		requireMode0600(t, sqlite.SecretPath(path))
	})

	t.Run("RandomPerDatabase", func(t *testing.T) {
		t.Parallel()

		secret1, err := dbtest.NewSQLite(t).SQLite.AppSecret(t.Context())
		require.NoError(t, err)
		secret2, err := dbtest.NewSQLite(t).SQLite.AppSecret(t.Context())
		require.NoError(t, err)
		require.NotEqual(t, secret1, secret2)
	})

	// A copy of the database files alone opens nothing: the secret is not in their bytes, and
	// nobody but their owner may read them.
	t.Run("NotInTheDatabaseFiles", func(t *testing.T) {
		t.Parallel()

		ctx := t.Context()
		path := filepath.Join(t.TempDir(), "postguard.db")
		store := dbtest.OpenSQLite(t, path)
		require.NoError(t, store.Migrate(ctx))
		secret, err := store.SQLite.AppSecret(t.Context())
		require.NoError(t, err)
		// Write something, so the WAL holds pages.
		_, err = store.UserInsert(ctx, &db.UserInsertParams{Email: "ada@example.com", PasswordHash: "h", Now: time.Now()})
		require.NoError(t, err)

		requireSecretAbsent(t, path, secret)
		for _, name := range []string{path, path + "-wal", path + "-shm", sqlite.SecretPath(path)} {
			requireMode0600(t, name)
		}
	})

	// A database of the first version kept its generated secret in app_settings, in a file
	// created 0644: opening and migrating it moves the secret to PATH.secret, erases it from the
	// database's bytes, and restricts the files.
	t.Run("MovesLegacySecretOutOfTheDatabase", func(t *testing.T) {
		t.Parallel()

		ctx := t.Context()
		path := filepath.Join(t.TempDir(), "postguard.db")
		legacy := make([]byte, 32)
		_, _ = rand.Read(legacy)
		createLegacyDatabase(t, path, legacy)
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		require.True(t, bytes.Contains(data, []byte(hex.EncodeToString(legacy))), "the legacy secret is in the file before")

		store := dbtest.OpenSQLite(t, path)
		require.NoError(t, store.Migrate(ctx))
		secret, err := store.SQLite.AppSecret(t.Context())
		require.NoError(t, err)
		require.Equal(t, legacy, secret, "the same secret: links and rate-limit keys keep working")

		requireSecretAbsent(t, path, secret)
		for _, name := range []string{path, path + "-wal", sqlite.SecretPath(path)} {
			requireMode0600(t, name)
		}
		require.NoError(t, store.CheckSchema(ctx))
	})

	// A database that records its secret's check value keeps that secret: a lost secret file is
	// refused, never silently replaced, and only CreateAppSecret (postguard secret reset) makes
	// a new one.
	t.Run("LostSecretFileNotReplaced", func(t *testing.T) {
		t.Parallel()

		ctx := t.Context()
		path := filepath.Join(t.TempDir(), "postguard.db")
		store := dbtest.OpenSQLite(t, path)
		secret, err := store.SQLite.AppSecret(ctx)
		require.NoError(t, err)
		require.NoError(t, store.Migrate(ctx))
		_, err = store.SQLite.AppSecret(ctx)
		require.NoError(t, err, "migrated, but no check value recorded yet: the file is read")
		_, err = store.SecretCheckRecord(ctx, &db.SecretCheckParams{CheckValue: []byte("check"), Now: time.Now()})
		require.NoError(t, err)

		require.NoError(t, os.Remove(sqlite.SecretPath(path)))
		_, err = store.SQLite.AppSecret(ctx)
		require.ErrorIs(t, err, sqlite.ErrSecretFileMissing)
		require.ErrorContains(t, err, sqlite.SecretPath(path))
		require.NoFileExists(t, sqlite.SecretPath(path))

		created, err := store.SQLite.CreateAppSecret()
		require.NoError(t, err)
		require.NotEqual(t, secret, created)
		again, err := store.SQLite.AppSecret(ctx)
		require.NoError(t, err)
		require.Equal(t, created, again)
		requireMode0600(t, sqlite.SecretPath(path))
	})

	t.Run("LooseSecretFileRefused", func(t *testing.T) {
		t.Parallel()

		ctx := t.Context()
		path := filepath.Join(t.TempDir(), "postguard.db")
		store := dbtest.OpenSQLite(t, path)
		require.NoError(t, store.Migrate(ctx))
		_, err := store.SQLite.AppSecret(t.Context())
		require.NoError(t, err)

		require.NoError(t, os.Chmod(sqlite.SecretPath(path), 0o644))
		_, err = store.SQLite.AppSecret(t.Context())
		require.ErrorContains(t, err, sqlite.SecretPath(path))
		require.ErrorContains(t, err, "chmod 600")
	})
}

// createLegacyDatabase makes a database as the first version left it: the app's schema at
// version 1, its generated secret in app_settings, and the file's mode 0644.
func createLegacyDatabase(t *testing.T, path string, secret []byte) {
	t.Helper()

	ctx := t.Context()
	sqlDB, err := sql.Open("sqlite", path+"?_pragma=journal_mode(WAL)")
	require.NoError(t, err)
	defer sqlDB.Close()
	dbtest.MigrateRevision2(t, sqlDB, "sqlite", 1)
	_, err = sqlDB.ExecContext(ctx, `INSERT INTO app_settings (name, value) VALUES ('app_secret', ?)`, hex.EncodeToString(secret))
	require.NoError(t, err)
	_, err = sqlDB.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`)
	require.NoError(t, err)
	require.NoError(t, os.Chmod(path, 0o644))
}

// requireSecretAbsent checks that neither the secret nor its hex form is in the bytes of the
// database file or its WAL.
func requireSecretAbsent(t *testing.T, path string, secret []byte) {
	t.Helper()

	for _, name := range []string{path, path + "-wal"} {
		data, err := os.ReadFile(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		require.NoError(t, err)
		require.False(t, bytes.Contains(data, []byte(hex.EncodeToString(secret))), "%s holds the secret in hex", name)
		require.False(t, bytes.Contains(data, secret), "%s holds the raw secret", name)
	}
}

func requireMode0600(t *testing.T, name string) {
	t.Helper()

	info, err := os.Stat(name)
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o600), info.Mode().Perm(), name)
}

// TestEngine_BatchesKeepStatementsPrepared: a batch of checks prepares its statements once the
// transaction it first ran them in is over (the one connection is free), and later batches of
// its size run on them, answering as before.
func TestEngine_BatchesKeepStatementsPrepared(t *testing.T) {
	t.Parallel()

	ctx := t.Context()
	store := dbtest.NewSQLite(t)
	_, err := store.UserInsert(ctx, &db.UserInsertParams{Email: "ada@example.com", Now: time.Now(), PasswordHash: "hash"})
	require.NoError(t, err)

	window := time.Now().Truncate(time.Hour)
	batch := func(prefix string) []*db.RateLimitCounterChainResult {
		t.Helper()
		var chains []*db.RateLimitCounterChainParams
		for i := range 3 {
			key := func(kind string) []byte {
				h := make([]byte, 32)
				copy(h, prefix+kind+strconv.Itoa(i))
				return h
			}
			chains = append(chains, &db.RateLimitCounterChainParams{
				Windows: []db.RateLimitCounterConsumeParams{
					{KeyHash: key("ip"), WindowStart: window, WindowEnd: window.Add(time.Hour), LimitCount: 5},
					{KeyHash: key("email"), WindowStart: window, WindowEnd: window.Add(time.Hour), LimitCount: 5},
				},
				UserEmail: "ada@example.com",
			})
		}
		results, err := store.SQLite.Counters().RateLimitCounterConsumeBatch(ctx, chains)
		require.NoError(t, err)
		return results
	}

	require.Zero(t, store.SQLite.PreparedStatements())
	first := batch("a")
	// Three rows' upsert (both positions' text) and the read of three users.
	require.Equal(t, 2, store.SQLite.PreparedStatements())
	second := batch("a")
	require.Equal(t, 2, store.SQLite.PreparedStatements(), "prepared once")
	for i := range 3 {
		require.Equal(t, []int64{1, 1}, first[i].Counts)
		require.Equal(t, []int64{2, 2}, second[i].Counts)
		require.Equal(t, "ada@example.com", second[i].User.Email)
	}
}
