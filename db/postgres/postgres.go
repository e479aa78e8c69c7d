// Package postgres is the Postgres store: the app's sqlc queries over a pgx pool, River's
// riverpgxv5 driver on the same pool, and the schema migrations of both.
package postgres

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
	"riverqueue.com/riverui"
	"riverqueue.com/riverui/uiendpoints"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/postgres/dbsqlc"
)

// RateLimitMaxConnsDefault is the size of the rate-limit pool when Config.RateLimitMaxConns is
// zero. Each check is one short statement, so a few connections serve many requests.
const RateLimitMaxConnsDefault = 4

// Config configures a Store. The zero value (or nil) is fine.
type Config struct {
	// Logger receives migration logs. Defaults to slog.Default().
	Logger *slog.Logger

	// MaxConns caps the main pool. Defaults to pgxpool's default (pool_max_conns in the URL, or
	// the larger of 4 and the number of CPUs).
	MaxConns int32

	// RateLimitMaxConns caps the second pool, the one whose connections run with
	// synchronous_commit off for RateLimitCounterConsume. Defaults to RateLimitMaxConnsDefault.
	RateLimitMaxConns int32

	// ConnectTimeout bounds each new connection when the URL sets no connect_timeout. Defaults
	// to ConnectTimeoutDefault.
	ConnectTimeout time.Duration
}

// Store is the Postgres db.Store.
type Store struct {
	executor // the app's queries on the main pool, each statement committing alone

	client *river.Client[pgx.Tx]
	logger *slog.Logger
	pool   *pgxpool.Pool

	// rateLimitPool's connections carry synchronous_commit=off as a runtime parameter: a
	// counter's commit does not wait for its WAL flush. A crash may forget the last instant of
	// counts, nothing else; users, tokens and jobs never go through this pool.
	rateLimitPool *pgxpool.Pool
}

var _ db.Store = (*Store)(nil)

// New opens a Store on databaseURL (a postgres:// URL or a key=value DSN). Its tables are those
// the connection's search_path finds first, so a schema is chosen in the URL, e.g.
// `options=-c%20search_path%3Dmyschema`. New does not migrate; see Migrate and CheckSchema.
// Connections are made lazily, so New succeeds while the database is down. Each connection
// attempt gives up after connect_timeout from the URL, else Config.ConnectTimeout; see the retry
// rule (retry.go) for which failed calls run again.
func New(ctx context.Context, databaseURL string, config *Config) (*Store, error) {
	if config == nil {
		config = &Config{}
	}

	poolConfig, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("error parsing database URL: %w", err)
	}
	if config.MaxConns > 0 {
		poolConfig.MaxConns = config.MaxConns
	}
	if poolConfig.ConnConfig.ConnectTimeout == 0 {
		// What pgconn does for connect_timeout: the whole attempt (dial, TLS, start-up) shares it.
		poolConfig.ConnConfig.ConnectTimeout = cmp.Or(config.ConnectTimeout, ConnectTimeoutDefault)
	}
	poolConfig.PrepareConn = checkConn

	rateLimitPoolConfig := poolConfig.Copy()
	rateLimitPoolConfig.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	rateLimitPoolConfig.MaxConns = cmp.Or(config.RateLimitMaxConns, RateLimitMaxConnsDefault)
	rateLimitPoolConfig.MinConns = min(rateLimitPoolConfig.MinConns, rateLimitPoolConfig.MaxConns)

	pool, err := pgxpool.NewWithConfig(ctx, poolConfig)
	if err != nil {
		return nil, fmt.Errorf("error creating pool: %w", err)
	}

	rateLimitPool, err := pgxpool.NewWithConfig(ctx, rateLimitPoolConfig)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("error creating rate limit pool: %w", err)
	}

	store := &Store{
		logger:        cmp.Or(config.Logger, slog.Default()),
		pool:          pool,
		rateLimitPool: rateLimitPool,
	}
	store.executor = executor{dbtx: pool, store: store}
	return store, nil
}

