// Package db defines the one store interface that everything above the database talks to, and
// embeds the app's schema migrations for both engines. Engine code (pgx or database/sql, River's
// Client[pgx.Tx] or Client[*sql.Tx]) lives in db/postgres and db/sqlite.
package db

import (
	"context"
	"embed"
	"errors"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"riverqueue.com/riverui/uiendpoints"
)

// Migrations holds the goose migrations of both engines, under postgres/ and sqlite/.
//
//go:embed migrations
var Migrations embed.FS

var (
	// ErrNotFound is returned when a row looked up does not exist (or a token is unusable).
	ErrNotFound = errors.New("not found")

	// ErrEmailTaken is returned by UserInsert when the email is already registered.
	ErrEmailTaken = errors.New("email already registered")

	// ErrExists is returned by an insert whose row exists already (EmailMessageInsert: another
	// attempt of the job created its message).
	ErrExists = errors.New("already exists")

	// ErrUnavailable wraps errors that mean the database cannot be reached or cannot serve right
	// now (a refused or dropped connection, a timeout, a server shutting down, out of connections
	// or read-only; SQLite busy, full or failing its I/O): a state that passes, answered 503, not
	// a bug. Each engine decides, at its boundary, which of its driver's errors these are, and
	// every store method's errors go through that decision.
	ErrUnavailable = errors.New("database unavailable")

	// ErrSchemaBehind is returned by Store.CheckSchema when River's or the app's migrations have
	// not all been applied. The message tells the operator what to run.
	ErrSchemaBehind = errors.New("database schema is behind: run `postguard migrate`")
)

// User is a registered user.
type User struct {
	ID              int64
	Email           string
	Name            string
	PasswordHash    string
	EmailVerifiedAt *time.Time
	UnsubscribedAt  *time.Time
	CreatedAt       time.Time
	UpdatedAt       time.Time
}

// TokenPurpose says what an email token may be used for; a token of one purpose never stands in
// for another.
type TokenPurpose string

const (
	TokenPurposeVerify TokenPurpose = "verify"
	TokenPurposeReset  TokenPurpose = "reset"
)

// Message statuses: an email job's message is queued from its first attempt until the provider
// accepts it (sent).
const (
	EmailStatusQueued = "queued"
	EmailStatusSent   = "sent"
)

