package db

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"strings"

	"github.com/pressly/goose/v3"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
	"riverqueue.com/riverui"
	"riverqueue.com/riverui/uiendpoints"
)

// StoreConfig configures NewStore. Logger may be nil (slog.Default()).
type StoreConfig struct {
	// Logger receives the migrations' lines.
	Logger *slog.Logger

	// RiverConfigFunc returns the configuration of the store's River client, given the store
	// itself: River's workers need the store they work for. It runs inside NewStore, before the
	// client exists, so it may hand the store to workers but must not use its jobs. nil is an
	// insert-only client (no workers, queues or periodic jobs).
	RiverConfigFunc func(store Store) (*river.Config, error)
}

// NewStore builds the Store of engine: River's client on the engine's driver (the one place
// postguard constructs it), transactions that insert jobs through River's InsertTx, migrations
// and schema checks, River UI's endpoints. The Store owns engine: closing it closes the engine,
// and so does NewStore when it fails.
func NewStore[TTx any](engine Engine[TTx], config *StoreConfig) (_ Store, err error) {
	defer func() {
		if err != nil {
			engine.Close()
		}
	}()
	if config == nil {
		config = &StoreConfig{}
	}
	s := &store[TTx]{
		Queries:  engine.Queries(),
		Counters: engine.Counters(),
		engine:   engine,
		logger:   config.Logger,
	}
	if s.logger == nil {
		s.logger = slog.Default()
	}

	riverConfig := &river.Config{}
	if config.RiverConfigFunc != nil {
		var err error
		if riverConfig, err = config.RiverConfigFunc(s); err != nil {
			return nil, err
		}
	}
	client, err := river.NewClient(engine.Driver(), riverConfig)
	if err != nil {
		return nil, fmt.Errorf("error creating River client: %w", err)
	}
	s.client = client
	return s, nil
}

// store is the Store on an Engine[TTx].
type store[TTx any] struct {
	Queries
	Counters

	client *river.Client[TTx]
	engine Engine[TTx]
	logger *slog.Logger
}

// Engine implements Store.
func (s *store[TTx]) Engine() string { return s.engine.Name() }

// InTx implements Store. A transaction whose connection was lost before its COMMIT was sent
// runs again, once, on another connection (Engine.MayRetry): the server rolled it back when its
// session ended. One whose COMMIT was sent and not answered is never run again: it may have
// committed.
func (s *store[TTx]) InTx(ctx context.Context, fn func(ctx context.Context, tx Tx) error) error {
	committing, err := s.tryTx(ctx, fn)
	if err != nil && !committing && s.engine.MayRetry(ctx, err, true) {
		s.logger.InfoContext(ctx, "transaction lost its connection before COMMIT; running it again", slog.String("error", err.Error()))
		_, err = s.tryTx(ctx, fn)
	}
	return err
}

// tryTx runs fn in one transaction. committing says COMMIT was sent: a failure then may have
// committed.
func (s *store[TTx]) tryTx(ctx context.Context, fn func(ctx context.Context, tx Tx) error) (committing bool, err error) {
	tx, err := s.engine.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("error beginning transaction: %w", err)
	}
	defer func() {
		// A no-op after Commit; on a panic or an error, the rollback. Its own failure leaves
		// nothing behind: a transaction whose connection fails is rolled back by the server.
		_ = s.engine.Rollback(context.WithoutCancel(ctx), tx)
	}()

	if err := fn(ctx, &storeTx[TTx]{Queries: s.engine.QueriesTx(tx), store: s, tx: tx}); err != nil {
		return false, err
	}
	if err := s.engine.Commit(ctx, tx); err != nil {
		// A COMMIT that failed before it was sent is safe to run again with its transaction.
		return !s.engine.MayRetry(ctx, err, false), fmt.Errorf("error committing transaction: %w", err)
	}
	return true, nil
}