// CheckSchema returns an error wrapping db.ErrSchemaBehind, naming what is behind, while any of
// River's or the app's migrations is not applied. It only reads.
func (s *Store) CheckSchema(ctx context.Context) error {
	migrator, err := s.riverMigrator()
	if err != nil {
		return err
	}

	existing, err := migrator.ExistingVersions(ctx)
	if err != nil {
		return fmt.Errorf("error reading River's migrations: %w", interpretError(err))
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
		return fmt.Errorf("%w (%s)", db.ErrSchemaBehind, strings.Join(behind, "; "))
	}
	return nil
}

// Client is the store's River client; nil before ConfigureRiver.
func (s *Store) Client() *river.Client[pgx.Tx] { return s.client }

// Close closes both pools. It does not stop River: stop the client first.
func (s *Store) Close() error {
	s.pool.Close()
	s.rateLimitPool.Close()
	return nil
}

// ConfigureRiver creates the store's River client on the main pool. Call it once, before anything
// inserts jobs.
func (s *Store) ConfigureRiver(config *river.Config) error {
	if s.client != nil {
		return errors.New("River is already configured")
	}

	client, err := river.NewClient(riverpgxv5.New(s.pool), config)
	if err != nil {
		return fmt.Errorf("error creating River client: %w", err)
	}

	s.client = client
	return nil
}

// EmailTokenDeleteExpired deletes up to limit tokens that expired before before.
func (s *Store) EmailTokenDeleteExpired(ctx context.Context, before time.Time, limit int) (int64, error) {
	deleted, err := retryOnce(ctx, false, func() (int64, error) {
		return dbsqlc.New().EmailTokenDeleteExpired(ctx, s.pool, dbsqlc.EmailTokenDeleteExpiredParams{
			Before: before,
			Max:    int64(limit),
		})
	})
	if err != nil {
		return 0, fmt.Errorf("error deleting expired email tokens: %w", interpretError(err))
	}
	return deleted, nil
}

// Engine is "postgres".
func (s *Store) Engine() string { return "postgres" }

// InTx runs fn in one transaction, committed when fn returns nil and rolled back otherwise (or
// when fn panics). Jobs fn inserts with JobInsert commit or roll back with it. A transaction
// whose connection was lost before COMMIT was sent runs again, once, on another connection (the
// retry rule in retry.go): fn must have no effect outside the transaction.
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context, tx db.Queries) error) error {
	committing, err := s.tryTx(ctx, fn)
	if err != nil && !committing && mayRetry(ctx, err, true) {
		s.logger.InfoContext(ctx, "transaction lost its connection before COMMIT; running it again", slog.String("error", err.Error()))
		_, err = s.tryTx(ctx, fn)
	}
	return err
}

// tryTx runs fn in one transaction. committing says COMMIT was sent: a failure then may have
// committed, and must not be retried.
func (s *Store) tryTx(ctx context.Context, fn func(ctx context.Context, tx db.Queries) error) (committing bool, err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("error beginning transaction: %w", interpretError(err))
	}
	defer func() {
		// A no-op after Commit. On failure pgx closes the connection, so it is not reused.
		_ = tx.Rollback(ctx)
	}()

	if err := fn(ctx, &executor{dbtx: tx, store: s, tx: tx}); err != nil {
		return false, err
	}

	if err := tx.Commit(ctx); err != nil {
		return !pgconn.SafeToRetry(err), fmt.Errorf("error committing transaction: %w", interpretError(err))
	}
	return true, nil
}

// Migrate applies River's migrations, exactly those `river migrate-up` applies and recorded in
// the same river_migration table, and then the app's through goose. It holds a session-level
// advisory lock on a connection of its own meanwhile, so two deploys cannot race. Idempotent.
func (s *Store) Migrate(ctx context.Context) error {
	// A connection outside the pool: holding the lock never starves River or goose of theirs.
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("error connecting to take the migration lock: %w", interpretError(err))
	}
	// Ending the session releases the lock too, should the unlock below fail.
	defer conn.Close(context.WithoutCancel(ctx))

	if err := dbsqlc.New().MigrationLock(ctx, conn); err != nil {
		return fmt.Errorf("error taking the migration lock: %w", interpretError(err))
	}
	defer func() {
		if err := dbsqlc.New().MigrationUnlock(context.WithoutCancel(ctx), conn); err != nil {
			s.logger.WarnContext(ctx, "error releasing the migration lock", slog.String("error", err.Error()))
		}
	}()

	migrator, err := s.riverMigrator()
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("error applying River's migrations: %w", interpretError(err))
	}

	provider, sqlDB, err := s.gooseProvider()
	if err != nil {
		return err
	}
	defer sqlDB.Close()

	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("error applying the app's migrations: %w", interpretError(err))
	}
	return nil
}

