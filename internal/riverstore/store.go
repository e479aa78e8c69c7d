// Package riverstore is postguard's own store: db's Tables with River's client beside them, on
// the same connections. It is the one place postguard constructs a River client, and what the
// service's HTTP handlers (api) and its wiring (cmd/internal/service) use: transactions that
// insert jobs with River's InsertTx, the jobs, and migrations and schema checks that cover River's
// tables with postguard's.
//
// It is internal because a host app has a River client of its own: it uses db's Tables beside it
// and inserts postguard's jobs with its own InsertTx. Keeping River here is what lets db, its
// engines, the limiter and ginlimit link no River at all.
package riverstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"

	"github.com/postguard/postguard/db"
)

// ErrSchemaBehind is returned by Store.CheckSchema when River's or postguard's migrations have
// not all been applied. The message tells the operator what to run.
var ErrSchemaBehind = errors.New("database schema is behind: run `postguard migrate`")

// Store is one database, either engine, with its River client: what api and jobs use. Build it
// with New.
type Store interface {
	db.Tables

	// InTx runs fn in one transaction, as Transact does, and gives it a Tx that inserts River jobs
	// too (River's InsertTx), so a user and its mail commit or roll back together.
	InTx(ctx context.Context, fn func(ctx context.Context, tx Tx) error) error

	// JobInsert inserts a River job on its own, committed at once.
	JobInsert(ctx context.Context, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error)

	// Jobs is the store's River client. It may be taken before the client exists (inside
	// Config.RiverConfigFunc, for the workers) and used once New has returned.
	Jobs() Jobs

	// Migrate applies River's migrations (rivermigrate: the very ones `river migrate-up`
	// applies, recorded in river_migration) and then those of every part of postguard's tables
	// (goose), holding the engine's migration lock so two deploys cannot race. A database of
	// before revision 3 is upgraded in place (db.MigrateOpts.Revision2Table). Idempotent.
	Migrate(ctx context.Context) error
	// CheckSchema returns an error wrapping ErrSchemaBehind, naming what is behind, while any
	// migration is missing. It only reads.
	CheckSchema(ctx context.Context) error
}

// Tx is a transaction of Store.InTx: the app's statements, and River jobs inserted with River's
// InsertTx, all committed or rolled back together.
type Tx interface {
	db.Queries

	// JobInsert inserts a River job in the transaction.
	JobInsert(ctx context.Context, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error)
}

// Jobs is River's client as postguard's engine-agnostic code uses it: the methods of
// *river.Client[TTx] that do not name TTx. Code that needs River's transaction type (rivertest,
// InsertTx, River UI) uses the client New returns.
type Jobs interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
	StopAndCancel(ctx context.Context) error
	Stopped() <-chan struct{}
	Subscribe(kinds ...river.EventKind) (<-chan *river.Event, func())
	SubscribeConfig(config *river.SubscribeConfig) (<-chan *river.Event, func())
	JobGet(ctx context.Context, id int64) (*rivertype.JobRow, error)
	JobList(ctx context.Context, params *river.JobListParams) (*river.JobListResult, error)
	JobDeleteMany(ctx context.Context, params *river.JobDeleteManyParams) (*river.JobDeleteManyResult, error)
	JobRetry(ctx context.Context, id int64) (*rivertype.JobRow, error)
	JobCancel(ctx context.Context, id int64) (*rivertype.JobRow, error)
}

// Config configures New. Logger may be nil (slog.Default()).
type Config struct {
	// Logger receives the migrations' lines.
	Logger *slog.Logger

	// RiverConfigFunc returns the configuration of the store's River client, given the store
	// itself: River's workers need the store they work for. It runs inside New, before the
	// client exists, so it may hand the store to workers but must not use its jobs. nil is an
	// insert-only client (no workers, queues or periodic jobs).
	RiverConfigFunc func(store Store) (*river.Config, error)
}

// New builds the Store of engine: postguard's tables on it, and River's client on driver, River's
// driver on the engine's own connections (riverpgxv5.New(engine.Pool()),
// riversqlite.New(engine.DB())). It also returns the client, for what needs River's transaction
// type (River UI's endpoints). The Store owns engine: closing it closes the engine, and so does
// New when it fails.
func New[TTx any](engine db.Engine[TTx], driver riverdriver.Driver[TTx], config *Config) (_ Store, _ *river.Client[TTx], err error) {
	defer func() {
		if err != nil {
			engine.Close()
		}
	}()
	if config == nil {
		config = &Config{}
	}
	logger := config.Logger
	if logger == nil {
		logger = slog.Default()
	}
	s := &store[TTx]{
		Tables: db.NewTables(engine, &db.TablesConfig{Logger: logger}),
		engine: engine,
		driver: driver,
		logger: logger,
	}

	riverConfig := &river.Config{}
	if config.RiverConfigFunc != nil {
		if riverConfig, err = config.RiverConfigFunc(s); err != nil {
			return nil, nil, err
		}
	}
	client, err := river.NewClient(driver, riverConfig)
	if err != nil {
		return nil, nil, fmt.Errorf("error creating River client: %w", err)
	}
	s.client = client
	return s, client, nil
}

// store is the Store on an Engine[TTx]: its Tables and River's client.
type store[TTx any] struct {
	db.Tables

	engine db.Engine[TTx]
	driver riverdriver.Driver[TTx]
	logger *slog.Logger
	client *river.Client[TTx]
}

