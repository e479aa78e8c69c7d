package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/postgres"
	"github.com/postguard/postguard/jobs"
)

// accountsPostgres is the host's own table on PostgreSQL. A real app keeps it in its own
// migrations.
//
//go:embed accounts_postgres.sql
var accountsPostgres string

// NewPostgresApp builds the app on pool, its own pgx pool, which it keeps: postguard's tables
// beside its accounts, and River (riverpgxv5) on the same pool.
func NewPostgresApp(ctx context.Context, pool *pgxpool.Pool, config *Config) (*App, error) {
	engine, err := postgres.NewEngineFromPool(ctx, pool, &postgres.Config{Logger: config.logger()})
	if err != nil {
		return nil, err
	}
	d := &postgresDatabase{pool: pool, accountsDB: accountsDB{db: stdlib.OpenDBFromPool(pool)}}
	return newApp(config, db.NewTables(engine, &db.TablesConfig{Logger: config.logger()}), d, func(workers *river.Workers) (riverClient, error) {
		client, err := newRiverClient(riverpgxv5.New(pool), workers, config.logger())
		d.river = client
		return client, err
	})
}

// postgresDatabase is the app's database on PostgreSQL: its accounts through its pgx pool (a
// *sql.DB over it outside transactions), and its River client on the same pool, whose InsertTx
// takes the pool's transactions.
type postgresDatabase struct {
	accountsDB

	pool  *pgxpool.Pool
	river *river.Client[pgx.Tx]
}

func (d *postgresDatabase) migrate(ctx context.Context, logger *slog.Logger) error {
	migrator, err := rivermigrate.New(riverpgxv5.New(d.pool), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("error applying River's migrations: %w", err)
	}
	if _, err := d.pool.Exec(ctx, accountsPostgres); err != nil {
		return fmt.Errorf("error creating accounts: %w", err)
	}
	return nil
}

// close closes the *sql.DB over the pool, which leaves the pool open.
func (d *postgresDatabase) close() error { return d.db.Close() }

func (d *postgresDatabase) inTx(ctx context.Context, fn func(tx accountsTx) error) error {
	return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		return fn(&postgresTx{tx: tx, river: d.river})
	})
}

// postgresTx is a transaction of the app's on PostgreSQL: its account and, with River's
// InsertTx, its welcome job.
type postgresTx struct {
	tx    pgx.Tx
	river *river.Client[pgx.Tx]
}

func (t *postgresTx) createAccount(ctx context.Context, email, name string, hash []byte) (int64, error) {
	var id int64
	err := t.tx.QueryRow(ctx, createAccountSQL, email, name, hash).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
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