// Now is the database's clock (clock_timestamp()), the one SendPacerReserve schedules on.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	nowUS, err := retryOnce(ctx, true, func() (int64, error) {
		return dbsqlc.New().SendPacerNow(ctx, s.pool)
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("error reading the database's clock: %w", interpretError(err))
	}
	return time.UnixMicro(nowUS).UTC(), nil
}

// Ping checks the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if _, err := retryOnce(ctx, true, func() (struct{}, error) { return struct{}{}, s.pool.Ping(ctx) }); err != nil {
		return fmt.Errorf("error pinging database: %w", interpretError(err))
	}
	return nil
}

// Ready checks the database answers and takes a write: it updates the one-row heartbeat on the
// main pool, the pool users, tokens and jobs are written through. A read-only server (25006: a
// demoted primary, a standby, default_transaction_read_only) fails it, as does one that cannot
// commit in time (a synchronous standby gone).
func (s *Store) Ready(ctx context.Context) error {
	_, err := retryOnce(ctx, true, func() (struct{}, error) {
		return struct{}{}, dbsqlc.New().ReadinessHeartbeatUpsert(ctx, s.pool)
	})
	if err != nil {
		return fmt.Errorf("error writing the readiness heartbeat: %w", interpretError(err))
	}
	return nil
}

// Pool is the store's main pool (River's too).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// RateLimitCounterConsume spends one request of a window in one statement on the rate-limit pool
// (synchronous_commit off), outside any other transaction. When the window is at its limit, ok is
// false, nothing is counted, and count is the limit.
func (s *Store) RateLimitCounterConsume(ctx context.Context, params *db.RateLimitCounterConsumeParams) (int64, bool, error) {
	// Not idempotent: a retry after a lost answer would count the request twice.
	count, err := retryOnce(ctx, false, func() (int64, error) {
		return dbsqlc.New().RateLimitCounterConsume(ctx, s.rateLimitPool, dbsqlc.RateLimitCounterConsumeParams{
			KeyHash:     params.KeyHash,
			LimitCount:  params.Limit,
			WindowEnd:   params.WindowEnd,
			WindowStart: params.WindowStart,
		})
	})
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return params.Limit, false, nil
		}
		return 0, false, fmt.Errorf("error consuming rate limit counter: %w", interpretError(err))
	}
	return count, true, nil
}

// RateLimitCounterGet reads a window's count on the rate-limit pool, with the checks that spend
// it; 0 when the window has counted nothing yet.
func (s *Store) RateLimitCounterGet(ctx context.Context, params *db.RateLimitCounterGetParams) (int64, error) {
	count, err := retryOnce(ctx, true, func() (int64, error) {
		return dbsqlc.New().RateLimitCounterGet(ctx, s.rateLimitPool, dbsqlc.RateLimitCounterGetParams{
			KeyHash:     params.KeyHash,
			WindowStart: params.WindowStart,
		})
	})
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, nil
		}
		return 0, fmt.Errorf("error reading rate limit counter: %w", interpretError(err))
	}
	return count, nil
}

// RateLimitCounterDeleteExpired deletes up to limit counters whose window ended before before.
func (s *Store) RateLimitCounterDeleteExpired(ctx context.Context, before time.Time, limit int) (int64, error) {
	deleted, err := retryOnce(ctx, false, func() (int64, error) {
		return dbsqlc.New().RateLimitCounterDeleteExpired(ctx, s.pool, dbsqlc.RateLimitCounterDeleteExpiredParams{
			Before: before,
			Max:    int64(limit),
		})
	})
	if err != nil {
		return 0, fmt.Errorf("error deleting expired rate limit counters: %w", interpretError(err))
	}
	return deleted, nil
}

