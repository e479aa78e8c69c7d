package dbtest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db/postgres"
	"github.com/postguard/postguard/internal/riverstore"
)

// DatabaseURLDefault is the Postgres tests use when TEST_DATABASE_URL is unset.
const DatabaseURLDefault = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// schemaPrefix starts the name of every schema dbtest creates.
const schemaPrefix = "pgtest_"

// discardLogger quiets the migrations dbtest runs between tests.
var discardLogger = slog.New(slog.DiscardHandler)

// DatabaseURL returns TEST_DATABASE_URL (or DatabaseURLDefault) itself, no schema chosen, once
// Postgres answers there: for tests of connection settings that touch no table.
func DatabaseURL(t testing.TB) string {
	t.Helper()

	adminConnect(t)
	return databaseURL()
}

// PostgresURL returns TEST_DATABASE_URL with its search_path set to a migrated schema of the
// test's own, with empty tables: for tests that start whole processes, or several stores sharing
// one database. Stop whatever uses it in a Cleanup registered after this call.
//
// Migrating a schema costs a few hundred milliseconds, emptying one a few, so schemas are reused
// within a process: when t ends, its schema's tables are emptied (River's and goose's migration
// records kept) and the schema goes to the next test. A schema left behind (not fully migrated,
// or its tables still locked) is dropped instead. Schemas are named after the test binary and a
// number, and each is held with a session advisory lock while a process uses it, so concurrent
// test processes never share one; a later run of the same package drops and remigrates them.
func PostgresURL(t testing.TB) string {
	t.Helper()

	admin := adminConnect(t)

	schema, err := admin.takeSchema(t.Context())
	require.NoError(t, err)
	schemaURL := withSearchPath(databaseURL(), schema)

	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()

		if err := admin.returnSchema(ctx, schema, schemaURL); err != nil {
			t.Errorf("error returning test schema %s: %s", schema, err)
		}
	})

	return schemaURL
}

// PostgresEmptyURL returns TEST_DATABASE_URL with its search_path set to a new, empty schema (no
// migration applied), dropped when t ends: for tests of `postguard migrate` and of a schema behind.
func PostgresEmptyURL(t testing.TB) string {
	t.Helper()

	return newEmptySchemaURL(t)
}

// PostgresDatabase is a database of a test's own, for tests that take a whole database down
// (refusing connections, read-only, every backend terminated) without touching the database
// other tests share.
type PostgresDatabase struct {
	// Name is the database's name.
	Name string
	// URL is TEST_DATABASE_URL naming this database instead.
	URL string

	admin *adminDB
}

// NewPostgresDatabase creates a database with a random name, migrates it, and drops it (its
// connections terminated) when t ends.
func NewPostgresDatabase(t testing.TB) *PostgresDatabase {
	t.Helper()

	admin := adminConnect(t)
	name := schemaPrefix + "db_" + randomHex(8)
	_, err := admin.pool.Exec(t.Context(), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.pool.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("error dropping test database %s: %s", name, err)
		}
	})

	u, err := url.Parse(databaseURL())
	require.NoError(t, err)
	u.Path = "/" + name
	database := &PostgresDatabase{Name: name, URL: u.String(), admin: admin}

	store, err := openDiscarding(t.Context(), database.URL)
	require.NoError(t, err)
	defer store.Close()
	require.NoError(t, store.Migrate(t.Context()))
	return database
}

// AllowConnections lets the database take new connections, or refuses them as PostgreSQL does
// during maintenance (SQLSTATE 55000 at connect). Connections already open stay open.
func (d *PostgresDatabase) AllowConnections(t testing.TB, allow bool) {
	t.Helper()

	_, err := d.admin.pool.Exec(t.Context(), fmt.Sprintf("ALTER DATABASE %s ALLOW_CONNECTIONS %t", pgx.Identifier{d.Name}.Sanitize(), allow))
	require.NoError(t, err)
}

// SetReadOnly makes the database's new sessions read-only (default_transaction_read_only), as
// a server demoted after a failover is: writes fail with SQLSTATE 25006. Sessions already open
// keep their setting.
func (d *PostgresDatabase) SetReadOnly(t testing.TB, readOnly bool) {
	t.Helper()

	_, err := d.admin.pool.Exec(t.Context(), fmt.Sprintf("ALTER DATABASE %s SET default_transaction_read_only = %t", pgx.Identifier{d.Name}.Sanitize(), readOnly))
	require.NoError(t, err)
}