// EmailMessage is the message row of one email job, created at its first attempt.
type EmailMessage struct {
	JobID  int64
	Kind   string
	UserID int64
	// IdempotencyKey is the key every attempt sends under (<kind>:<user_id>:<random>).
	IdempotencyKey string
	// KeyCreatedAt is when IdempotencyKey was chosen: the provider forgets a key 24 hours later.
	KeyCreatedAt time.Time
	Status       string
	// ProviderID is the provider's id of the accepted mail; nil until then.
	ProviderID *string
	// AcceptedAt is when the provider accepted the mail; nil until then. A later attempt of a job
	// whose mail was accepted completes without sending.
	AcceptedAt *time.Time
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// EmailToken is a stored link token: never the token itself, only its hash and, while its job may
// still send it, its sealed copy.
type EmailToken struct {
	TokenHash []byte
	UserID    int64
	Purpose   TokenPurpose
	JobID     int64
	// Sealed is the token encrypted for its job's later attempts (jobs/tokens.Sealer); nil once
	// the provider accepted the mail, or after 24 hours.
	Sealed    []byte
	ExpiresAt time.Time
	UsedAt    *time.Time
	CreatedAt time.Time
}

// EmailMessageInsertParams are the fields of a job's new message row.
type EmailMessageInsertParams struct {
	JobID          int64
	Kind           string
	UserID         int64
	IdempotencyKey string
	Now            time.Time
}

// UserInsertParams are the fields of a new user.
type UserInsertParams struct {
	Email        string // normalised
	Name         string
	PasswordHash string
	Now          time.Time
}

// EmailTokenInsertParams are the stored forms of a job's new token.
type EmailTokenInsertParams struct {
	TokenHash []byte // SHA-256 of the token
	UserID    int64
	Purpose   TokenPurpose
	JobID     int64
	Sealed    []byte // the token sealed for the job's later attempts
	ExpiresAt time.Time
	Now       time.Time
}

// RateLimitCounterConsumeParams names one fixed window of one key and its limit.
type RateLimitCounterConsumeParams struct {
	KeyHash     []byte
	WindowStart time.Time
	WindowEnd   time.Time
	Limit       int64
}

// RateLimitCounterGetParams names one fixed window of one key.
type RateLimitCounterGetParams struct {
	KeyHash     []byte
	WindowStart time.Time
}

// Queries are the app's statements. A Store runs them on its own connection (each statement
// commits alone); the Tx passed to Store.InTx runs them in one transaction.
type Queries interface {
	// UserInsert creates a user; ErrEmailTaken when the email is registered already.
	UserInsert(ctx context.Context, params *UserInsertParams) (*User, error)
	// UserGetByEmail finds a user by normalised email; ErrNotFound when there is none.
	UserGetByEmail(ctx context.Context, email string) (*User, error)
	// UserGetByID finds a user by id; ErrNotFound when there is none.
	UserGetByID(ctx context.Context, id int64) (*User, error)
	// UserMarkEmailVerified records the first verification; ErrNotFound for an unknown user.
	UserMarkEmailVerified(ctx context.Context, id int64, now time.Time) error
	// UserSetPassword replaces the password hash and marks the email verified.
	UserSetPassword(ctx context.Context, id int64, passwordHash string, now time.Time) error
	// UserUnsubscribe records an unsubscribe; repeating it is harmless.
	UserUnsubscribe(ctx context.Context, id int64, now time.Time) error

	// EmailTokenInsert stores a job's new token (its hash and sealed copy).
	EmailTokenInsert(ctx context.Context, params *EmailTokenInsertParams) error
	// EmailTokenGetByJob finds the token of a job; ErrNotFound when it has none.
	EmailTokenGetByJob(ctx context.Context, jobID int64) (*EmailToken, error)
	// EmailTokenDeleteByJob deletes the token of a job (none is fine).
	EmailTokenDeleteByJob(ctx context.Context, jobID int64) error
	// EmailTokenEraseSealed erases the sealed copy of a job's token (none is fine).
	EmailTokenEraseSealed(ctx context.Context, jobID int64) error
	// EmailTokenConsume marks an unused, unexpired token of the purpose used and returns its user
	// id; ErrNotFound when the token is unknown, of another purpose, expired or used.
	EmailTokenConsume(ctx context.Context, tokenHash []byte, purpose TokenPurpose, now time.Time) (int64, error)
	// EmailTokenLookup returns the user id of an unused, unexpired token of the purpose without
	// using it; ErrNotFound when the token is unknown, of another purpose, expired or used.
	EmailTokenLookup(ctx context.Context, tokenHash []byte, purpose TokenPurpose, now time.Time) (int64, error)
	// EmailTokenInvalidateUser marks all of a user's unused tokens of a purpose used.
	EmailTokenInvalidateUser(ctx context.Context, userID int64, purpose TokenPurpose, now time.Time) error

	// EmailMessageInsert creates a job's message row; ErrExists when the job has one.
	EmailMessageInsert(ctx context.Context, params *EmailMessageInsertParams) (*EmailMessage, error)
	// EmailMessageGetByJob finds a job's message row; ErrNotFound when it has none.
	EmailMessageGetByJob(ctx context.Context, jobID int64) (*EmailMessage, error)
	// EmailMessageRekey gives a job's unaccepted message a new idempotency key; ErrNotFound when
	// there is no such message.
	EmailMessageRekey(ctx context.Context, jobID int64, idempotencyKey string, now time.Time) error
	// EmailMessageMarkAccepted records that the provider accepted a job's message, with its id.
	EmailMessageMarkAccepted(ctx context.Context, jobID int64, providerID string, now time.Time) error

	// JobInsert inserts a River job: inside InTx through InsertTx, so it commits or rolls back
	// with the transaction's other writes.
	JobInsert(ctx context.Context, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error)
}

// JobClient is the engine-agnostic part of *river.Client[TTx] that the app uses.
// *river.Client[pgx.Tx] and *river.Client[*sql.Tx] both satisfy it.
type JobClient interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
	StopAndCancel(ctx context.Context) error
	Stopped() <-chan struct{}
	Insert(ctx context.Context, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error)
	JobGet(ctx context.Context, id int64) (*rivertype.JobRow, error)
	JobList(ctx context.Context, params *river.JobListParams) (*river.JobListResult, error)
	JobDeleteMany(ctx context.Context, params *river.JobDeleteManyParams) (*river.JobDeleteManyResult, error)
	Subscribe(kinds ...river.EventKind) (<-chan *river.Event, func())
	PeriodicJobs() *river.PeriodicJobBundle
}

