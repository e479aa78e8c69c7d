package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/postgres/dbsqlc"
)

// sqlc is the app's generated statements; each call names its executor.
var sqlc = dbsqlc.New() //nolint:gochecknoglobals // stateless

// queries runs the app's statements on dbtx: the main pool, or a transaction.
//
// dbsqlc's rows and parameters have db's field names, types and order (db.TokenPurpose through an
// sqlc override, times in UTC through the pools' timestamptz codec), so they convert with plain Go
// conversions; a field that drifts fails to compile here.
type queries struct {
	dbtx dbsqlc.DBTX
}

// EmailMessageDeleteBefore implements db.Queries.
func (q *queries) EmailMessageDeleteBefore(ctx context.Context, before time.Time, limit int) (int64, error) {
	n, err := sqlc.EmailMessageDeleteBefore(ctx, q.dbtx, dbsqlc.EmailMessageDeleteBeforeParams{Before: before, Max: int64(limit)})
	return n, wrap("deleting old email messages", err)
}

// EmailMessageGetByJob implements db.Queries.
func (q *queries) EmailMessageGetByJob(ctx context.Context, jobID int64) (*db.EmailMessage, error) {
	message, err := sqlc.EmailMessageGetByJob(ctx, q.dbtx, jobID)
	return (*db.EmailMessage)(message), wrap("getting email message", err)
}

// EmailMessageInsert implements db.Queries.
func (q *queries) EmailMessageInsert(ctx context.Context, params *db.EmailMessageInsertParams) (*db.EmailMessage, error) {
	message, err := sqlc.EmailMessageInsert(ctx, q.dbtx, dbsqlc.EmailMessageInsertParams(*params))
	if errors.Is(err, pgx.ErrNoRows) { // ON CONFLICT DO NOTHING
		return nil, fmt.Errorf("error inserting email message of job %d: %w", params.JobID, db.ErrExists)
	}
	return (*db.EmailMessage)(message), wrap("inserting email message", err)
}

// EmailMessageMarkAccepted implements db.Queries.
func (q *queries) EmailMessageMarkAccepted(ctx context.Context, jobID int64, providerID string, now time.Time) error {
	n, err := sqlc.EmailMessageMarkAccepted(ctx, q.dbtx, dbsqlc.EmailMessageMarkAcceptedParams{ProviderID: providerID, Now: now, JobID: jobID})
	return updated("marking email message accepted", n, err)
}

// EmailMessageRekey implements db.Queries.
func (q *queries) EmailMessageRekey(ctx context.Context, jobID int64, idempotencyKey string, now time.Time) error {
	n, err := sqlc.EmailMessageRekey(ctx, q.dbtx, dbsqlc.EmailMessageRekeyParams{IdempotencyKey: idempotencyKey, Now: now, JobID: jobID})
	return updated("giving email message a new key", n, err)
}

// EmailTokenConsume implements db.Queries.
func (q *queries) EmailTokenConsume(ctx context.Context, tokenHash []byte, purpose db.TokenPurpose, now time.Time) (int64, error) {
	userID, err := sqlc.EmailTokenConsume(ctx, q.dbtx, dbsqlc.EmailTokenConsumeParams{Now: now, TokenHash: tokenHash, Purpose: purpose})
	return userID, wrap("consuming email token", err)
}

// EmailTokenDeleteByJob implements db.Queries.
func (q *queries) EmailTokenDeleteByJob(ctx context.Context, jobID int64) error {
	_, err := sqlc.EmailTokenDeleteByJob(ctx, q.dbtx, jobID)
	return wrap("deleting email token", err)
}

// EmailTokenDeleteExpired implements db.Queries.
func (q *queries) EmailTokenDeleteExpired(ctx context.Context, before time.Time, limit int) (int64, error) {
	n, err := sqlc.EmailTokenDeleteExpired(ctx, q.dbtx, dbsqlc.EmailTokenDeleteExpiredParams{Before: before, Max: int64(limit)})
	return n, wrap("deleting expired email tokens", err)
}

// EmailTokenEraseSealed implements db.Queries.
func (q *queries) EmailTokenEraseSealed(ctx context.Context, jobID int64) error {
	_, err := sqlc.EmailTokenEraseSealed(ctx, q.dbtx, jobID)
	return wrap("erasing sealed token", err)
}

// EmailTokenEraseSealedBefore implements db.Queries.
func (q *queries) EmailTokenEraseSealedBefore(ctx context.Context, before time.Time, limit int) (int64, error) {
	n, err := sqlc.EmailTokenEraseSealedBefore(ctx, q.dbtx, dbsqlc.EmailTokenEraseSealedBeforeParams{Before: before, Max: int64(limit)})
	return n, wrap("erasing old sealed tokens", err)
}

// EmailTokenGetByJob implements db.Queries.
func (q *queries) EmailTokenGetByJob(ctx context.Context, jobID int64) (*db.EmailToken, error) {
	token, err := sqlc.EmailTokenGetByJob(ctx, q.dbtx, jobID)
	return (*db.EmailToken)(token), wrap("getting email token", err)
}

// EmailTokenInsert implements db.Queries.
func (q *queries) EmailTokenInsert(ctx context.Context, params *db.EmailTokenInsertParams) error {
	return wrap("inserting email token", sqlc.EmailTokenInsert(ctx, q.dbtx, dbsqlc.EmailTokenInsertParams(*params)))
}

