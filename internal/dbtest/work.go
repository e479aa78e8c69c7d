package dbtest

import (
	"context"
	"database/sql"
	"path/filepath"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertest"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"
)

// Work inserts a job of args and works it with worker in River's test executor (rivertest), as a
// client built from riverConfig would: the same middleware, retry policy, timeouts, snoozes and
// metadata. It returns the outcome and the job's row after it. The worker's own queries go to
// store, like in production; the job's row is kept in River's tables, committed, so that WorkJob
// can work it again (the next attempt).
//
// On PostgreSQL the job lives in the store's schema. On SQLite it lives in a second file: rivertest
// holds a transaction on the job while the worker runs, and SQLite's one writer would make the
// worker's own writes wait for it.
func Work[T river.JobArgs](ctx context.Context, t testing.TB, store *Store, riverConfig *river.Config, worker river.Worker[T], args T, opts *river.InsertOpts) (*rivertest.WorkResult, error) {
	t.Helper()

	return work(ctx, t, store, riverConfig, worker, func(w workFuncs[T]) (*rivertest.WorkResult, error) {
		return w.work(args, opts)
	})
}

// WorkJob works job, a row Work returned, again: its next attempt.
func WorkJob[T river.JobArgs](ctx context.Context, t testing.TB, store *Store, riverConfig *river.Config, worker river.Worker[T], job *rivertype.JobRow) (*rivertest.WorkResult, error) {
	t.Helper()

	return work(ctx, t, store, riverConfig, worker, func(w workFuncs[T]) (*rivertest.WorkResult, error) {
		return w.workJob(job)
	})
}

// workFuncs are rivertest's Work and WorkJob, with their engine's transaction bound.
type workFuncs[T river.JobArgs] struct {
	work    func(args T, opts *river.InsertOpts) (*rivertest.WorkResult, error)
	workJob func(job *rivertype.JobRow) (*rivertest.WorkResult, error)
}

func work[T river.JobArgs](ctx context.Context, t testing.TB, store *Store, riverConfig *river.Config, worker river.Worker[T], do func(w workFuncs[T]) (*rivertest.WorkResult, error)) (*rivertest.WorkResult, error) {
	t.Helper()

	if store.Postgres != nil {
		w := rivertest.NewWorker(t, riverpgxv5.New(nil), riverConfig, worker)
		tx, err := store.Postgres.Pool().Begin(ctx)
		require.NoError(t, err)
		defer func() { require.NoError(t, tx.Commit(context.WithoutCancel(ctx))) }()
		return do(workFuncs[T]{
			work: func(args T, opts *river.InsertOpts) (*rivertest.WorkResult, error) {
				return w.Work(ctx, t, tx, args, opts)
			},
			workJob: func(job *rivertype.JobRow) (*rivertest.WorkResult, error) { return w.WorkJob(ctx, t, tx, job) },
		})
	}

	w := rivertest.NewWorker(t, riversqlite.New(nil), riverConfig, worker)
	tx, err := store.riverDB(t).BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, tx.Commit()) }()
	return do(workFuncs[T]{
		work: func(args T, opts *river.InsertOpts) (*rivertest.WorkResult, error) {
			return w.Work(ctx, t, tx, args, opts)
		},
		workJob: func(job *rivertype.JobRow) (*rivertest.WorkResult, error) { return w.WorkJob(ctx, t, tx, job) },
	})
}

// sqliteRiver is the file of Work's River tables on SQLite, made on first use.
type sqliteRiver struct {
	once sync.Once
	db   *sql.DB
}

func (s *Store) riverDB(t testing.TB) *sql.DB {
	t.Helper()

	s.sqliteRiver.once.Do(func() {
		sqlDB, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "river.db")+"?_pragma=journal_mode(WAL)&_txlock=immediate")
		require.NoError(t, err)
		sqlDB.SetMaxOpenConns(1)
		t.Cleanup(func() { _ = sqlDB.Close() })
		migrator, err := rivermigrate.New(riversqlite.New(sqlDB), &rivermigrate.Config{Logger: Logger(t)})
		require.NoError(t, err)
		_, err = migrator.Migrate(t.Context(), rivermigrate.DirectionUp, nil)
		require.NoError(t, err)
		s.sqliteRiver.db = sqlDB
	})
	return s.sqliteRiver.db
}

// RiverMigrate applies River's migrations alone to store's database in direction, as `river
// migrate-up` and `river migrate-down` do, and returns what it applied.
func RiverMigrate(t testing.TB, store *Store, direction rivermigrate.Direction, opts *rivermigrate.MigrateOpts) *rivermigrate.MigrateResult {
	t.Helper()

	config := &rivermigrate.Config{Logger: Logger(t)}
	var (
		res *rivermigrate.MigrateResult
		err error
	)
	if store.Postgres != nil {
		var migrator *rivermigrate.Migrator[pgx.Tx]
		if migrator, err = rivermigrate.New(riverpgxv5.New(store.Postgres.Pool()), config); err == nil {
			res, err = migrator.Migrate(t.Context(), direction, opts)
		}
	} else {
		var migrator *rivermigrate.Migrator[*sql.Tx]
		if migrator, err = rivermigrate.New(riversqlite.New(store.SQLite.DB()), config); err == nil {
			res, err = migrator.Migrate(t.Context(), direction, opts)
		}
	}
	require.NoError(t, err)
	return res
}
