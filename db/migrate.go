package db

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
)

// Part is one set of postguard's tables, migrated on its own and recorded in a goose table of
// its own (Part.GooseTable): a host app migrates the parts it uses, and nothing else, beside its
// own tables and its own goose history (goose_db_version is never postguard's but for a database
// of before revision 3, see MigrateOpts.Revision2Table).
type Part string

// Parts of postguard's tables. Their migrations are in Migrations under <engine>/<part>/.
const (
	// PartLimiter is the rate limiter's counters and its trusted devices' revocations
	// (rate_limit_counters, rate_limit_device_revocations): all abuse.Limiter needs.
	PartLimiter Part = "limiter"
	// PartMail is what the mail workers and the delivery webhook keep: link tokens, message
	// rows, the suppression list, the ids of webhook deliveries and the send pacer
	// (email_tokens, email_messages, email_suppressions, webhook_events, send_pacer).
	PartMail Part = "mail"
	// PartService is postguard's own server's: its users table, the readiness heartbeat that
	// Tables.Ready writes, and the check value of its secret (users, readiness_heartbeat,
	// secret_check). A host app never needs it.
	PartService Part = "service"
)

// Parts are every part, as postguard's own server migrates them.
func Parts() []Part { return []Part{PartService, PartMail, PartLimiter} }

// GooseTable is the goose table that records the part's migrations: postguard_<part>_db_version.
func (p Part) GooseTable() string { return "postguard_" + string(p) + "_db_version" }

// Revision2GooseTable is where postguard's server recorded its migrations up to revision 2:
// goose's default table, one history of every table (Migrations' <engine>/revision2/).
const Revision2GooseTable = goose.DefaultTablename

// revision2Marker is a table every database that the revision-2 history migrated has, from its
// first migration on.
const revision2Marker = "email_tokens"

// MigrateOpts are MigrateTables' and MigrationsBehind's.
type MigrateOpts struct {
	// Parts are the parts to migrate or check, at least one: a host app names those it uses
	// (the limiter alone: PartLimiter; with postguard's mail workers, PartMail too), postguard's
	// server all of them (Parts()).
	Parts []Part

	// Revision2Table names the goose table in which postguard recorded its migrations before
	// revision 3, when they were one history of every table: Revision2GooseTable for postguard's
	// server, or the TablesConfig.GooseTable a host app gave then. A database that has it, has
	// postguard's tables, and has no goose table of any part yet is upgraded in place by
	// MigrateTables: that history is brought to its last version (revision 2's schema, which is
	// every part's first migration), then the named parts' goose tables are created with that
	// first migration recorded as applied (the tables are there, with their rows), and their
	// later migrations run as anywhere else. "" (a host app that never used postguard before
	// revision 3) looks for no such table: goose_db_version is then never read, whoever's it is.
	Revision2Table string

	// BeforeFunc, when set, runs under the migration lock before postguard's migrations, and an
	// error it returns stops them: postguard's server applies River's migrations there, so that
	// one lock covers both. MigrationsBehind ignores it.
	BeforeFunc func(ctx context.Context) error
}

// parts checks opts names parts, each known and once.
func (o *MigrateOpts) parts() ([]Part, error) {
	if o == nil || len(o.Parts) == 0 {
		return nil, errors.New("db: MigrateOpts.Parts names no part of postguard's tables to migrate (db.PartLimiter, db.PartMail)")
	}
	for i, part := range o.Parts {
		if !slices.Contains(Parts(), part) {
			return nil, fmt.Errorf("db: MigrateOpts.Parts: unknown part %q", part)
		}
		if slices.Contains(o.Parts[:i], part) {
			return nil, fmt.Errorf("db: MigrateOpts.Parts: part %q named twice", part)
		}
	}
	return o.Parts, nil
}

// MigrateTables implements Tables.
func (s *tables[TTx]) MigrateTables(ctx context.Context, opts *MigrateOpts) error {
	parts, err := opts.parts()
	if err != nil {
		return err
	}
	release, err := s.engine.LockMigrations(ctx)
	if err != nil {
		return fmt.Errorf("error taking the migration lock: %w", err)
	}
	defer release()
	if opts.BeforeFunc != nil {
		if err := opts.BeforeFunc(ctx); err != nil {
			return err
		}
	}

	m := s.migrator()
	defer m.release()
	if opts.Revision2Table != "" {
		if err := m.upgradeRevision2(ctx, opts.Revision2Table, parts); err != nil {
			return err
		}
	}
	for _, part := range parts {
		provider, err := m.provider(string(part), part.GooseTable())
		if err != nil {
			return err
		}
		if _, err := provider.Up(ctx); err != nil {
			return fmt.Errorf("error applying the migrations of postguard's %s tables: %w", part, err)
		}
	}
	return nil
}