// Store is one database, either engine. Create it with postgres.New or sqlite.Open, then call
// ConfigureRiver once before anything uses jobs.
type Store interface {
	Queries

	// Engine is "postgres" or "sqlite".
	Engine() string

	// InTx runs fn in one transaction: committed when fn returns nil, rolled back otherwise. fn
	// must use only the Queries it is given (on SQLite, the pool's one connection is the tx's),
	// and have no effect outside the transaction: a transaction whose connection was lost before
	// it committed runs again (see the engine's retry rule).
	InTx(ctx context.Context, fn func(ctx context.Context, tx Queries) error) error

	// RateLimitCounterConsume spends one request of a window in one atomic statement, outside any
	// other transaction. ok is false (and nothing counted) when the window is at its limit.
	RateLimitCounterConsume(ctx context.Context, params *RateLimitCounterConsumeParams) (count int64, ok bool, err error)
	// RateLimitCounterGet reads how many requests a window has counted (0 when none), spending
	// nothing, outside any other transaction.
	RateLimitCounterGet(ctx context.Context, params *RateLimitCounterGetParams) (int64, error)
	// RateLimitCounterDeleteExpired deletes up to max counters whose window ended before before.
	RateLimitCounterDeleteExpired(ctx context.Context, before time.Time, max int) (int64, error)
	// EmailTokenDeleteExpired deletes up to max tokens that expired before before.
	EmailTokenDeleteExpired(ctx context.Context, before time.Time, max int) (int64, error)
	// EmailTokenEraseSealedBefore erases up to max sealed copies of tokens created before before.
	EmailTokenEraseSealedBefore(ctx context.Context, before time.Time, max int) (int64, error)
	// EmailMessageDeleteBefore deletes up to max message rows created before before.
	EmailMessageDeleteBefore(ctx context.Context, before time.Time, max int) (int64, error)

	// SendPacerReserve takes the next send slot of the named budget, one interval after the
	// previous slot and never before the database's now, and returns it with that now. The
	// schedule runs on the database's clock, the one clock every process shares, so no process's
	// own clock can move it.
	SendPacerReserve(ctx context.Context, name string, interval time.Duration) (slot, now time.Time, err error)
	// Now is the database's clock, the one SendPacerReserve schedules on.
	Now(ctx context.Context) (time.Time, error)

	// Migrate applies River's migrations (rivermigrate) and then the app's (goose), holding a
	// lock so two deploys cannot race. Idempotent.
	Migrate(ctx context.Context) error
	// CheckSchema returns an error wrapping ErrSchemaBehind while any migration is missing.
	CheckSchema(ctx context.Context) error

	// Ping checks the database answers.
	Ping(ctx context.Context) error
	// Ready checks the database answers and takes a write (a one-row heartbeat): an error
	// wrapping ErrUnavailable while it is unreachable, read-only, busy, full or failing its I/O.
	Ready(ctx context.Context) error

	// ConfigureRiver creates the store's River client from config (workers, queues, periodic
	// jobs); JobInsert and River fail before it. Call it once.
	ConfigureRiver(config *river.Config) error
	// River is the store's River client.
	River() JobClient
	// RiverUIEndpoints is the River UI API bundle for the store's River client.
	RiverUIEndpoints() uiendpoints.Bundle

	// Close releases the store's connections. It does not stop River.
	Close() error
}
