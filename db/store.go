package db

import (
	"context"
	"time"
)

// Queries are the app's statements. The Tables run them on their own connections, each
// statement committing alone; the Queries given to Tables.Transact run them in one transaction.
type Queries interface {
	// UserInsert creates a user; ErrEmailTaken when the email is registered already.
	UserInsert(ctx context.Context, params *UserInsertParams) (*User, error)
	// UserGetByEmail finds a user by normalised email; ErrNotFound when there is none.
	UserGetByEmail(ctx context.Context, email string) (*User, error)
	// UserGetByID finds a user by id; ErrNotFound when there is none.
	UserGetByID(ctx context.Context, id int64) (*User, error)
	// UserMarkEmailVerified records the first verification and returns the user's locale;
	// ErrNotFound for an unknown user.
	UserMarkEmailVerified(ctx context.Context, id int64, now time.Time) (locale string, err error)
	// UserSetPassword replaces the password hash and marks the email verified.
	UserSetPassword(ctx context.Context, id int64, passwordHash string, now time.Time) error
	// UserUnsubscribe records an unsubscribe (repeating it is harmless) and returns the user's
	// locale; ErrNotFound for an unknown user.
	UserUnsubscribe(ctx context.Context, id int64, now time.Time) (locale string, err error)

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
	// EmailTokenLookup returns the user (its id and locale) of an unused, unexpired token of the
	// purpose without using it, in one statement; ErrNotFound when the token is unknown, of
	// another purpose, expired or used.
	EmailTokenLookup(ctx context.Context, tokenHash []byte, purpose TokenPurpose, now time.Time) (*TokenOwner, error)
	// EmailTokenInvalidateUser marks all of a user's unused tokens of a purpose used.
	EmailTokenInvalidateUser(ctx context.Context, userID int64, purpose TokenPurpose, now time.Time) error
	// EmailTokenDeleteExpired deletes up to max tokens that expired before before.
	EmailTokenDeleteExpired(ctx context.Context, before time.Time, max int) (int64, error)
	// EmailTokenEraseSealedBefore erases up to max sealed copies of tokens created before before.
	EmailTokenEraseSealedBefore(ctx context.Context, before time.Time, max int) (int64, error)

	// EmailMessageInsert creates a job's message row; ErrExists when the job has one.
	EmailMessageInsert(ctx context.Context, params *EmailMessageInsertParams) (*EmailMessage, error)
	// EmailMessageGetByJob finds a job's message row; ErrNotFound when it has none.
	EmailMessageGetByJob(ctx context.Context, jobID int64) (*EmailMessage, error)
	// EmailMessageRekey gives a job's unaccepted message a new idempotency key, with the locale
	// and payload digest of what is sent under it; ErrNotFound when there is no such message.
	EmailMessageRekey(ctx context.Context, params *EmailMessageRekeyParams) error
	// EmailMessageMarkAccepted records that a provider accepted a job's message: which provider,
	// and the id it gave the mail. No provider is in doubt of the message any more.
	EmailMessageMarkAccepted(ctx context.Context, params *EmailMessageMarkAcceptedParams) error
	// EmailMessageSetProviderInDoubt records the provider a job's unaccepted message is handed to
	// before the send, or clears it; ErrNotFound when the job has no unaccepted message.
	EmailMessageSetProviderInDoubt(ctx context.Context, params *EmailMessageSetProviderInDoubtParams) error
	// EmailMessageMarkBounced records that a provider refused a job's recipient for good while the
	// mail was sent; ErrNotFound when the job has no unaccepted message.
	EmailMessageMarkBounced(ctx context.Context, params *EmailMessageMarkBouncedParams) error
	// EmailMessageDeleteBefore deletes up to max message rows created before before.
	EmailMessageDeleteBefore(ctx context.Context, before time.Time, max int) (int64, error)
	// EmailMessageGetByProviderID finds the message the provider gave an id (the newest, should a
	// sender have repeated one); ErrNotFound when there is none. In a transaction, the row stays locked until it ends (on PostgreSQL; SQLite's
	// transactions hold the write lock from their start).
	EmailMessageGetByProviderID(ctx context.Context, providerID string) (*EmailMessage, error)
	// EmailMessageSetLifecycle writes a message's status and status times; ErrNotFound when the
	// job has no message.
	EmailMessageSetLifecycle(ctx context.Context, params *EmailMessageLifecycleParams) error
	// EmailMessageMarkSuppressed records that a job's mail is not sent because its address is
	// suppressed: its message row is created, or turned, suppressed. marked is false, and nothing
	// changes, when the provider accepted the job's mail already.
	EmailMessageMarkSuppressed(ctx context.Context, params *EmailMessageMarkSuppressedParams) (marked bool, err error)
	// EmailMessageListByUser lists a user's newest max messages, newest first.
	EmailMessageListByUser(ctx context.Context, userID int64, max int) ([]*EmailMessage, error)

	// EmailSuppressionInsert puts an address on the suppression list; one on it already keeps
	// its first reason and time.
	EmailSuppressionInsert(ctx context.Context, params *EmailSuppressionInsertParams) error
	// EmailSuppressionGet finds an address on the suppression list; ErrNotFound when it is not.
	EmailSuppressionGet(ctx context.Context, addressHash []byte) (*EmailSuppression, error)
	// EmailSuppressionDelete takes an address off the suppression list; deleted says it was on.
	EmailSuppressionDelete(ctx context.Context, addressHash []byte) (deleted bool, err error)
	// EmailSuppressionList lists a page of the suppression list, newest first.
	EmailSuppressionList(ctx context.Context, params *EmailSuppressionListParams) ([]*EmailSuppression, error)

	// WebhookEventInsert records a webhook delivery's id; ErrExists when it was recorded already
	// (a replay).
	WebhookEventInsert(ctx context.Context, svixID string, now time.Time) error
	// WebhookEventDeleteBefore deletes up to max webhook delivery ids received before before.
	WebhookEventDeleteBefore(ctx context.Context, before time.Time, max int) (int64, error)

	// RateLimitCounterDeleteExpired deletes up to max counters whose window ended before before.
	RateLimitCounterDeleteExpired(ctx context.Context, before time.Time, max int) (int64, error)

	// RateLimitDeviceRevocationUpsert revokes every trusted-device token issued so far under
	// keyHash: it records the database's clock as the key's revocation time, later than any
	// recorded before. It runs on durable connections (a revocation must survive a crash).
	RateLimitDeviceRevocationUpsert(ctx context.Context, keyHash []byte) error
	// RateLimitDeviceRevocationGet reads keyHash's last revocation time, the one a token issued
	// now carries: the Unix epoch when none is recorded.
	RateLimitDeviceRevocationGet(ctx context.Context, keyHash []byte) (time.Time, error)
	// RateLimitDeviceRevocationDeleteBefore deletes up to max revocations recorded before before.
	RateLimitDeviceRevocationDeleteBefore(ctx context.Context, before time.Time, max int) (int64, error)

	// SendPacerReserve takes the next send slot of the named budget, one interval after the
	// previous slot and never before the database's now, and returns it with that now. The
	// schedule runs on the database's clock, the one clock every process shares, so no process's
	// own clock can move it.
	SendPacerReserve(ctx context.Context, name string, interval time.Duration) (slot, now time.Time, err error)
	// Now is the database's clock, the one SendPacerReserve schedules on.
	Now(ctx context.Context) (time.Time, error)

	// SecretCheckRecord records the check value of the secret the database is used with, unless
	// one is recorded already, and returns the recorded one (params.CheckValue when there was
	// none). It is two statements, the insert then the read, so that of two processes starting
	// at once with different secrets the second reads the first's.
	SecretCheckRecord(ctx context.Context, params *SecretCheckParams) ([]byte, error)
	// SecretCheckReplace records the check value of a new secret in place of the old one.
	SecretCheckReplace(ctx context.Context, params *SecretCheckParams) error
}