// TerminateBackends terminates every backend of the database, as a restart of PostgreSQL or a
// pooler recycling its connections would, and returns once none is left: each has sent its
// FATAL error (57P01) to its client and closed the connection.
func (d *PostgresDatabase) TerminateBackends(t testing.TB) {
	t.Helper()

	ctx := t.Context()
	for {
		// pg_terminate_backend only signals: a backend leaves pg_stat_activity once it has
		// exited. Signalling again is harmless.
		_, err := d.admin.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, d.Name)
		require.NoError(t, err)
		var left int
		require.NoError(t, d.admin.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, d.Name).Scan(&left))
		if left == 0 {
			return
		}
		select {
		case <-ctx.Done():
			require.FailNow(t, "backends still running", "%d backends of %s", left, d.Name)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// newEmptySchemaURL creates a schema with a random name and returns TEST_DATABASE_URL with its
// search_path set to it. The schema is dropped when t ends.
func newEmptySchemaURL(t testing.TB) string {
	t.Helper()

	admin := adminConnect(t)

	schema := schemaPrefix + randomHex(8)
	_, err := admin.pool.Exec(t.Context(), "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)

	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()

		if err := admin.dropSchema(ctx, schema); err != nil {
			t.Errorf("error dropping test schema %s: %s", schema, err)
		}
	})

	return withSearchPath(databaseURL(), schema)
}

// openDiscarding opens an insert-only store on databaseURL that logs nothing, to migrate or check
// a schema between tests.
func openDiscarding(ctx context.Context, databaseURL string) (riverstore.Store, error) {
	engine, err := postgres.NewEngine(ctx, databaseURL, &postgres.Config{Logger: discardLogger})
	if err != nil {
		return nil, err
	}
	store, _, err := riverstore.New(engine, riverpgxv5.New(engine.Pool()), &riverstore.Config{Logger: discardLogger})
	return store, err
}

// admin is the process's connection to TEST_DATABASE_URL, made once.
var (
	admin     *adminDB
	adminErr  error
	adminOnce sync.Once
)

// adminDB creates, empties and drops test schemas, and keeps the migrated ones no test uses.
type adminDB struct {
	pool *pgxpool.Pool

	mu       sync.Mutex
	free     []string  // migrated schemas with empty tables
	lockConn *pgx.Conn // holds an advisory lock on every schema the process uses
	next     int       // number of the next schema name to try
}

// connectAdmin makes the process's admin connections, once, and returns why it could not.
func connectAdmin() error {
	adminOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()

		admin, adminErr = newAdminDB(ctx)
	})
	return adminErr
}

// adminConnect connects (and checks) the process's admin connections once. When Postgres is
// unreachable, t skips, or fails under CI=true.
func adminConnect(t testing.TB) *adminDB {
	t.Helper()

	if connectAdmin() != nil {
		msg := fmt.Sprintf("PostgreSQL unreachable at %s: %s (set TEST_DATABASE_URL; under CI=true this fails)",
			redact(databaseURL()), adminErr)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return admin
}

func newAdminDB(ctx context.Context) (*adminDB, error) {
	// A schema is chosen by adding to the URL's query, so a key=value DSN will not do.
	if u, err := url.Parse(databaseURL()); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, errors.New("TEST_DATABASE_URL must be a postgres:// URL")
	}

	config, err := pgxpool.ParseConfig(databaseURL())
	if err != nil {
		return nil, err
	}
	config.MaxConns = 4

	pool, err := pgxpool.NewWithConfig(ctx, config)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}

	lockConn, err := pgx.ConnectConfig(ctx, config.ConnConfig)
	if err != nil {
		pool.Close()
		return nil, err
	}

	return &adminDB{lockConn: lockConn, pool: pool}, nil
}

func (a *adminDB) dropSchema(ctx context.Context, schema string) error {
	return pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '10s'"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		return err
	})
}

// emptySchema deletes the rows of every table of schema but the migration records, and restarts
// its sequences. DELETE, not TRUNCATE: on tables this small it takes a millisecond, where
// TRUNCATE's new files take hundreds.
func (a *adminDB) emptySchema(ctx context.Context, schema string) error {
	return pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '5s'"); err != nil {
			return err
		}

		rows, err := tx.Query(ctx, `
			SELECT tablename
			FROM pg_tables
			WHERE schemaname = $1
				AND tablename NOT LIKE '%\_db\_version'
				AND tablename <> 'river_migration'
			ORDER BY tablename`, schema)
		if err != nil {
			return err
		}
		tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}

		rows, err = tx.Query(ctx, `SELECT sequencename FROM pg_sequences WHERE schemaname = $1`, schema)
		if err != nil {
			return err
		}
		sequences, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}

		// One round trip; foreign keys between app tables cascade. Sequences restart, so ids are
		// as in a fresh schema.
		var batch pgx.Batch
		for _, table := range tables {
			batch.Queue("DELETE FROM " + pgx.Identifier{schema, table}.Sanitize())
		}
		for _, sequence := range sequences {
			batch.Queue("SELECT setval($1, 1, false)", pgx.Identifier{schema, sequence}.Sanitize())
		}
		return tx.SendBatch(ctx, &batch).Close()
	})
}

