package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postguard/postguard/cmd/internal/service"
	"github.com/postguard/postguard/internal/riverstore"
)

const (
	enginePostgres = "postgres"
	engineSQLite   = "sqlite"
)

// schemaPrefix starts the name of every schema the tool creates.
const schemaPrefix = "pgload_"

// database is a database of the run's own: a new schema on PostgreSQL or a new file on SQLite,
// migrated. Stores opened on it share its tables; drop removes it.
type database struct {
	engine string
	url    string // PostgreSQL: the server URL with search_path set to the schema
	path   string // SQLite: the file
	schema string // PostgreSQL: the schema
	logger *slog.Logger
}

// newPostgresDatabase creates schema pgload_<tag>_<suffix> on the server at baseURL and migrates
// it. The caller drops it.
func newPostgresDatabase(ctx context.Context, baseURL, tag, suffix string, logger *slog.Logger) (*database, error) {
	schema := schemaPrefix + tag + "_" + suffix
	schemaURL, err := withSearchPath(baseURL, schema)
	if err != nil {
		return nil, err
	}

	connectCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(connectCtx, baseURL)
	if err != nil {
		return nil, fmt.Errorf("error connecting to PostgreSQL at %s: %w", redact(baseURL), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return nil, fmt.Errorf("error creating schema %s: %w", schema, err)
	}

	d := &database{engine: enginePostgres, url: schemaURL, schema: schema, logger: logger}
	if err := d.migrate(ctx); err != nil {
		return d, err // d, so that the caller drops the schema
	}
	return d, nil
}

// newSQLiteDatabase creates and migrates dir/name.db.
func newSQLiteDatabase(ctx context.Context, dir, name string, logger *slog.Logger) (*database, error) {
	d := &database{engine: engineSQLite, path: filepath.Join(dir, name+".db"), logger: logger}
	if err := d.migrate(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *database) migrate(ctx context.Context) error {
	store, err := d.open(ctx)
	if err != nil {
		return err
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		return fmt.Errorf("error migrating the load database: %w", err)
	}
	return nil
}

// config is the service configuration of a process on the database: DATABASE_URL's part.
func (d *database) config() *service.Config {
	if d.engine == enginePostgres {
		return &service.Config{Engine: service.EnginePostgres, DatabaseURL: d.url}
	}
	return &service.Config{Engine: service.EngineSQLite, SQLitePath: d.path}
}

// open opens an insert-only store on the database, as `postguard migrate` does, for the run's own
// statements (the ceiling, the users of the drain).
func (d *database) open(ctx context.Context) (riverstore.Store, error) {
	store, err := service.OpenStore(ctx, d.config(), d.logger)
	if err != nil {
		return nil, fmt.Errorf("error opening the load database: %w", err)
	}
	return store, nil
}

// drop removes the database: its schema on PostgreSQL (the caller removes SQLite's directory).
func (d *database) drop(ctx context.Context, baseURL string) error {
	if d.engine != enginePostgres {
		return nil
	}
	conn, err := pgx.Connect(ctx, baseURL)
	if err != nil {
		return fmt.Errorf("error connecting to drop schema %s: %w", d.schema, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '10s'"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{d.schema}.Sanitize()+" CASCADE")
		return err
	})
	if err != nil {
		return fmt.Errorf("error dropping schema %s: %w", d.schema, err)
	}
	return nil
}

// withSearchPath sets search_path to schema on every connection made from a postgres:// URL, as
// a startup option (which pgx and libpq both read). Nothing else changes: unlike internal/dbtest's
// URLs, commits stay synchronous, as in production.
func withSearchPath(databaseURL, schema string) (string, error) {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return "", fmt.Errorf("error parsing -database-url: %w", err)
	}
	query := u.Query()
	query.Set("options", strings.TrimSpace(query.Get("options")+" -c search_path="+schema))
	// Encode writes spaces as '+', which pgx does not read back as spaces; %20 both do.
	u.RawQuery = strings.ReplaceAll(query.Encode(), "+", "%20")
	return u.String(), nil
}

// sqliteDir makes the run's directory for SQLite files: in the directory of sqlite://PATH's PATH
// (PATH itself is never opened), or the system's temporary directory.
func sqliteDir(databaseURL string) (string, error) {
	parent := os.TempDir()
	if path, ok := strings.CutPrefix(databaseURL, "sqlite://"); ok && path != "" {
		parent = filepath.Dir(path)
	}
	dir, err := os.MkdirTemp(parent, "postguard-load-*")
	if err != nil {
		return "", fmt.Errorf("error creating a temporary directory for SQLite: %w", err)
	}
	return dir, nil
}

// redact hides a password in a URL.
func redact(databaseURL string) string {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return "-database-url"
	}
	return u.Redacted()
}