// River is the store's River client as a db.JobClient; nil before ConfigureRiver.
func (s *Store) River() db.JobClient {
	if s.client == nil {
		return nil
	}
	return s.client
}

// RiverUIEndpoints is the River UI API bundle for the store's River client; nil before
// ConfigureRiver.
func (s *Store) RiverUIEndpoints() uiendpoints.Bundle {
	if s.client == nil {
		return nil
	}
	return riverui.NewEndpoints(s.client, nil)
}

// SendPacerReserve takes the next send slot of the named budget, one interval after the previous
// slot and never before the database's now (clock_timestamp()), in one statement shared by every
// process, and returns the slot and that now.
func (s *Store) SendPacerReserve(ctx context.Context, name string, interval time.Duration) (time.Time, time.Time, error) {
	if interval <= 0 {
		return time.Time{}, time.Time{}, fmt.Errorf("send pacer interval must be positive, got %s", interval)
	}

	intervalUS := interval.Microseconds()
	// Not idempotent: a retry after a lost answer would take a second slot.
	row, err := retryOnce(ctx, false, func() (*dbsqlc.SendPacerReserveRow, error) {
		return dbsqlc.New().SendPacerReserve(ctx, s.pool, dbsqlc.SendPacerReserveParams{
			IntervalUs: intervalUS,
			Name:       name,
		})
	})
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("error reserving send slot: %w", interpretError(err))
	}
	return time.UnixMicro(row.TatUs - intervalUS).UTC(), time.UnixMicro(row.NowUs).UTC(), nil
}

// gooseBehind says how far behind the app's migrations are, or "" when all are applied. Unlike
// goose's own checks, it does not create goose's version table when there is none.
func (s *Store) gooseBehind(ctx context.Context) (string, error) {
	provider, sqlDB, err := s.gooseProvider()
	if err != nil {
		return "", err
	}
	defer sqlDB.Close()

	// The table check goose itself runs, on the same search_path.
	versionStore, err := database.NewStore(goose.DialectPostgres, goose.DefaultTablename)
	if err != nil {
		return "", fmt.Errorf("error creating goose store: %w", err)
	}
	exists, err := versionStore.(database.StoreExtender).TableExists(ctx, sqlDB)
	if err != nil {
		return "", fmt.Errorf("error checking goose's version table: %w", interpretError(err))
	}
	if !exists {
		return "the app's migrations are not applied", nil
	}

	pending, err := provider.HasPending(ctx)
	if err != nil {
		return "", fmt.Errorf("error checking the app's migrations: %w", interpretError(err))
	}
	if !pending {
		return "", nil
	}

	current, target, err := provider.GetVersions(ctx)
	if err != nil {
		return "", fmt.Errorf("error reading the app's migration version: %w", interpretError(err))
	}
	return fmt.Sprintf("the app's schema is at version %d of %d", current, target), nil
}

// gooseProvider is goose with the app's Postgres migrations, over a *sql.DB on the main pool
// (closing it leaves the pool open; close it when done). Goose's version table lands in the
// connection's current schema.
func (s *Store) gooseProvider() (*goose.Provider, *sql.DB, error) {
	migrations, err := fs.Sub(db.Migrations, "migrations/postgres")
	if err != nil {
		return nil, nil, fmt.Errorf("error opening migrations: %w", err)
	}

	sqlDB := stdlib.OpenDBFromPool(s.pool)

	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations,
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(s.logger),
	)
	if err != nil {
		sqlDB.Close()
		return nil, nil, fmt.Errorf("error creating goose provider: %w", err)
	}
	return provider, sqlDB, nil
}

func (s *Store) riverMigrator() (*rivermigrate.Migrator[pgx.Tx], error) {
	migrator, err := rivermigrate.New(riverpgxv5.New(s.pool), &rivermigrate.Config{Logger: s.logger})
	if err != nil {
		return nil, fmt.Errorf("error creating River migrator: %w", err)
	}
	return migrator, nil
}