// returnSchema empties a schema a test is done with and keeps it for the next test, or drops it
// when it is no longer fully migrated or cannot be emptied.
func (a *adminDB) returnSchema(ctx context.Context, schema, schemaURL string) error {
	store, err := openDiscarding(ctx, schemaURL)
	if err != nil {
		return err
	}
	checkErr := store.CheckSchema(ctx)
	store.Close()

	if checkErr == nil {
		checkErr = a.emptySchema(ctx, schema)
	}
	if checkErr != nil {
		// Not reused: its name stays locked, so no other test of this process takes it.
		if err := a.dropSchema(ctx, schema); err != nil {
			return errors.Join(checkErr, err)
		}
		return nil
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	a.free = append(a.free, schema)
	return nil
}

// takeSchema hands out a migrated schema with empty tables: a free one, or a new one.
func (a *adminDB) takeSchema(ctx context.Context) (string, error) {
	schema, isNew, err := a.takeSchemaName(ctx)
	if err != nil || !isNew {
		return schema, err
	}

	// The name is this process's now, but an earlier run may have left the schema in any state:
	// start afresh.
	if err := a.dropSchema(ctx, schema); err != nil {
		return "", fmt.Errorf("error dropping old schema %s: %w", schema, err)
	}
	if _, err := a.pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return "", fmt.Errorf("error creating schema %s: %w", schema, err)
	}

	store, err := openDiscarding(ctx, withSearchPath(databaseURL(), schema))
	if err != nil {
		return "", err
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		return "", fmt.Errorf("error migrating schema %s: %w", schema, err)
	}
	return schema, nil
}

// takeSchemaName returns a free schema, or the name of a new one, locked for this process.
func (a *adminDB) takeSchemaName(ctx context.Context) (string, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()

	if n := len(a.free); n > 0 {
		schema := a.free[n-1]
		a.free = a.free[:n-1]
		return schema, false, nil
	}

	for {
		schema := fmt.Sprintf("%s%s_%d", schemaPrefix, binaryName(), a.next)
		a.next++

		var locked bool
		if err := a.lockConn.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtextextended($1, 0))", schema).Scan(&locked); err != nil {
			return "", false, fmt.Errorf("error locking schema name: %w", err)
		}
		if locked {
			return schema, true, nil
		}
	}
}

// binaryName is the test binary's package name, made safe for a schema name ("api" for
// "api.test").
func binaryName() string {
	name := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe"), ".test")
	name = regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(name), "_")
	return name[:min(len(name), 32)]
}

func databaseURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DatabaseURLDefault
}

// redact hides a password in a URL for messages.
func redact(databaseURL string) string {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return "TEST_DATABASE_URL"
	}
	return u.Redacted()
}

// withSearchPath adds search_path=schema (and synchronous_commit=off) to a postgres:// URL as
// startup options, which pgx and libpq both understand, so every connection of every pool on it
// sees only that schema.
func withSearchPath(databaseURL, schema string) string {
	u, err := url.Parse(databaseURL)
	if err != nil {
		panic(err) // newAdminDB parsed it already
	}

	// Tests do not outlive a crash of the database, so their commits need not wait for a disk
	// flush.
	query := u.Query()
	query.Set("options", strings.TrimSpace(query.Get("options")+" -c search_path="+schema+" -c synchronous_commit=off"))
	// Encode writes spaces as '+', which pgx does not read back as spaces; %20 both do.
	u.RawQuery = strings.ReplaceAll(query.Encode(), "+", "%20")
	return u.String()
}

// MainWithPostgres runs m, the tests and examples of a package whose runnable examples need
// PostgreSQL (db/postgres's): it gives the examples DATABASE_URL, TEST_DATABASE_URL with its
// search_path set to a new, empty schema, dropped once they ran. Without PostgreSQL the tests
// skip (or fail, under CI=true) as everywhere, and the examples are left out, saying why; under
// CI=true the package fails. Call it from TestMain: os.Exit(dbtest.MainWithPostgres(m)).
func MainWithPostgres(m *testing.M) int {
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	if err := connectAdmin(); err != nil {
		if os.Getenv("CI") == "true" {
			fmt.Fprintf(os.Stderr, "dbtest: PostgreSQL at %s is unreachable under CI=true: %v\n", redact(databaseURL()), err)
			return 1
		}
		fmt.Printf("dbtest: the examples need PostgreSQL at %s (TEST_DATABASE_URL), unreachable: left out (%v)\n", redact(databaseURL()), err)
		if run := flag.Lookup("test.run"); run != nil && run.Value.String() == "" {
			_ = run.Value.Set("^(Test|Fuzz)") // examples match -test.run too
		}
		return m.Run()
	}
	schema := schemaPrefix + "example_" + randomHex(8)
	if _, err := admin.pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		fmt.Fprintf(os.Stderr, "dbtest: error creating the examples' schema: %v\n", err)
		return 1
	}
	defer func() {
		if err := admin.dropSchema(context.WithoutCancel(ctx), schema); err != nil {
			fmt.Fprintf(os.Stderr, "dbtest: error dropping the examples' schema %s: %v\n", schema, err)
		}
	}()
	if err := os.Setenv("DATABASE_URL", withSearchPath(databaseURL(), schema)); err != nil {
		fmt.Fprintf(os.Stderr, "dbtest: %v\n", err)
		return 1
	}
	return m.Run()
}
