// Package sqlite is the embedded store: the app's sqlc queries on one SQLite file through
// modernc.org/sqlite (pure Go), River's riversqlite driver on the same *sql.DB, and the schema
// migrations of both. Times are INTEGER unix microseconds in the app's tables.
package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
	"riverqueue.com/riverui"
	"riverqueue.com/riverui/uiendpoints"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/sqlite/dbsqlc"
)

// gooseTableExistsSQL says whether goose's version table exists.
const gooseTableExistsSQL = `SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?)`

// BusyTimeoutDefault is Config.BusyTimeout's default: long enough to wait out another writer's
// transaction (a `postguard migrate`, a backup), shorter than a request's deadline (10 s), so a
// database held by another process is answered as busy (503) rather than as a request that ran
// out of time.
const BusyTimeoutDefault = 5 * time.Second

// readinessRoomBytes is how much Ready asks the database to find room for, in a transaction it
// rolls back: one page of SQLite's default size, more than fits inline in any page, so it needs
// at least one free page (or room to grow the file by one).
const readinessRoomBytes = 4096

// Config configures a Store. The zero value (or nil) is fine.
type Config struct {
	// Logger receives migration logs. Defaults to slog.Default().
	Logger *slog.Logger

	// BusyTimeout is how long a statement waits for another connection's write lock before it
	// fails with SQLITE_BUSY (db.ErrUnavailable). Defaults to BusyTimeoutDefault; at least a
	// millisecond.
	BusyTimeout time.Duration
}

// Store is the SQLite db.Store. It has one *sql.DB with one connection: SQLite takes one writer
// at a time anyway, River's SQLite driver wants it so, and a single connection never meets
// SQLITE_BUSY from itself. The flip side: inside InTx, nothing may use the Store itself (only the
// Queries given to fn), or it waits forever on the connection its own transaction holds.
type Store struct {
	executor // the app's queries on the *sql.DB, each statement committing alone

	client     *river.Client[*sql.Tx]
	db         *sql.DB
	logger     *slog.Logger
	secretPath string
}

var _ db.Store = (*Store)(nil)

// Open opens (creating it if needed) the SQLite database at path, taken verbatim, in WAL mode
// with a busy timeout, foreign keys on, synchronous=NORMAL (durable in WAL mode except for the
// last commits before a power loss) and secure_delete on (deleted rows are zeroed, so a copy of
// the file does not hold what was deleted: used tokens, old counters). The database's files are
// created with mode 0600, and an older database's files are restricted to it. Open does not
// migrate; see Migrate.
func Open(ctx context.Context, path string, config *Config) (*Store, error) {
	if config == nil {
		config = &Config{}
	}
	if path == "" {
		return nil, errors.New("SQLite path is empty")
	}
	// The driver splits a plain file name from its parameters at the first '?'.
	if strings.Contains(path, "?") {
		return nil, fmt.Errorf("SQLite path %q must not contain '?'", path)
	}

	// _txlock=immediate takes the write lock at BEGIN: a transaction never has to upgrade a read
	// lock, which is where SQLite answers SQLITE_BUSY without waiting, should another process
	// (e.g. `postguard migrate`) hold the file.
	busyTimeout := cmp.Or(config.BusyTimeout, BusyTimeoutDefault)
	params := url.Values{
		"_pragma": {
			fmt.Sprintf("busy_timeout(%d)", max(busyTimeout.Milliseconds(), 1)),
			"foreign_keys(1)",
			"journal_mode(WAL)",
			"secure_delete(1)",
			"synchronous(NORMAL)",
		},
		"_txlock": {"immediate"},
	}
	if err := restrictFiles(path); err != nil {
		return nil, err
	}
	sqlDB, err := sql.Open("sqlite", path+"?"+params.Encode())
	if err != nil {
		return nil, fmt.Errorf("error opening SQLite database: %w", err)
	}
	sqlDB.SetMaxOpenConns(1)

	// Open the file now, so that a bad path fails here rather than at first use.
	if err := sqlDB.PingContext(ctx); err != nil {
		sqlDB.Close()
		return nil, fmt.Errorf("error opening SQLite database %q: %w", path, interpretError(err))
	}

	store := &Store{
		db:         sqlDB,
		logger:     cmp.Or(config.Logger, slog.Default()),
		secretPath: SecretPath(path),
	}
	store.executor = executor{dbtx: sqlDB, store: store}
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
func (s *Store) Client() *river.Client[*sql.Tx] { return s.client }

// Close closes the database. It does not stop River: stop the client first.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("error closing SQLite database: %w", err)
	}
	return nil
}

