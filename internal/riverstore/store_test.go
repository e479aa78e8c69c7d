package riverstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
)

// The store's River half, on both engines through dbtest.Engines: jobs inserted in the app's
// transactions, River's client, and migrations and checks covering River's tables with the app's.

type testJobArgs struct {
	UserID int64 `json:"user_id"`
}

func (testJobArgs) Kind() string { return "store_test" }

// now is a fixed instant at the engines' precision (microseconds).
var now = time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.UTC)

func userInsert(ctx context.Context, t *testing.T, queries db.Queries, email string) *db.User {
	t.Helper()

	user, err := queries.UserInsert(ctx, &db.UserInsertParams{
		Email:        email,
		Name:         "Ada",
		Now:          now,
		PasswordHash: "hash",
	})
	require.NoError(t, err)
	return user
}

func TestStore_InTx(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		setup := func(t *testing.T) (riverstore.Store, context.Context) {
			t.Helper()

			return newStore(t), t.Context()
		}

		t.Run("Commit", func(t *testing.T) {
			t.Parallel()

			store, ctx := setup(t)

			var user *db.User
			require.NoError(t, store.InTx(ctx, func(ctx context.Context, tx riverstore.Tx) error {
				user = userInsert(ctx, t, tx, "ada@example.com")
				_, err := tx.JobInsert(ctx, testJobArgs{UserID: user.ID}, nil)
				return err
			}))

			got, err := store.UserGetByEmail(ctx, "ada@example.com")
			require.NoError(t, err)
			require.Equal(t, user.ID, got.ID)

			jobs, err := store.Jobs().JobList(ctx, river.NewJobListParams())
			require.NoError(t, err)
			require.Len(t, jobs.Jobs, 1)
			require.Equal(t, "store_test", jobs.Jobs[0].Kind)
			require.JSONEq(t, fmt.Sprintf(`{"user_id": %d}`, user.ID), string(jobs.Jobs[0].EncodedArgs))
		})

		t.Run("Rollback", func(t *testing.T) {
			t.Parallel()

			store, ctx := setup(t)

			errBoom := errors.New("boom")
			err := store.InTx(ctx, func(ctx context.Context, tx riverstore.Tx) error {
				user := userInsert(ctx, t, tx, "ada@example.com")
				if _, err := tx.JobInsert(ctx, testJobArgs{UserID: user.ID}, nil); err != nil {
					return err
				}
				return errBoom
			})
			require.ErrorIs(t, err, errBoom)

			_, err = store.UserGetByEmail(ctx, "ada@example.com")
			require.ErrorIs(t, err, db.ErrNotFound)

			jobs, err := store.Jobs().JobList(ctx, river.NewJobListParams())
			require.NoError(t, err)
			require.Empty(t, jobs.Jobs)
		})
	})
}

func TestStore_JobInsert(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		t.Run("Work", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t, dbtest.WithRiverConfig(func(riverstore.Store) (*river.Config, error) {
				workers := river.NewWorkers()
				river.AddWorker(workers, river.WorkFunc(func(ctx context.Context, job *river.Job[testJobArgs]) error {
					return nil
				}))
				return &river.Config{
					FetchCooldown:     10 * time.Millisecond,
					FetchPollInterval: 50 * time.Millisecond,
					Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1}},
					Workers:           workers,
				}, nil
			}))

			completed, cancel := store.Jobs().Subscribe(river.EventKindJobCompleted)
			t.Cleanup(cancel)

			require.NoError(t, store.Jobs().Start(ctx))
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				require.NoError(t, store.Jobs().Stop(ctx))
			})

			// Inserted in a transaction that commits, then worked.
			var jobID int64
			require.NoError(t, store.InTx(ctx, func(ctx context.Context, tx riverstore.Tx) error {
				res, err := tx.JobInsert(ctx, testJobArgs{UserID: 1}, nil)
				if err == nil {
					jobID = res.Job.ID
				}
				return err
			}))

			select {
			case event := <-completed:
				require.Equal(t, jobID, event.Job.ID)
			case <-time.After(10 * time.Second):
				require.FailNow(t, "job not worked")
			}
		})

		t.Run("Insert", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)

			res, err := store.JobInsert(ctx, testJobArgs{UserID: 7}, &river.InsertOpts{Queue: "email"})
			require.NoError(t, err)

			job, err := store.Jobs().JobGet(ctx, res.Job.ID)
			require.NoError(t, err)
			require.Equal(t, "store_test", job.Kind)
			require.Equal(t, "email", job.Queue)
		})
	})
}