// Counters are the rate limiter's statements: each runs alone, outside any other transaction
// (on PostgreSQL, on connections whose commits do not wait for their WAL flush).
type Counters interface {
	// RateLimitCounterConsume spends one request of a window in one atomic statement. ok is
	// false (and nothing counted) when the window is at its limit.
	RateLimitCounterConsume(ctx context.Context, params *RateLimitCounterConsumeParams) (count int64, ok bool, err error)
	// RateLimitCounterConsumeChain spends one request of each of a request's windows in order,
	// each as RateLimitCounterConsume does and only while every one before it admitted, and reads
	// UserEmail's user when all admitted: in one round trip (on PostgreSQL one statement; on
	// SQLite one call on one connection, outside any transaction). It is the rate limiter's hot
	// path.
	RateLimitCounterConsumeChain(ctx context.Context, params *RateLimitCounterChainParams) (*RateLimitCounterChainResult, error)
	// RateLimitCounterConsumeBatch spends several requests' chains, each as
	// RateLimitCounterConsumeChain does, in one round trip (on PostgreSQL one statement, on
	// SQLite one transaction), all or none: when it fails, none of them spent anything. It
	// returns one result per chain, in order. No key may be in two of the chains. The Tables
	// batch concurrent checks into it (see NewTables).
	RateLimitCounterConsumeBatch(ctx context.Context, chains []*RateLimitCounterChainParams) ([]*RateLimitCounterChainResult, error)
	// RateLimitCounterGet reads how many requests a window has counted (0 when none), spending
	// nothing.
	RateLimitCounterGet(ctx context.Context, params *RateLimitCounterGetParams) (int64, error)
	// RateLimitCounterGetMany reads several windows' counts in one round trip, in the order
	// asked (0 for a window with nothing counted), spending nothing: a request's peek. A trusted
	// device is checked in the same round trip.
	RateLimitCounterGetMany(ctx context.Context, params *RateLimitCounterWindowsParams) (*RateLimitCounterGetManyResult, error)
	// RateLimitCounterDelete deletes a window's counter (none is fine): its key starts the window
	// afresh.
	RateLimitCounterDelete(ctx context.Context, params *RateLimitCounterDeleteParams) error
	// RateLimitCounterDeleteMany deletes several windows' counters (none is fine) in one round
	// trip, a trusted device checked with them: a request's clear. trusted says the device stood.
	RateLimitCounterDeleteMany(ctx context.Context, params *RateLimitCounterWindowsParams) (trusted bool, err error)
	// RateLimitCounterRefund gives one request back to each of several windows, in one round
	// trip, never below zero (a window at 0 or never counted is left alone), a trusted device
	// checked with them: a request's refund. trusted says the device stood.
	RateLimitCounterRefund(ctx context.Context, params *RateLimitCounterWindowsParams) (trusted bool, err error)
}