// executor runs the app's queries on dbtx: the main pool for the Store itself, a transaction
// inside InTx (then tx is set, so that JobInsert inserts through it).
type executor struct {
	dbtx  dbsqlc.DBTX
	store *Store
	tx    pgx.Tx
}

// run runs one statement of e: on the pool under retryOnce's rule (idempotent as it says), in a
// transaction once (InTx decides about running the whole transaction again).
func run[T any](ctx context.Context, e *executor, idempotent bool, op func() (T, error)) (T, error) {
	if e.tx != nil {
		return op()
	}
	return retryOnce(ctx, idempotent, op)
}

// EmailTokenConsume implements db.Queries.EmailTokenConsume.
func (e *executor) EmailTokenConsume(ctx context.Context, tokenHash []byte, purpose db.TokenPurpose, now time.Time) (int64, error) {
	userID, err := run(ctx, e, false, func() (int64, error) {
		return dbsqlc.New().EmailTokenConsume(ctx, e.dbtx, dbsqlc.EmailTokenConsumeParams{
			Now:       now,
			Purpose:   string(purpose),
			TokenHash: tokenHash,
		})
	})
	if err != nil {
		return 0, fmt.Errorf("error consuming email token: %w", interpretError(err))
	}
	return userID, nil
}

// EmailTokenInsert implements db.Queries.EmailTokenInsert.
func (e *executor) EmailTokenInsert(ctx context.Context, params *db.EmailTokenInsertParams) error {
	// Not idempotent (job_id is unique): retried only when nothing was sent.
	_, err := run(ctx, e, false, func() (struct{}, error) {
		return struct{}{}, dbsqlc.New().EmailTokenInsert(ctx, e.dbtx, dbsqlc.EmailTokenInsertParams{
			ExpiresAt: params.ExpiresAt,
			JobID:     params.JobID,
			Now:       params.Now,
			Purpose:   string(params.Purpose),
			Sealed:    params.Sealed,
			TokenHash: params.TokenHash,
			UserID:    params.UserID,
		})
	})
	if err != nil {
		return fmt.Errorf("error inserting email token: %w", interpretError(err))
	}
	return nil
}

// EmailTokenLookup implements db.Queries.EmailTokenLookup.
func (e *executor) EmailTokenLookup(ctx context.Context, tokenHash []byte, purpose db.TokenPurpose, now time.Time) (int64, error) {
	userID, err := run(ctx, e, true, func() (int64, error) {
		return dbsqlc.New().EmailTokenLookup(ctx, e.dbtx, dbsqlc.EmailTokenLookupParams{
			Now:       now,
			Purpose:   string(purpose),
			TokenHash: tokenHash,
		})
	})
	if err != nil {
		return 0, fmt.Errorf("error looking up email token: %w", interpretError(err))
	}
	return userID, nil
}

// EmailTokenInvalidateUser implements db.Queries.EmailTokenInvalidateUser.
func (e *executor) EmailTokenInvalidateUser(ctx context.Context, userID int64, purpose db.TokenPurpose, now time.Time) error {
	_, err := run(ctx, e, false, func() (int64, error) {
		return dbsqlc.New().EmailTokenInvalidateUser(ctx, e.dbtx, dbsqlc.EmailTokenInvalidateUserParams{
			Now:     now,
			Purpose: string(purpose),
			UserID:  userID,
		})
	})
	if err != nil {
		return fmt.Errorf("error invalidating email tokens: %w", interpretError(err))
	}
	return nil
}

// JobInsert implements db.Queries.JobInsert.
func (e *executor) JobInsert(ctx context.Context, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	client := e.store.client
	if client == nil {
		return nil, errors.New("error inserting job: River is not configured (call ConfigureRiver first)")
	}

	res, err := run(ctx, e, false, func() (*rivertype.JobInsertResult, error) {
		if e.tx != nil {
			return client.InsertTx(ctx, e.tx, args, opts)
		}
		return client.Insert(ctx, args, opts)
	})
	if err != nil {
		return nil, fmt.Errorf("error inserting %s job: %w", args.Kind(), interpretError(err))
	}
	return res, nil
}