// JobInsert implements Store. It runs again only when the first try sent nothing: an insert
// whose answer was lost may have committed.
func (s *store[TTx]) JobInsert(ctx context.Context, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	res, err := s.client.Insert(ctx, args, opts)
	if err != nil && s.engine.MayRetry(ctx, err, false) {
		res, err = s.client.Insert(ctx, args, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("error inserting %s job: %w", args.Kind(), s.engine.InterpretError(err))
	}
	return res, nil
}

// Jobs implements Store.
func (s *store[TTx]) Jobs() Jobs { return s.client }

// RiverUIEndpoints implements Store.
func (s *store[TTx]) RiverUIEndpoints() uiendpoints.Bundle {
	return riverui.NewEndpoints(s.client, nil)
}

// Migrate implements Store.
func (s *store[TTx]) Migrate(ctx context.Context) error {
	release, err := s.engine.LockMigrations(ctx)
	if err != nil {
		return fmt.Errorf("error taking the migration lock: %w", err)
	}
	defer release()

	migrator, err := s.riverMigrator()
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("error applying River's migrations: %w", err)
	}

	provider, release, err := s.goose()
	if err != nil {
		return err
	}
	defer release()
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("error applying the app's migrations: %w", err)
	}
	return nil
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
	appBehind, err := s.gooseBehind(ctx)
	if err != nil {
		return err
	}
	if appBehind != "" {
		behind = append(behind, appBehind)
	}

	if len(behind) > 0 {
		return fmt.Errorf("%w (%s)", ErrSchemaBehind, strings.Join(behind, "; "))
	}
	return nil
}

// Ready implements Store.
func (s *store[TTx]) Ready(ctx context.Context) error { return s.engine.Ready(ctx) }

// Close implements Store.
func (s *store[TTx]) Close() error { return s.engine.Close() }

// gooseBehind says how far behind the app's migrations are, or "" when all are applied. Unlike
// goose's own checks, it does not create goose's version table when there is none.
func (s *store[TTx]) gooseBehind(ctx context.Context) (string, error) {
	provider, release, err := s.goose()
	if err != nil {
		return "", err
	}
	defer release()

	sqlDB, _, releaseDB := s.engine.GooseDB()
	defer releaseDB()
	exists, err := s.engine.GooseTableExists(ctx, sqlDB)
	if err != nil {
		return "", fmt.Errorf("error checking goose's version table: %w", err)
	}
	if !exists {
		return "the app's migrations are not applied", nil
	}

	pending, err := provider.HasPending(ctx)
	if err != nil {
		return "", fmt.Errorf("error checking the app's migrations: %w", err)
	}
	if !pending {
		return "", nil
	}
	current, target, err := provider.GetVersions(ctx)
	if err != nil {
		return "", fmt.Errorf("error reading the app's migration version: %w", err)
	}
	return fmt.Sprintf("the app's schema is at version %d of %d", current, target), nil
}

// goose is goose with the engine's migrations, on the engine's connections.
func (s *store[TTx]) goose() (*goose.Provider, func(), error) {
	migrations, err := fs.Sub(Migrations, "migrations/"+s.engine.Name())
	if err != nil {
		return nil, nil, fmt.Errorf("error opening migrations: %w", err)
	}
	sqlDB, dialect, release := s.engine.GooseDB()
	provider, err := goose.NewProvider(dialect, sqlDB, migrations,
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(s.logger),
	)
	if err != nil {
		release()
		return nil, nil, fmt.Errorf("error creating goose provider: %w", err)
	}
	return provider, release, nil
}

func (s *store[TTx]) riverMigrator() (*rivermigrate.Migrator[TTx], error) {
	migrator, err := rivermigrate.New(s.engine.Driver(), &rivermigrate.Config{Logger: s.logger})
	if err != nil {
		return nil, fmt.Errorf("error creating River migrator: %w", err)
	}
	return migrator, nil
}

// storeTx is the Tx of Store.InTx.
type storeTx[TTx any] struct {
	Queries

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