// ConfigureRiver creates the store's River client on the store's *sql.DB. Call it once, before
// anything inserts jobs.
func (s *Store) ConfigureRiver(config *river.Config) error {
	if s.client != nil {
		return errors.New("River is already configured")
	}

	client, err := river.NewClient(riversqlite.New(s.db), config)
	if err != nil {
		return fmt.Errorf("error creating River client: %w", err)
	}

	s.client = client
	return nil
}

// DB is the store's *sql.DB (one connection).
func (s *Store) DB() *sql.DB { return s.db }

// EmailTokenDeleteExpired deletes up to limit tokens that expired before before.
func (s *Store) EmailTokenDeleteExpired(ctx context.Context, before time.Time, limit int) (int64, error) {
	deleted, err := dbsqlc.New().EmailTokenDeleteExpired(ctx, s.db, dbsqlc.EmailTokenDeleteExpiredParams{
		Before: before.UnixMicro(),
		Max:    int64(limit),
	})
	if err != nil {
		return 0, fmt.Errorf("error deleting expired email tokens: %w", interpretError(err))
	}
	return deleted, nil
}

// Engine is "sqlite".
func (s *Store) Engine() string { return "sqlite" }

// InTx runs fn in one transaction, committed when fn returns nil and rolled back otherwise (or
// when fn panics). Jobs fn inserts with JobInsert commit or roll back with it. fn must use only
// the Queries it is given: the transaction holds the store's only connection.
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context, tx db.Queries) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("error beginning transaction: %w", interpretError(err))
	}
	defer func() {
		_ = tx.Rollback() // a no-op after Commit
	}()

	if err := fn(ctx, &executor{dbtx: tx, store: s, tx: tx}); err != nil {
		return err
	}

	if err := tx.Commit(); err != nil {
		return fmt.Errorf("error committing transaction: %w", interpretError(err))
	}
	return nil
}

// Migrate applies River's migrations (rivermigrate, recorded in river_migration) and then the
// app's through goose, after moving a secret that the first version kept in the database out to
// SecretPath (see AppSecret). Within a process the single connection serialises migrations; the
// embedded engine has one process per file. Idempotent.
func (s *Store) Migrate(ctx context.Context) error {
	if err := s.moveLegacySecret(ctx); err != nil {
		return err
	}
	migrator, err := s.riverMigrator()
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("error applying River's migrations: %w", interpretError(err))
	}

	provider, err := s.gooseProvider()
	if err != nil {
		return err
	}
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("error applying the app's migrations: %w", interpretError(err))
	}
	return nil
}

// Now is the database's clock, the one SendPacerReserve schedules on (the process's own: SQLite
// runs in it).
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	nowUS, err := dbsqlc.New().SendPacerNow(ctx, s.db)
	if err != nil {
		return time.Time{}, fmt.Errorf("error reading the database's clock: %w", interpretError(err))
	}
	return timeFromMicros(nowUS), nil
}