// MigrationsBehind implements Tables.
func (s *tables[TTx]) MigrationsBehind(ctx context.Context, opts *MigrateOpts) ([]string, error) {
	parts, err := opts.parts()
	if err != nil {
		return nil, err
	}
	m := s.migrator()
	defer m.release()
	if opts.Revision2Table != "" {
		atRevision2, err := m.atRevision2(ctx, opts.Revision2Table)
		if err != nil {
			return nil, err
		}
		if atRevision2 {
			return []string{fmt.Sprintf("postguard's tables are as revision 2 migrated them (%s), before each part had a goose table of its own", opts.Revision2Table)}, nil
		}
	}

	var behind []string
	for _, part := range parts {
		exists, err := m.tableExists(ctx, part.GooseTable())
		if err != nil {
			return nil, err
		}
		if !exists {
			behind = append(behind, fmt.Sprintf("postguard's %s tables are not migrated", part))
			continue
		}
		provider, err := m.provider(string(part), part.GooseTable())
		if err != nil {
			return nil, err
		}
		pending, err := provider.HasPending(ctx)
		if err != nil {
			return nil, fmt.Errorf("error checking the migrations of postguard's %s tables: %w", part, err)
		}
		if !pending {
			continue
		}
		current, target, err := provider.GetVersions(ctx)
		if err != nil {
			return nil, fmt.Errorf("error reading the migration version of postguard's %s tables: %w", part, err)
		}
		behind = append(behind, fmt.Sprintf("postguard's %s tables are at version %d of %d", part, current, target))
	}
	return behind, nil
}

// migrator is goose on the engine's connections, for one MigrateTables or MigrationsBehind.
type migrator[TTx any] struct {
	engine  Engine[TTx]
	logger  *slog.Logger
	db      *sql.DB
	dialect goose.Dialect
	release func()
}

func (s *tables[TTx]) migrator() *migrator[TTx] {
	sqlDB, dialect, release := s.engine.GooseDB()
	return &migrator[TTx]{engine: s.engine, logger: s.logger, db: sqlDB, dialect: dialect, release: release}
}

// provider is goose with the engine's migrations of dir (a part, or revision2), recorded in table.
func (m *migrator[TTx]) provider(dir, table string) (*goose.Provider, error) {
	migrations, err := fs.Sub(Migrations, "migrations/"+m.engine.Name()+"/"+dir)
	if err != nil {
		return nil, fmt.Errorf("error opening migrations: %w", err)
	}
	provider, err := goose.NewProvider(m.dialect, m.db, migrations,
		goose.WithDisableGlobalRegistry(true),
		goose.WithTableName(table),
		goose.WithSlog(m.logger),
	)
	if err != nil {
		return nil, fmt.Errorf("error creating goose provider: %w", err)
	}
	return provider, nil
}

func (m *migrator[TTx]) tableExists(ctx context.Context, name string) (bool, error) {
	exists, err := m.engine.TableExists(ctx, m.db, name)
	if err != nil {
		return false, fmt.Errorf("error checking whether table %s exists: %w", name, err)
	}
	return exists, nil
}

// atRevision2 says the database's postguard tables were migrated by the revision-2 history,
// recorded in table, and no part has a goose table of its own yet. A table of that name beside
// no postguard table is somebody else's goose history, and is left alone.
func (m *migrator[TTx]) atRevision2(ctx context.Context, table string) (bool, error) {
	for _, part := range Parts() {
		if exists, err := m.tableExists(ctx, part.GooseTable()); err != nil || exists {
			return false, err
		}
	}
	for _, name := range []string{table, revision2Marker} {
		if exists, err := m.tableExists(ctx, name); err != nil || !exists {
			return false, err
		}
	}
	return true, nil
}

// upgradeRevision2 upgrades a database of before revision 3 (see MigrateOpts.Revision2Table) in
// place, when it is one: the revision-2 history to its last version, then parts' goose tables,
// each with its first migration (revision 2's schema) recorded as applied, in one transaction.
func (m *migrator[TTx]) upgradeRevision2(ctx context.Context, table string, parts []Part) error {
	atRevision2, err := m.atRevision2(ctx, table)
	if err != nil || !atRevision2 {
		return err
	}
	provider, err := m.provider("revision2", table)
	if err != nil {
		return err
	}
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("error applying the migrations of before revision 3 (%s): %w", table, err)
	}

	tx, err := m.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("error beginning transaction: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	for _, part := range parts {
		store, err := database.NewStore(m.dialect, part.GooseTable())
		if err != nil {
			return fmt.Errorf("error creating goose store: %w", err)
		}
		// As goose's own first run does: the table, version 0, then the first migration.
		if err := store.CreateVersionTable(ctx, tx); err != nil {
			return fmt.Errorf("error creating %s: %w", part.GooseTable(), err)
		}
		for _, version := range []int64{0, 1} {
			if err := store.Insert(ctx, tx, database.InsertRequest{Version: version}); err != nil {
				return fmt.Errorf("error recording version %d in %s: %w", version, part.GooseTable(), err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("error committing transaction: %w", err)
	}
	m.logger.InfoContext(ctx, "postguard's tables were migrated before revision 3: each part now has a goose table of its own",
		slog.String("revision2_table", table), slog.Any("parts", parts))
	return nil
}
