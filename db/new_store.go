package db

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

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
	s := &store[TTx]{tables: newTables(engine, &TablesConfig{Logger: config.Logger})}

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

// store is the Store on an Engine[TTx]: its Tables and River's client.
type store[TTx any] struct {
	*tables[TTx]

	client *river.Client[TTx]
}

// InTx implements Store, with Transact's rule for running again.
func (s *store[TTx]) InTx(ctx context.Context, fn func(ctx context.Context, tx Tx) error) error {
	return s.inTx(ctx, func(ctx context.Context, tx TTx, q Queries) error {
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
	return s.gooseUp(ctx)
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