// Ready checks the database answers and takes a write, in two transactions. It commits the
// heartbeat row: a database another process holds past the busy timeout, or whose writes fail
// with an I/O error, fails here. Then it asks for readinessRoomBytes more in the same row and
// rolls that back: that needs a free page or room to grow the file, so a full database fails
// here even while the small heartbeat still fits in the pages it has. Each error wraps
// db.ErrUnavailable.
func (s *Store) Ready(ctx context.Context) error {
	if err := dbsqlc.New().ReadinessHeartbeatUpsert(ctx, s.db, time.Now().UnixMicro()); err != nil {
		return fmt.Errorf("error writing the readiness heartbeat: %w", interpretError(err))
	}

	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("error checking the database has room: %w", interpretError(err))
	}
	defer func() {
		_ = tx.Rollback() // always: the room was only asked for
	}()
	if err := dbsqlc.New().ReadinessHeartbeatFillRoom(ctx, tx, readinessRoomBytes); err != nil {
		return fmt.Errorf("error checking the database has room: %w", interpretError(err))
	}
	return nil
}

// Ping checks the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.db.PingContext(ctx); err != nil {
		return fmt.Errorf("error pinging database: %w", interpretError(err))
	}
	return nil
}

// RateLimitCounterConsume spends one request of a window in one statement. When the window is at
// its limit, ok is false, nothing is counted, and count is the limit.
func (s *Store) RateLimitCounterConsume(ctx context.Context, params *db.RateLimitCounterConsumeParams) (int64, bool, error) {
	count, err := dbsqlc.New().RateLimitCounterConsume(ctx, s.db, dbsqlc.RateLimitCounterConsumeParams{
		KeyHash:     params.KeyHash,
		LimitCount:  params.Limit,
		WindowEnd:   params.WindowEnd.UnixMicro(),
		WindowStart: params.WindowStart.UnixMicro(),
	})
	if err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return params.Limit, false, nil
		}
		return 0, false, fmt.Errorf("error consuming rate limit counter: %w", interpretError(err))
	}
	return count, true, nil
}

// RateLimitCounterGet reads a window's count; 0 when the window has counted nothing yet.
func (s *Store) RateLimitCounterGet(ctx context.Context, params *db.RateLimitCounterGetParams) (int64, error) {
	count, err := dbsqlc.New().RateLimitCounterGet(ctx, s.db, dbsqlc.RateLimitCounterGetParams{
		KeyHash:     params.KeyHash,
		WindowStart: params.WindowStart.UnixMicro(),
	})
	if err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return 0, nil
		}
		return 0, fmt.Errorf("error reading rate limit counter: %w", err)
	}
	return count, nil
}