func TestStore_CheckSchema(t *testing.T) {
	t.Parallel()

	dbtest.EnginesUnmigrated(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		ctx := t.Context()
		store := newStore(t)

		// River's schema only, as after `river migrate-up`.
		dbtest.RiverMigrate(t, store, rivermigrate.DirectionUp, nil)
		err := store.CheckSchema(ctx)
		require.ErrorIs(t, err, riverstore.ErrSchemaBehind)
		for _, part := range db.Parts() {
			require.ErrorContains(t, err, fmt.Sprintf("postguard's %s tables are not migrated", part))
		}
		require.NotContains(t, err.Error(), "River")

		// Both, then River one step down.
		require.NoError(t, store.Migrate(ctx))
		require.NoError(t, store.CheckSchema(ctx))
		res := dbtest.RiverMigrate(t, store, rivermigrate.DirectionDown, nil)
		require.Len(t, res.Versions, 1)

		err = store.CheckSchema(ctx)
		require.ErrorIs(t, err, riverstore.ErrSchemaBehind)
		require.ErrorContains(t, err, "River's migrations [")
		require.NotContains(t, err.Error(), "tables are")
	})
}

func TestStore_Migrate(t *testing.T) {
	t.Parallel()

	t.Run("Migrated", func(t *testing.T) {
		t.Parallel()

		dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
			ctx := t.Context()
			store := newStore(t)

			require.NoError(t, store.CheckSchema(ctx))
			require.NoError(t, store.Ready(ctx))

			// Idempotent.
			require.NoError(t, store.Migrate(ctx))
			require.NoError(t, store.Migrate(ctx))
			require.NoError(t, store.CheckSchema(ctx))
		})
	})

	t.Run("Unmigrated", func(t *testing.T) {
		t.Parallel()

		dbtest.EnginesUnmigrated(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
			ctx := t.Context()
			store := newStore(t)

			err := store.CheckSchema(ctx)
			require.ErrorIs(t, err, riverstore.ErrSchemaBehind)
			require.ErrorContains(t, err, "River's migrations")
			require.ErrorContains(t, err, "postguard's limiter tables are not migrated")

			// CheckSchema only reads: it is still behind.
			require.ErrorIs(t, store.CheckSchema(ctx), riverstore.ErrSchemaBehind)

			require.NoError(t, store.Migrate(ctx))
			require.NoError(t, store.CheckSchema(ctx))
			require.NoError(t, store.Migrate(ctx))

			userInsert(ctx, t, store, "ada@example.com")
		})
	})
}

// A database postguard's server migrated up to revision 2 (River's tables, and postguard's in
// one goose history in goose_db_version) is behind until `postguard migrate` (or serve on
// SQLite) upgrades it in place, its rows kept.
func TestStore_MigrateRevision2(t *testing.T) {
	t.Parallel()

	dbtest.EnginesUnmigrated(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		ctx := t.Context()
		store := newStore(t)
		sqlDB := store.SQLiteOrPostgresDB(t)
		dbtest.RiverMigrate(t, store, rivermigrate.DirectionUp, nil)
		dbtest.MigrateRevision2(t, sqlDB, store.Engine(), 7)
		user := userInsert(ctx, t, store, "ada@example.com")

		err := store.CheckSchema(ctx)
		require.ErrorIs(t, err, riverstore.ErrSchemaBehind)
		require.ErrorContains(t, err, "postguard's tables are as revision 2 migrated them (goose_db_version)")

		require.NoError(t, store.Migrate(ctx))
		require.NoError(t, store.CheckSchema(ctx))
		got, err := store.UserGetByEmail(ctx, "ada@example.com")
		require.NoError(t, err)
		require.Equal(t, user.ID, got.ID)
		userInsert(ctx, t, store, "grace@example.com")
	})
}
