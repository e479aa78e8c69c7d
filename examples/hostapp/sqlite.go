package main

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/sqlite"
	"github.com/postguard/postguard/jobs"
)

// accountsSQLite is the host's own table on SQLite. A real app keeps it in its own migrations.
//
//go:embed accounts_sqlite.sql
var accountsSQLite string

// NewSQLiteApp builds the app on sqlDB, its own SQLite handle, which it keeps, opened as
// sqlite.NewEngineFromDB says (one connection, WAL, a busy timeout, _txlock=immediate):
// postguard's tables beside its accounts, and River (riversqlite) on the same handle.
func NewSQLiteApp(sqlDB *sql.DB, config *Config) (*App, error) {
	engine, err := sqlite.NewEngineFromDB(sqlDB, &sqlite.Config{Logger: config.logger()})
	if err != nil {
		return nil, err
	}
	d := &sqliteDatabase{accountsDB: accountsDB{db: sqlDB}}
	return newApp(config, db.NewTables(engine, &db.TablesConfig{Logger: config.logger()}), d, func(workers *river.Workers) (riverClient, error) {
		client, err := newRiverClient(riversqlite.New(sqlDB), workers, config.logger())
		d.river = client
		return client, err
	})
}

// sqliteDatabase is the app's database on SQLite: its accounts through its *sql.DB, and its
// River client on the same handle.
type sqliteDatabase struct {
	accountsDB

	river *river.Client[*sql.Tx]
}

func (d *sqliteDatabase) migrate(ctx context.Context, logger *slog.Logger) error {
	migrator, err := rivermigrate.New(riversqlite.New(d.db), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("error applying River's migrations: %w", err)
	}
	if _, err := d.db.ExecContext(ctx, accountsSQLite); err != nil {
		return fmt.Errorf("error creating accounts: %w", err)
	}
	return nil
}

// close has nothing to close: the *sql.DB is the app's.
func (d *sqliteDatabase) close() error { return nil }

func (d *sqliteDatabase) inTx(ctx context.Context, fn func(tx accountsTx) error) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if err := fn(&sqliteTx{tx: tx, river: d.river}); err != nil {
		return err
	}
	return tx.Commit()
}

// sqliteTx is a transaction of the app's on SQLite: its account and, with River's InsertTx, its
// welcome job.
type sqliteTx struct {
	tx    *sql.Tx
	river *river.Client[*sql.Tx]
}

func (t *sqliteTx) createAccount(ctx context.Context, email, name string, hash []byte) (int64, error) {
	var id int64
	err := t.tx.QueryRowContext(ctx, createAccountSQL, email, name, hash).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, errEmailTaken
	}
	if err != nil {
		return 0, err
	}
	if _, err := t.river.InsertTx(ctx, t.tx, jobs.WelcomeEmailArgs{UserID: id}, nil); err != nil {
		return 0, fmt.Errorf("error inserting welcome job: %w", err)
	}
	return id, nil
}