// InTx implements Store, with db.TransactTx's rule for running again.
func (s *store[TTx]) InTx(ctx context.Context, fn func(ctx context.Context, tx Tx) error) error {
	return db.TransactTx(ctx, s.engine, s.logger, func(ctx context.Context, tx TTx, q db.Queries) error {
		return fn(ctx, &storeTx[TTx]{Queries: q, store: s, tx: tx})
	})
}

// JobInsert implements Store. It runs again only when the first try sent nothing: an insert
// whose answer was lost may have committed.
func (s *store[TTx]) JobInsert(ctx context.Context, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	res, err := s.client.Insert(ctx, args, opts)
	if err != nil {
		if retryCtx, ok := s.engine.MayRetry(ctx, err, false); ok {
			res, err = s.client.Insert(retryCtx, args, opts)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("error inserting %s job: %w", args.Kind(), s.engine.InterpretError(err))
	}
	return res, nil
}

// Jobs implements Store: the client, through a handle that may be taken before it exists.
func (s *store[TTx]) Jobs() Jobs { return riverJobs[TTx]{s} }

// migrateOpts are the server's: every part, from a database of before revision 3 too.
func migrateOpts() *db.MigrateOpts {
	return &db.MigrateOpts{Parts: db.Parts(), Revision2Table: db.Revision2GooseTable}
}

// Migrate implements Store.
func (s *store[TTx]) Migrate(ctx context.Context) error {
	opts := migrateOpts()
	opts.BeforeFunc = func(ctx context.Context) error {
		migrator, err := s.riverMigrator()
		if err != nil {
			return err
		}
		if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
			return fmt.Errorf("error applying River's migrations: %w", err)
		}
		return nil
	}
	return s.MigrateTables(ctx, opts)
}

// CheckSchema implements Store.
func (s *store[TTx]) CheckSchema(ctx context.Context) error {
	migrator, err := s.riverMigrator()
	if err != nil {
		return err
	}
	existing, err := migrator.ExistingVersions(ctx)
	if err != nil {
		return fmt.Errorf("error reading River's migrations: %w", s.engine.InterpretError(err))
	}

	var behind []string
	if missing := missingVersions(migrator.AllVersions(), existing); len(missing) > 0 {
		behind = append(behind, fmt.Sprintf("River's migrations %v are not applied", missing))
	}
	tablesBehind, err := s.MigrationsBehind(ctx, migrateOpts())
	if err != nil {
		return err
	}
	behind = append(behind, tablesBehind...)

	if len(behind) > 0 {
		return fmt.Errorf("%w (%s)", ErrSchemaBehind, strings.Join(behind, "; "))
	}
	return nil
}

func (s *store[TTx]) riverMigrator() (*rivermigrate.Migrator[TTx], error) {
	migrator, err := rivermigrate.New(s.driver, &rivermigrate.Config{Logger: s.logger})
	if err != nil {
		return nil, fmt.Errorf("error creating River migrator: %w", err)
	}
	return migrator, nil
}

// storeTx is the Tx of Store.InTx.
type storeTx[TTx any] struct {
	db.Queries

	store *store[TTx]
	tx    TTx
}

// JobInsert implements Tx.
func (t *storeTx[TTx]) JobInsert(ctx context.Context, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	res, err := t.store.client.InsertTx(ctx, t.tx, args, opts)
	if err != nil {
		return nil, fmt.Errorf("error inserting %s job: %w", args.Kind(), t.store.engine.InterpretError(err))
	}
	return res, nil
}

// missingVersions lists the versions of all that are not in existing.
func missingVersions(all, existing []rivermigrate.Migration) []int {
	var missing []int
	for _, migration := range all {
		if !slices.ContainsFunc(existing, func(m rivermigrate.Migration) bool { return m.Version == migration.Version }) {
			missing = append(missing, migration.Version)
		}
	}
	return missing
}

// riverJobs is a Store's River client as Jobs, resolved at each call: the workers take it inside
// RiverConfigFunc, before New has built the client.
type riverJobs[TTx any] struct{ s *store[TTx] }

func (j riverJobs[TTx]) Start(ctx context.Context) error { return j.s.client.Start(ctx) }
func (j riverJobs[TTx]) Stop(ctx context.Context) error  { return j.s.client.Stop(ctx) }
func (j riverJobs[TTx]) StopAndCancel(ctx context.Context) error {
	return j.s.client.StopAndCancel(ctx)
}
func (j riverJobs[TTx]) Stopped() <-chan struct{} { return j.s.client.Stopped() }
func (j riverJobs[TTx]) Subscribe(kinds ...river.EventKind) (<-chan *river.Event, func()) {
	return j.s.client.Subscribe(kinds...)
}

func (j riverJobs[TTx]) SubscribeConfig(config *river.SubscribeConfig) (<-chan *river.Event, func()) {
	return j.s.client.SubscribeConfig(config)
}

func (j riverJobs[TTx]) JobGet(ctx context.Context, id int64) (*rivertype.JobRow, error) {
	return j.s.client.JobGet(ctx, id)
}

func (j riverJobs[TTx]) JobList(ctx context.Context, params *river.JobListParams) (*river.JobListResult, error) {
	return j.s.client.JobList(ctx, params)
}

func (j riverJobs[TTx]) JobDeleteMany(ctx context.Context, params *river.JobDeleteManyParams) (*river.JobDeleteManyResult, error) {
	return j.s.client.JobDeleteMany(ctx, params)
}

func (j riverJobs[TTx]) JobRetry(ctx context.Context, id int64) (*rivertype.JobRow, error) {
	return j.s.client.JobRetry(ctx, id)
}

func (j riverJobs[TTx]) JobCancel(ctx context.Context, id int64) (*rivertype.JobRow, error) {
	return j.s.client.JobCancel(ctx, id)
}