// RateLimitCounterDeleteExpired deletes up to limit counters whose window ended before before.
func (s *Store) RateLimitCounterDeleteExpired(ctx context.Context, before time.Time, limit int) (int64, error) {
	deleted, err := dbsqlc.New().RateLimitCounterDeleteExpired(ctx, s.db, dbsqlc.RateLimitCounterDeleteExpiredParams{
		Before: before.UnixMicro(),
		Max:    int64(limit),
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
// slot and never before the database's now, and returns the slot and that now.
func (s *Store) SendPacerReserve(ctx context.Context, name string, interval time.Duration) (time.Time, time.Time, error) {
	if interval <= 0 {
		return time.Time{}, time.Time{}, fmt.Errorf("send pacer interval must be positive, got %s", interval)
	}

	intervalUS := interval.Microseconds()
	row, err := dbsqlc.New().SendPacerReserve(ctx, s.db, dbsqlc.SendPacerReserveParams{
		IntervalUs: intervalUS,
		Name:       name,
	})
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("error reserving send slot: %w", interpretError(err))
	}
	return timeFromMicros(row.TatUs - intervalUS), timeFromMicros(row.Column2), nil
}

// gooseBehind says how far behind the app's migrations are, or "" when all are applied. Unlike
// goose's own checks, it does not create goose's version table when there is none.
func (s *Store) gooseBehind(ctx context.Context) (string, error) {
	provider, err := s.gooseProvider()
	if err != nil {
		return "", err
	}

	// Goose's SQLite dialect has no table check, and sqlc's SQLite catalog does not know
	// sqlite_master, hence the one hand-written query of this package.
	var exists bool
	if err := s.db.QueryRowContext(ctx, gooseTableExistsSQL, goose.DefaultTablename).Scan(&exists); err != nil {
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

// gooseProvider is goose with the app's SQLite migrations on the store's *sql.DB. Goose runs SQL
// migrations on one *sql.Conn it holds, so it never waits on itself for the single connection.
func (s *Store) gooseProvider() (*goose.Provider, error) {
	migrations, err := fs.Sub(db.Migrations, "migrations/sqlite")
	if err != nil {
		return nil, fmt.Errorf("error opening migrations: %w", err)
	}

	provider, err := goose.NewProvider(goose.DialectSQLite3, s.db, migrations,
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(s.logger),
	)
	if err != nil {
		return nil, fmt.Errorf("error creating goose provider: %w", err)
	}
	return provider, nil
}

func (s *Store) riverMigrator() (*rivermigrate.Migrator[*sql.Tx], error) {
	migrator, err := rivermigrate.New(riversqlite.New(s.db), &rivermigrate.Config{Logger: s.logger})
	if err != nil {
		return nil, fmt.Errorf("error creating River migrator: %w", err)
	}
	return migrator, nil
}

// executor runs the app's queries on dbtx: the *sql.DB for the Store itself, a transaction
// inside InTx (then tx is set, so that JobInsert inserts through it).
type executor struct {
	dbtx  dbsqlc.DBTX
	store *Store
	tx    *sql.Tx
}

// EmailTokenConsume implements db.Queries.EmailTokenConsume.
func (e *executor) EmailTokenConsume(ctx context.Context, tokenHash []byte, purpose db.TokenPurpose, now time.Time) (int64, error) {
	nowUS := now.UnixMicro()
	userID, err := dbsqlc.New().EmailTokenConsume(ctx, e.dbtx, dbsqlc.EmailTokenConsumeParams{
		Now:       &nowUS,
		Purpose:   string(purpose),
		TokenHash: tokenHash,
	})
	if err != nil {
		return 0, fmt.Errorf("error consuming email token: %w", interpretError(err))
	}
	return userID, nil
}

// EmailTokenInsert implements db.Queries.EmailTokenInsert.
func (e *executor) EmailTokenInsert(ctx context.Context, params *db.EmailTokenInsertParams) error {
	err := dbsqlc.New().EmailTokenInsert(ctx, e.dbtx, dbsqlc.EmailTokenInsertParams{
		ExpiresAt: params.ExpiresAt.UnixMicro(),
		JobID:     params.JobID,
		Now:       params.Now.UnixMicro(),
		Purpose:   string(params.Purpose),
		Sealed:    params.Sealed,
		TokenHash: params.TokenHash,
		UserID:    params.UserID,
	})
	if err != nil {
		return fmt.Errorf("error inserting email token: %w", interpretError(err))
	}
	return nil
}

// EmailTokenLookup implements db.Queries.EmailTokenLookup.
func (e *executor) EmailTokenLookup(ctx context.Context, tokenHash []byte, purpose db.TokenPurpose, now time.Time) (int64, error) {
	userID, err := dbsqlc.New().EmailTokenLookup(ctx, e.dbtx, dbsqlc.EmailTokenLookupParams{
		Now:       now.UnixMicro(),
		Purpose:   string(purpose),
		TokenHash: tokenHash,
	})
	if err != nil {
		return 0, fmt.Errorf("error looking up email token: %w", interpretError(err))
	}
	return userID, nil
}

// EmailTokenInvalidateUser implements db.Queries.EmailTokenInvalidateUser.
func (e *executor) EmailTokenInvalidateUser(ctx context.Context, userID int64, purpose db.TokenPurpose, now time.Time) error {
	nowUS := now.UnixMicro()
	_, err := dbsqlc.New().EmailTokenInvalidateUser(ctx, e.dbtx, dbsqlc.EmailTokenInvalidateUserParams{
		Now:     &nowUS,
		Purpose: string(purpose),
		UserID:  userID,
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

	var (
		res *rivertype.JobInsertResult
		err error
	)
	if e.tx != nil {
		res, err = client.InsertTx(ctx, e.tx, args, opts)
	} else {
		res, err = client.Insert(ctx, args, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("error inserting %s job: %w", args.Kind(), interpretError(err))
	}
	return res, nil
}

// UserGetByEmail implements db.Queries.UserGetByEmail.
func (e *executor) UserGetByEmail(ctx context.Context, email string) (*db.User, error) {
	user, err := dbsqlc.New().UserGetByEmail(ctx, e.dbtx, email)
	if err != nil {
		return nil, fmt.Errorf("error getting user by email: %w", interpretError(err))
	}
	return userFromRow(user), nil
}

// UserGetByID implements db.Queries.UserGetByID.
func (e *executor) UserGetByID(ctx context.Context, id int64) (*db.User, error) {
	user, err := dbsqlc.New().UserGetByID(ctx, e.dbtx, id)
	if err != nil {
		return nil, fmt.Errorf("error getting user by id: %w", interpretError(err))
	}
	return userFromRow(user), nil
}

// UserInsert implements db.Queries.UserInsert.
func (e *executor) UserInsert(ctx context.Context, params *db.UserInsertParams) (*db.User, error) {
	user, err := dbsqlc.New().UserInsert(ctx, e.dbtx, dbsqlc.UserInsertParams{
		Email:        params.Email,
		Name:         params.Name,
		Now:          params.Now.UnixMicro(),
		PasswordHash: params.PasswordHash,
	})
	if err != nil {
		// ON CONFLICT DO NOTHING: no row back means the email is taken.
		if errors.Is(err, sql.ErrNoRows) {
			return nil, db.ErrEmailTaken
		}
		return nil, fmt.Errorf("error inserting user: %w", interpretError(err))
	}
	return userFromRow(user), nil
}

// UserMarkEmailVerified implements db.Queries.UserMarkEmailVerified.
func (e *executor) UserMarkEmailVerified(ctx context.Context, id int64, now time.Time) error {
	updated, err := dbsqlc.New().UserMarkEmailVerified(ctx, e.dbtx, dbsqlc.UserMarkEmailVerifiedParams{
		ID:  id,
		Now: now.UnixMicro(),
	})
	return requireUpdated("marking email verified", updated, err)
}

// UserSetPassword implements db.Queries.UserSetPassword.
func (e *executor) UserSetPassword(ctx context.Context, id int64, passwordHash string, now time.Time) error {
	updated, err := dbsqlc.New().UserSetPassword(ctx, e.dbtx, dbsqlc.UserSetPasswordParams{
		ID:           id,
		Now:          now.UnixMicro(),
		PasswordHash: passwordHash,
	})
	return requireUpdated("setting password", updated, err)
}

// UserUnsubscribe implements db.Queries.UserUnsubscribe.
func (e *executor) UserUnsubscribe(ctx context.Context, id int64, now time.Time) error {
	updated, err := dbsqlc.New().UserUnsubscribe(ctx, e.dbtx, dbsqlc.UserUnsubscribeParams{
		ID:  id,
		Now: now.UnixMicro(),
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

// timeFromMicros reads the app's INTEGER times (unix microseconds), in UTC.
func timeFromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

func timePtrFromMicros(us *int64) *time.Time {
	if us == nil {
		return nil
	}
	t := timeFromMicros(*us)
	return &t
}

func userFromRow(user *dbsqlc.User) *db.User {
	return &db.User{
		ID:              user.ID,
		CreatedAt:       timeFromMicros(user.CreatedAt),
		Email:           user.Email,
		EmailVerifiedAt: timePtrFromMicros(user.EmailVerifiedAt),
		Name:            user.Name,
		PasswordHash:    user.PasswordHash,
		UnsubscribedAt:  timePtrFromMicros(user.UnsubscribedAt),
		UpdatedAt:       timeFromMicros(user.UpdatedAt),
	}
}