// Tables are postguard's tables on one database, either engine: the app's statements, the rate
// limiter's counters, transactions over the statements, and their migrations. They know nothing
// of River: a host app that runs River itself builds Tables on its own pgx pool or *sql.DB
// (NewTables on postgres.NewEngineFromPool or sqlite.NewEngineFromDB) for postguard's limiter
// and mail workers, and postguard's own server puts its River client beside them
// (internal/riverstore).
type Tables interface {
	Queries
	Counters

	// Engine is "postgres" or "sqlite".
	Engine() string

	// Transact runs fn's statements in one transaction: committed when fn returns nil, rolled
	// back otherwise (or when fn panics). fn must use only the Queries it is given (on SQLite, the
	// one connection is the transaction's), and have no effect outside the transaction: one whose
	// connection was lost before it committed runs again (see Engine.MayRetry).
	Transact(ctx context.Context, fn func(ctx context.Context, q Queries) error) error

	// MigrateTables applies postguard's migrations (goose), holding the engine's migration lock
	// so two deploys cannot race; opts may be nil. Idempotent. River's are not among them: a host
	// app runs River's its own way (rivermigrate), and MigrateOpts.BeforeFunc lets postguard's
	// server run them under the same lock.
	MigrateTables(ctx context.Context, opts *MigrateOpts) error
	// MigrationsBehind says what of postguard's migrations is not applied, a phrase for each
	// set behind; none when all are. It only reads: it creates no goose table.
	MigrationsBehind(ctx context.Context, opts *MigrateOpts) ([]string, error)

	// Ready checks the database answers and takes a write (a one-row heartbeat, PartService's
	// readiness_heartbeat): an error wrapping ErrUnavailable while it is unreachable, read-only,
	// busy, full or failing its I/O.
	Ready(ctx context.Context) error

	// Close releases what the Tables' engine opened. Stop whatever uses its connections first
	// (a River client on them).
	Close() error
}