// UserGetByEmail implements db.Queries.UserGetByEmail.
func (e *executor) UserGetByEmail(ctx context.Context, email string) (*db.User, error) {
	user, err := run(ctx, e, true, func() (*dbsqlc.User, error) {
		return dbsqlc.New().UserGetByEmail(ctx, e.dbtx, email)
	})
	if err != nil {
		return nil, fmt.Errorf("error getting user by email: %w", interpretError(err))
	}
	return userFromRow(user), nil
}

// UserGetByID implements db.Queries.UserGetByID.
func (e *executor) UserGetByID(ctx context.Context, id int64) (*db.User, error) {
	user, err := run(ctx, e, true, func() (*dbsqlc.User, error) {
		return dbsqlc.New().UserGetByID(ctx, e.dbtx, id)
	})
	if err != nil {
		return nil, fmt.Errorf("error getting user by id: %w", interpretError(err))
	}
	return userFromRow(user), nil
}

// UserInsert implements db.Queries.UserInsert.
func (e *executor) UserInsert(ctx context.Context, params *db.UserInsertParams) (*db.User, error) {
	user, err := run(ctx, e, false, func() (*dbsqlc.User, error) {
		return dbsqlc.New().UserInsert(ctx, e.dbtx, dbsqlc.UserInsertParams{
			Email:        params.Email,
			Name:         params.Name,
			Now:          params.Now,
			PasswordHash: params.PasswordHash,
		})
	})
	if err != nil {
		// ON CONFLICT DO NOTHING: no row back means the email is taken, and a transaction around
		// the insert stays usable.
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, db.ErrEmailTaken
		}
		return nil, fmt.Errorf("error inserting user: %w", interpretError(err))
	}
	return userFromRow(user), nil
}

// UserMarkEmailVerified implements db.Queries.UserMarkEmailVerified.
func (e *executor) UserMarkEmailVerified(ctx context.Context, id int64, now time.Time) error {
	updated, err := run(ctx, e, false, func() (int64, error) {
		return dbsqlc.New().UserMarkEmailVerified(ctx, e.dbtx, dbsqlc.UserMarkEmailVerifiedParams{
			ID:  id,
			Now: now,
		})
	})
	return requireUpdated("marking email verified", updated, err)
}

// UserSetPassword implements db.Queries.UserSetPassword.
func (e *executor) UserSetPassword(ctx context.Context, id int64, passwordHash string, now time.Time) error {
	updated, err := run(ctx, e, false, func() (int64, error) {
		return dbsqlc.New().UserSetPassword(ctx, e.dbtx, dbsqlc.UserSetPasswordParams{
			ID:           id,
			Now:          now,
			PasswordHash: passwordHash,
		})
	})
	return requireUpdated("setting password", updated, err)
}

// UserUnsubscribe implements db.Queries.UserUnsubscribe.
func (e *executor) UserUnsubscribe(ctx context.Context, id int64, now time.Time) error {
	updated, err := run(ctx, e, false, func() (int64, error) {
		return dbsqlc.New().UserUnsubscribe(ctx, e.dbtx, dbsqlc.UserUnsubscribeParams{
			ID:  id,
			Now: now,
		})
	})
	return requireUpdated("unsubscribing user", updated, err)
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

// requireUpdated wraps an update's error, and reports db.ErrNotFound when it touched no row.
func requireUpdated(doing string, updated int64, err error) error {
	if err != nil {
		return fmt.Errorf("error %s: %w", doing, interpretError(err))
	}
	if updated == 0 {
		return fmt.Errorf("error %s: %w", doing, db.ErrNotFound)
	}
	return nil
}

func timePtrUTC(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	utc := t.UTC()
	return &utc
}

func userFromRow(user *dbsqlc.User) *db.User {
	return &db.User{
		ID:              user.ID,
		CreatedAt:       user.CreatedAt.UTC(),
		Email:           user.Email,
		EmailVerifiedAt: timePtrUTC(user.EmailVerifiedAt),
		Name:            user.Name,
		PasswordHash:    user.PasswordHash,
		UnsubscribedAt:  timePtrUTC(user.UnsubscribedAt),
		UpdatedAt:       user.UpdatedAt.UTC(),
	}
}