// EmailTokenLookup implements db.Queries.
func (q *queries) EmailTokenLookup(ctx context.Context, tokenHash []byte, purpose db.TokenPurpose, now time.Time) (int64, error) {
	userID, err := sqlc.EmailTokenLookup(ctx, q.dbtx, dbsqlc.EmailTokenLookupParams{TokenHash: tokenHash, Purpose: purpose, Now: now})
	return userID, wrap("looking up email token", err)
}

// EmailTokenInvalidateUser implements db.Queries.
func (q *queries) EmailTokenInvalidateUser(ctx context.Context, userID int64, purpose db.TokenPurpose, now time.Time) error {
	_, err := sqlc.EmailTokenInvalidateUser(ctx, q.dbtx, dbsqlc.EmailTokenInvalidateUserParams{Now: now, UserID: userID, Purpose: purpose})
	return wrap("invalidating email tokens", err)
}

// RateLimitCounterDeleteExpired implements db.Queries.
func (q *queries) RateLimitCounterDeleteExpired(ctx context.Context, before time.Time, limit int) (int64, error) {
	n, err := sqlc.RateLimitCounterDeleteExpired(ctx, q.dbtx, dbsqlc.RateLimitCounterDeleteExpiredParams{Before: before, Max: int64(limit)})
	return n, wrap("deleting expired rate limit counters", err)
}

// SendPacerReserve implements db.Queries: in one statement shared by every process.
func (q *queries) SendPacerReserve(ctx context.Context, name string, interval time.Duration, now time.Time) (time.Time, error) {
	if interval <= 0 {
		return time.Time{}, fmt.Errorf("send pacer interval must be positive, got %s", interval)
	}
	intervalUS := interval.Microseconds()
	tatUS, err := sqlc.SendPacerReserve(ctx, q.dbtx, dbsqlc.SendPacerReserveParams{Name: name, TatUs: now.UnixMicro() + intervalUS, IntervalUs: intervalUS})
	return time.UnixMicro(tatUS - intervalUS).UTC(), wrap("reserving send slot", err)
}

// UserGetByEmail implements db.Queries.
func (q *queries) UserGetByEmail(ctx context.Context, email string) (*db.User, error) {
	user, err := sqlc.UserGetByEmail(ctx, q.dbtx, email)
	return (*db.User)(user), wrap("getting user by email", err)
}

// UserGetByID implements db.Queries.
func (q *queries) UserGetByID(ctx context.Context, id int64) (*db.User, error) {
	user, err := sqlc.UserGetByID(ctx, q.dbtx, id)
	return (*db.User)(user), wrap("getting user by id", err)
}

// UserInsert implements db.Queries.
func (q *queries) UserInsert(ctx context.Context, params *db.UserInsertParams) (*db.User, error) {
	user, err := sqlc.UserInsert(ctx, q.dbtx, dbsqlc.UserInsertParams(*params))
	if errors.Is(err, pgx.ErrNoRows) { // ON CONFLICT DO NOTHING: the transaction stays usable
		return nil, db.ErrEmailTaken
	}
	return (*db.User)(user), wrap("inserting user", err)
}

// UserMarkEmailVerified implements db.Queries.
func (q *queries) UserMarkEmailVerified(ctx context.Context, id int64, now time.Time) error {
	n, err := sqlc.UserMarkEmailVerified(ctx, q.dbtx, dbsqlc.UserMarkEmailVerifiedParams{Now: now, ID: id})
	return updated("marking email verified", n, err)
}

// UserSetPassword implements db.Queries.
func (q *queries) UserSetPassword(ctx context.Context, id int64, passwordHash string, now time.Time) error {
	n, err := sqlc.UserSetPassword(ctx, q.dbtx, dbsqlc.UserSetPasswordParams{PasswordHash: passwordHash, Now: now, ID: id})
	return updated("setting password", n, err)
}

// UserUnsubscribe implements db.Queries.
func (q *queries) UserUnsubscribe(ctx context.Context, id int64, now time.Time) error {
	n, err := sqlc.UserUnsubscribe(ctx, q.dbtx, dbsqlc.UserUnsubscribeParams{Now: now, ID: id})
	return updated("unsubscribing user", n, err)
}

// counters runs the rate limiter's statements on the rate-limit pool (synchronous_commit off).
type counters struct {
	pool *pgxpool.Pool
}

// RateLimitCounterConsume implements db.Counters. When the window is at its limit, ok is false,
// nothing is counted, and count is the limit.
func (c *counters) RateLimitCounterConsume(ctx context.Context, params *db.RateLimitCounterConsumeParams) (int64, bool, error) {
	count, err := sqlc.RateLimitCounterConsume(ctx, c.pool, dbsqlc.RateLimitCounterConsumeParams(*params))
	if errors.Is(err, pgx.ErrNoRows) {
		return params.LimitCount, false, nil
	}
	return count, err == nil, wrap("consuming rate limit counter", err)
}

// RateLimitCounterGet implements db.Counters: no row is a count of 0.
func (c *counters) RateLimitCounterGet(ctx context.Context, params *db.RateLimitCounterGetParams) (int64, error) {
	count, err := sqlc.RateLimitCounterGet(ctx, c.pool, dbsqlc.RateLimitCounterGetParams(*params))
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return count, wrap("reading rate limit counter", err)
}

// wrap says what failed, its error converted to db's; nil stays nil.
func wrap(doing string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("error %s: %w", doing, interpretError(err))
}

// updated is wrap for an update that must touch a row: none is db.ErrNotFound.
func updated(doing string, n int64, err error) error {
	if err == nil && n == 0 {
		err = db.ErrNotFound
	}
	return wrap(doing, err)
}
