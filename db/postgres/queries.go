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
//
// On the main pool each call follows the retry rule (retry.go): lossIsSafe, given per statement,
// says whether it may run again after its session was lost (a read, or a write that leaves the
// database as it found it when run twice). In a transaction no call runs again alone.
type queries struct {
	dbtx  dbsqlc.DBTX
	retry bool
}

// run runs op under the retry rule when q is on the pool.
func run[T any](ctx context.Context, q *queries, lossIsSafe bool, op func(ctx context.Context) (T, error)) (T, error) {
	if !q.retry {
		return op(ctx)
	}
	return retryOnce(ctx, lossIsSafe, op)
}

// EmailMessageDeleteBefore implements db.Queries.
func (q *queries) EmailMessageDeleteBefore(ctx context.Context, before time.Time, limit int) (int64, error) {
	n, err := run(ctx, q, false, func(ctx context.Context) (int64, error) {
		return sqlc.EmailMessageDeleteBefore(ctx, q.dbtx, dbsqlc.EmailMessageDeleteBeforeParams{Before: before, Max: int64(limit)})
	})
	return n, wrap("deleting old email messages", err)
}

// EmailMessageGetByJob implements db.Queries.
func (q *queries) EmailMessageGetByJob(ctx context.Context, jobID int64) (*db.EmailMessage, error) {
	message, err := run(ctx, q, true, func(ctx context.Context) (*dbsqlc.EmailMessage, error) {
		return sqlc.EmailMessageGetByJob(ctx, q.dbtx, jobID)
	})
	return (*db.EmailMessage)(message), wrap("getting email message", err)
}

// EmailMessageInsert implements db.Queries.
func (q *queries) EmailMessageInsert(ctx context.Context, params *db.EmailMessageInsertParams) (*db.EmailMessage, error) {
	message, err := run(ctx, q, false, func(ctx context.Context) (*dbsqlc.EmailMessage, error) {
		return sqlc.EmailMessageInsert(ctx, q.dbtx, dbsqlc.EmailMessageInsertParams(*params))
	})
	if errors.Is(err, pgx.ErrNoRows) { // ON CONFLICT DO NOTHING
		return nil, fmt.Errorf("error inserting email message of job %d: %w", params.JobID, db.ErrExists)
	}
	return (*db.EmailMessage)(message), wrap("inserting email message", err)
}

// EmailMessageMarkAccepted implements db.Queries.
func (q *queries) EmailMessageMarkAccepted(ctx context.Context, params *db.EmailMessageMarkAcceptedParams) error {
	n, err := run(ctx, q, true, func(ctx context.Context) (int64, error) {
		return sqlc.EmailMessageMarkAccepted(ctx, q.dbtx, dbsqlc.EmailMessageMarkAcceptedParams{
			Provider:   params.Provider,
			ProviderID: params.ProviderID,
			Now:        params.Now,
			JobID:      params.JobID,
		})
	})
	return updated("marking email message accepted", n, err)
}

// EmailMessageSetProviderInDoubt implements db.Queries. It writes a given value, so it may run
// again.
func (q *queries) EmailMessageSetProviderInDoubt(ctx context.Context, params *db.EmailMessageSetProviderInDoubtParams) error {
	n, err := run(ctx, q, true, func(ctx context.Context) (int64, error) {
		return sqlc.EmailMessageSetProviderInDoubt(ctx, q.dbtx, dbsqlc.EmailMessageSetProviderInDoubtParams{
			Provider: params.Provider,
			Now:      params.Now,
			JobID:    params.JobID,
		})
	})
	return updated("recording the provider an email message is handed to", n, err)
}

// EmailMessageMarkBounced implements db.Queries. Running it twice leaves the row as once.
func (q *queries) EmailMessageMarkBounced(ctx context.Context, params *db.EmailMessageMarkBouncedParams) error {
	n, err := run(ctx, q, true, func(ctx context.Context) (int64, error) {
		return sqlc.EmailMessageMarkBounced(ctx, q.dbtx, dbsqlc.EmailMessageMarkBouncedParams{
			Now:           params.Now,
			BounceType:    params.BounceType,
			BounceSubType: params.BounceSubType,
			JobID:         params.JobID,
		})
	})
	return updated("marking email message bounced", n, err)
}

// EmailMessageRekey implements db.Queries.
func (q *queries) EmailMessageRekey(ctx context.Context, params *db.EmailMessageRekeyParams) error {
	n, err := run(ctx, q, true, func(ctx context.Context) (int64, error) {
		return sqlc.EmailMessageRekey(ctx, q.dbtx, dbsqlc.EmailMessageRekeyParams{
			IdempotencyKey: params.IdempotencyKey,
			Now:            params.Now,
			Locale:         params.Locale,
			PayloadSHA256:  params.PayloadSHA256,
			JobID:          params.JobID,
		})
	})
	return updated("giving email message a new key", n, err)
}

// EmailMessageGetByProviderID implements db.Queries.
func (q *queries) EmailMessageGetByProviderID(ctx context.Context, providerID string) (*db.EmailMessage, error) {
	message, err := run(ctx, q, true, func(ctx context.Context) (*dbsqlc.EmailMessage, error) {
		return sqlc.EmailMessageGetByProviderID(ctx, q.dbtx, providerID)
	})
	return (*db.EmailMessage)(message), wrap("getting email message by provider id", err)
}

// EmailMessageListByUser implements db.Queries.
func (q *queries) EmailMessageListByUser(ctx context.Context, userID int64, limit int) ([]*db.EmailMessage, error) {
	rows, err := run(ctx, q, true, func(ctx context.Context) ([]*dbsqlc.EmailMessage, error) {
		return sqlc.EmailMessageListByUser(ctx, q.dbtx, dbsqlc.EmailMessageListByUserParams{UserID: userID, Max: int64(limit)})
	})
	if err != nil {
		return nil, wrap("listing a user's email messages", err)
	}
	messages := make([]*db.EmailMessage, len(rows))
	for i, row := range rows {
		messages[i] = (*db.EmailMessage)(row)
	}
	return messages, nil
}

// EmailMessageMarkSuppressed implements db.Queries. Running it twice leaves the row as once.
func (q *queries) EmailMessageMarkSuppressed(ctx context.Context, params *db.EmailMessageMarkSuppressedParams) (bool, error) {
	n, err := run(ctx, q, true, func(ctx context.Context) (int64, error) {
		return sqlc.EmailMessageMarkSuppressed(ctx, q.dbtx, dbsqlc.EmailMessageMarkSuppressedParams(*params))
	})
	return n > 0, wrap("marking email message suppressed", err)
}

// EmailMessageSetLifecycle implements db.Queries. It writes given values, so it may run again.
func (q *queries) EmailMessageSetLifecycle(ctx context.Context, params *db.EmailMessageLifecycleParams) error {
	n, err := run(ctx, q, true, func(ctx context.Context) (int64, error) {
		return sqlc.EmailMessageSetLifecycle(ctx, q.dbtx, dbsqlc.EmailMessageSetLifecycleParams(*params))
	})
	return updated("setting email message lifecycle", n, err)
}

// EmailSuppressionDelete implements db.Queries.
func (q *queries) EmailSuppressionDelete(ctx context.Context, addressHash []byte) (bool, error) {
	n, err := run(ctx, q, true, func(ctx context.Context) (int64, error) {
		return sqlc.EmailSuppressionDelete(ctx, q.dbtx, addressHash)
	})
	return n > 0, wrap("deleting email suppression", err)
}

// EmailSuppressionGet implements db.Queries.
func (q *queries) EmailSuppressionGet(ctx context.Context, addressHash []byte) (*db.EmailSuppression, error) {
	suppression, err := run(ctx, q, true, func(ctx context.Context) (*dbsqlc.EmailSuppression, error) {
		return sqlc.EmailSuppressionGet(ctx, q.dbtx, addressHash)
	})
	return (*db.EmailSuppression)(suppression), wrap("getting email suppression", err)
}

// EmailSuppressionInsert implements db.Queries. An address on the list already is left as it
// is, so it may run again.
func (q *queries) EmailSuppressionInsert(ctx context.Context, params *db.EmailSuppressionInsertParams) error {
	_, err := run(ctx, q, true, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, sqlc.EmailSuppressionInsert(ctx, q.dbtx, dbsqlc.EmailSuppressionInsertParams(*params))
	})
	return wrap("inserting email suppression", err)
}

// EmailSuppressionList implements db.Queries.
func (q *queries) EmailSuppressionList(ctx context.Context, params *db.EmailSuppressionListParams) ([]*db.EmailSuppression, error) {
	rows, err := run(ctx, q, true, func(ctx context.Context) ([]*dbsqlc.EmailSuppression, error) {
		return sqlc.EmailSuppressionList(ctx, q.dbtx, dbsqlc.EmailSuppressionListParams{
			BeforeAt:   params.BeforeAt,
			BeforeHash: params.BeforeHash,
			Max:        int64(params.Max),
		})
	})
	if err != nil {
		return nil, wrap("listing email suppressions", err)
	}
	suppressions := make([]*db.EmailSuppression, len(rows))
	for i, row := range rows {
		suppressions[i] = (*db.EmailSuppression)(row)
	}
	return suppressions, nil
}

// EmailTokenConsume implements db.Queries.
func (q *queries) EmailTokenConsume(ctx context.Context, tokenHash []byte, purpose db.TokenPurpose, now time.Time) (int64, error) {
	userID, err := run(ctx, q, false, func(ctx context.Context) (int64, error) {
		return sqlc.EmailTokenConsume(ctx, q.dbtx, dbsqlc.EmailTokenConsumeParams{Now: now, TokenHash: tokenHash, Purpose: purpose})
	})
	return userID, wrap("consuming email token", err)
}

// EmailTokenDeleteByJob implements db.Queries.
func (q *queries) EmailTokenDeleteByJob(ctx context.Context, jobID int64) error {
	_, err := run(ctx, q, true, func(ctx context.Context) (int64, error) {
		return sqlc.EmailTokenDeleteByJob(ctx, q.dbtx, jobID)
	})
	return wrap("deleting email token", err)
}

// EmailTokenDeleteExpired implements db.Queries.
func (q *queries) EmailTokenDeleteExpired(ctx context.Context, before time.Time, limit int) (int64, error) {
	n, err := run(ctx, q, false, func(ctx context.Context) (int64, error) {
		return sqlc.EmailTokenDeleteExpired(ctx, q.dbtx, dbsqlc.EmailTokenDeleteExpiredParams{Before: before, Max: int64(limit)})
	})
	return n, wrap("deleting expired email tokens", err)
}

// EmailTokenEraseSealed implements db.Queries.
func (q *queries) EmailTokenEraseSealed(ctx context.Context, jobID int64) error {
	_, err := run(ctx, q, true, func(ctx context.Context) (int64, error) {
		return sqlc.EmailTokenEraseSealed(ctx, q.dbtx, jobID)
	})
	return wrap("erasing sealed token", err)
}

// EmailTokenEraseSealedBefore implements db.Queries.
func (q *queries) EmailTokenEraseSealedBefore(ctx context.Context, before time.Time, limit int) (int64, error) {
	n, err := run(ctx, q, false, func(ctx context.Context) (int64, error) {
		return sqlc.EmailTokenEraseSealedBefore(ctx, q.dbtx, dbsqlc.EmailTokenEraseSealedBeforeParams{Before: before, Max: int64(limit)})
	})
	return n, wrap("erasing old sealed tokens", err)
}

// EmailTokenGetByJob implements db.Queries.
func (q *queries) EmailTokenGetByJob(ctx context.Context, jobID int64) (*db.EmailToken, error) {
	token, err := run(ctx, q, true, func(ctx context.Context) (*dbsqlc.EmailToken, error) {
		return sqlc.EmailTokenGetByJob(ctx, q.dbtx, jobID)
	})
	return (*db.EmailToken)(token), wrap("getting email token", err)
}

// EmailTokenInsert implements db.Queries.
func (q *queries) EmailTokenInsert(ctx context.Context, params *db.EmailTokenInsertParams) error {
	// Not idempotent (job_id is unique): it runs again only when nothing was sent.
	_, err := run(ctx, q, false, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, sqlc.EmailTokenInsert(ctx, q.dbtx, dbsqlc.EmailTokenInsertParams(*params))
	})
	return wrap("inserting email token", err)
}

// EmailTokenLookup implements db.Queries.
func (q *queries) EmailTokenLookup(ctx context.Context, tokenHash []byte, purpose db.TokenPurpose, now time.Time) (*db.TokenOwner, error) {
	row, err := run(ctx, q, true, func(ctx context.Context) (*dbsqlc.EmailTokenLookupRow, error) {
		return sqlc.EmailTokenLookup(ctx, q.dbtx, dbsqlc.EmailTokenLookupParams{TokenHash: tokenHash, Purpose: purpose, Now: now})
	})
	if err != nil {
		return nil, wrap("looking up email token", err)
	}
	return &db.TokenOwner{UserID: row.UserID, Locale: row.Locale}, nil
}

// EmailTokenInvalidateUser implements db.Queries.
func (q *queries) EmailTokenInvalidateUser(ctx context.Context, userID int64, purpose db.TokenPurpose, now time.Time) error {
	_, err := run(ctx, q, false, func(ctx context.Context) (int64, error) {
		return sqlc.EmailTokenInvalidateUser(ctx, q.dbtx, dbsqlc.EmailTokenInvalidateUserParams{Now: now, UserID: userID, Purpose: purpose})
	})
	return wrap("invalidating email tokens", err)
}

// RateLimitCounterDeleteExpired implements db.Queries.
func (q *queries) RateLimitCounterDeleteExpired(ctx context.Context, before time.Time, limit int) (int64, error) {
	n, err := run(ctx, q, false, func(ctx context.Context) (int64, error) {
		return sqlc.RateLimitCounterDeleteExpired(ctx, q.dbtx, dbsqlc.RateLimitCounterDeleteExpiredParams{Before: before, Max: int64(limit)})
	})
	return n, wrap("deleting expired rate limit counters", err)
}

// RateLimitDeviceRevocationUpsert implements db.Queries. Running it twice records a later time
// than once, which revokes at most a token issued in between: it may run again after a lost
// answer.
func (q *queries) RateLimitDeviceRevocationUpsert(ctx context.Context, keyHash []byte) error {
	_, err := run(ctx, q, true, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, sqlc.RateLimitDeviceRevocationUpsert(ctx, q.dbtx, keyHash)
	})
	return wrap("revoking devices", err)
}

// RateLimitDeviceRevocationGet implements db.Queries: no row is the Unix epoch.
func (q *queries) RateLimitDeviceRevocationGet(ctx context.Context, keyHash []byte) (time.Time, error) {
	revokedAt, err := run(ctx, q, true, func(ctx context.Context) (time.Time, error) {
		return sqlc.RateLimitDeviceRevocationGet(ctx, q.dbtx, keyHash)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Unix(0, 0).UTC(), nil
	}
	return revokedAt, wrap("reading device revocation", err)
}

// RateLimitDeviceRevocationDeleteBefore implements db.Queries.
func (q *queries) RateLimitDeviceRevocationDeleteBefore(ctx context.Context, before time.Time, limit int) (int64, error) {
	n, err := run(ctx, q, false, func(ctx context.Context) (int64, error) {
		return sqlc.RateLimitDeviceRevocationDeleteBefore(ctx, q.dbtx, dbsqlc.RateLimitDeviceRevocationDeleteBeforeParams{Before: before, Max: int64(limit)})
	})
	return n, wrap("deleting old device revocations", err)
}

// WebhookEventDeleteBefore implements db.Queries.
func (q *queries) WebhookEventDeleteBefore(ctx context.Context, before time.Time, limit int) (int64, error) {
	n, err := run(ctx, q, false, func(ctx context.Context) (int64, error) {
		return sqlc.WebhookEventDeleteBefore(ctx, q.dbtx, dbsqlc.WebhookEventDeleteBeforeParams{Before: before, Max: int64(limit)})
	})
	return n, wrap("deleting old webhook events", err)
}

// WebhookEventInsert implements db.Queries. Not run again after a lost answer: the second run
// would take the first's row for a replay.
func (q *queries) WebhookEventInsert(ctx context.Context, svixID string, now time.Time) error {
	n, err := run(ctx, q, false, func(ctx context.Context) (int64, error) {
		return sqlc.WebhookEventInsert(ctx, q.dbtx, dbsqlc.WebhookEventInsertParams{SvixID: svixID, Now: now})
	})
	if err == nil && n == 0 {
		return fmt.Errorf("error recording webhook event %q: %w", svixID, db.ErrExists)
	}
	return wrap("recording webhook event", err)
}

// SendPacerReserve implements db.Queries: in one statement shared by every process, on the
// database's clock (clock_timestamp()). It runs again only when nothing was sent: a retry after a
// lost answer would take a second slot.
func (q *queries) SendPacerReserve(ctx context.Context, name string, interval time.Duration) (time.Time, time.Time, error) {
	if interval <= 0 {
		return time.Time{}, time.Time{}, fmt.Errorf("send pacer interval must be positive, got %s", interval)
	}
	intervalUS := interval.Microseconds()
	row, err := run(ctx, q, false, func(ctx context.Context) (*dbsqlc.SendPacerReserveRow, error) {
		return sqlc.SendPacerReserve(ctx, q.dbtx, dbsqlc.SendPacerReserveParams{Name: name, IntervalUs: intervalUS})
	})
	if err != nil {
		return time.Time{}, time.Time{}, wrap("reserving send slot", err)
	}
	return time.UnixMicro(row.TatUs - intervalUS).UTC(), time.UnixMicro(row.NowUs).UTC(), nil
}

// Now implements db.Queries: clock_timestamp(), the clock SendPacerReserve schedules on.
func (q *queries) Now(ctx context.Context) (time.Time, error) {
	nowUS, err := run(ctx, q, true, func(ctx context.Context) (int64, error) {
		return sqlc.SendPacerNow(ctx, q.dbtx)
	})
	if err != nil {
		return time.Time{}, wrap("reading the database's clock", err)
	}
	return time.UnixMicro(nowUS).UTC(), nil
}

// UserGetByEmail implements db.Queries.
func (q *queries) UserGetByEmail(ctx context.Context, email string) (*db.User, error) {
	user, err := run(ctx, q, true, func(ctx context.Context) (*dbsqlc.User, error) {
		return sqlc.UserGetByEmail(ctx, q.dbtx, email)
	})
	return (*db.User)(user), wrap("getting user by email", err)
}

// UserGetByID implements db.Queries.
func (q *queries) UserGetByID(ctx context.Context, id int64) (*db.User, error) {
	user, err := run(ctx, q, true, func(ctx context.Context) (*dbsqlc.User, error) {
		return sqlc.UserGetByID(ctx, q.dbtx, id)
	})
	return (*db.User)(user), wrap("getting user by id", err)
}

// UserInsert implements db.Queries.
func (q *queries) UserInsert(ctx context.Context, params *db.UserInsertParams) (*db.User, error) {
	user, err := run(ctx, q, false, func(ctx context.Context) (*dbsqlc.User, error) {
		return sqlc.UserInsert(ctx, q.dbtx, dbsqlc.UserInsertParams(*params))
	})
	if errors.Is(err, pgx.ErrNoRows) { // ON CONFLICT DO NOTHING: the transaction stays usable
		return nil, db.ErrEmailTaken
	}
	return (*db.User)(user), wrap("inserting user", err)
}

// UserMarkEmailVerified implements db.Queries.
func (q *queries) UserMarkEmailVerified(ctx context.Context, id int64, now time.Time) (string, error) {
	locale, err := run(ctx, q, false, func(ctx context.Context) (string, error) {
		return sqlc.UserMarkEmailVerified(ctx, q.dbtx, dbsqlc.UserMarkEmailVerifiedParams{Now: now, ID: id})
	})
	return locale, wrap("marking email verified", err)
}

// UserSetPassword implements db.Queries.
func (q *queries) UserSetPassword(ctx context.Context, id int64, passwordHash string, now time.Time) error {
	n, err := run(ctx, q, false, func(ctx context.Context) (int64, error) {
		return sqlc.UserSetPassword(ctx, q.dbtx, dbsqlc.UserSetPasswordParams{PasswordHash: passwordHash, Now: now, ID: id})
	})
	return updated("setting password", n, err)
}

// UserUnsubscribe implements db.Queries.
func (q *queries) UserUnsubscribe(ctx context.Context, id int64, now time.Time) (string, error) {
	locale, err := run(ctx, q, false, func(ctx context.Context) (string, error) {
		return sqlc.UserUnsubscribe(ctx, q.dbtx, dbsqlc.UserUnsubscribeParams{Now: now, ID: id})
	})
	return locale, wrap("unsubscribing user", err)
}

// counters runs the rate limiter's statements on the rate-limit pool (synchronous_commit off),
// under the retry rule.
type counters struct {
	pool *pgxpool.Pool
}

// RateLimitCounterConsume implements db.Counters. When the window is at its limit, ok is false,
// nothing is counted, and count is the limit.
func (c *counters) RateLimitCounterConsume(ctx context.Context, params *db.RateLimitCounterConsumeParams) (int64, bool, error) {
	// Run again after a lost session (see the retry rule): twice, it may count the request twice,
	// as the client's retry of a 503 would, and never lets one past the limit.
	count, err := retryOnce(ctx, true, func(ctx context.Context) (int64, error) {
		return sqlc.RateLimitCounterConsume(ctx, c.pool, dbsqlc.RateLimitCounterConsumeParams(*params))
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return params.LimitCount, false, nil
	}
	return count, err == nil, wrap("consuming rate limit counter", err)
}

// RateLimitCounterConsumeChain implements db.Counters in one statement, and so one round trip,
// on the rate-limit pool: the user is read on it too (a read does not care for its commits).
// db's Tables checked the chain and spend a chain of one window with RateLimitCounterConsume.
func (c *counters) RateLimitCounterConsumeChain(ctx context.Context, params *db.RateLimitCounterChainParams) (*db.RateLimitCounterChainResult, error) {
	arg := chainArgs(params)
	// Run again after a lost session, as RateLimitCounterConsume is.
	result, err := retryOnce(ctx, true, func(ctx context.Context) (*db.RateLimitCounterChainResult, error) {
		if params.UserEmail == "" {
			row, err := sqlc.RateLimitCounterConsumeChain(ctx, c.pool, arg)
			if err != nil {
				return nil, err
			}
			return chainResult(params, row.DeviceTrusted, nil, row.Count1, row.Count2, row.Count3), nil
		}
		row, err := sqlc.RateLimitCounterConsumeChainUser(ctx, c.pool, dbsqlc.RateLimitCounterConsumeChainUserParams{
			UserEmail: params.UserEmail,
			KeyHash1:  arg.KeyHash1, WindowStart1: arg.WindowStart1, WindowEnd1: arg.WindowEnd1, LimitCount1: arg.LimitCount1,
			KeyHash2: arg.KeyHash2, WindowStart2: arg.WindowStart2, WindowEnd2: arg.WindowEnd2, LimitCount2: arg.LimitCount2,
			KeyHash3: arg.KeyHash3, WindowStart3: arg.WindowStart3, WindowEnd3: arg.WindowEnd3, LimitCount3: arg.LimitCount3,
			DeviceKeyHash: arg.DeviceKeyHash, DeviceRevocationHash: arg.DeviceRevocationHash, DeviceSince: arg.DeviceSince, DeviceWindow: arg.DeviceWindow,
		})
		if err != nil {
			return nil, err
		}
		var user *db.User
		if row.UserID != nil {
			user = &db.User{
				ID:              *row.UserID,
				Email:           *row.UserEmail,
				Name:            *row.UserName,
				PasswordHash:    *row.UserPasswordHash,
				EmailVerifiedAt: row.UserEmailVerifiedAt,
				UnsubscribedAt:  row.UserUnsubscribedAt,
				CreatedAt:       *row.UserCreatedAt,
				UpdatedAt:       *row.UserUpdatedAt,
				Locale:          *row.UserLocale,
			}
		}
		return chainResult(params, row.DeviceTrusted, user, row.Count1, row.Count2, row.Count3), nil
	})
	if err != nil {
		return nil, wrap("consuming rate limit counters", err)
	}
	return result, nil
}

// RateLimitCounterConsumeBatch implements db.Counters in one statement, and so one round trip, on
// the rate-limit pool, the users read in it when a chain asks for one. Like a chain, it runs
// again after a lost session: a statement is atomic, so the first run spent all or nothing.
func (c *counters) RateLimitCounterConsumeBatch(ctx context.Context, chains []*db.RateLimitCounterChainParams) ([]*db.RateLimitCounterChainResult, error) {
	arg, lookup := batchArgs(chains)
	results, err := retryOnce(ctx, true, func(ctx context.Context) ([]*db.RateLimitCounterChainResult, error) {
		results := make([]*db.RateLimitCounterChainResult, len(chains))
		if !lookup {
			rows, err := sqlc.RateLimitCounterConsumeBatch(ctx, c.pool, arg.RateLimitCounterConsumeBatchParams)
			if err != nil {
				return nil, err
			}
			for _, row := range rows {
				i := row.Ord - 1
				results[i] = chainResult(chains[i], row.DeviceTrusted, nil, row.Count1, row.Count2, row.Count3)
			}
			return results, nil
		}
		rows, err := sqlc.RateLimitCounterConsumeBatchUser(ctx, c.pool, dbsqlc.RateLimitCounterConsumeBatchUserParams{
			UserEmails: arg.userEmails,
			KeyHashes1: arg.KeyHashes1, WindowStarts1: arg.WindowStarts1, WindowEnds1: arg.WindowEnds1, LimitCounts1: arg.LimitCounts1,
			KeyHashes2: arg.KeyHashes2, WindowStarts2: arg.WindowStarts2, WindowEnds2: arg.WindowEnds2, LimitCounts2: arg.LimitCounts2,
			KeyHashes3: arg.KeyHashes3, WindowStarts3: arg.WindowStarts3, WindowEnds3: arg.WindowEnds3, LimitCounts3: arg.LimitCounts3,
			DeviceKeyHashes: arg.DeviceKeyHashes, DeviceRevocationHashes: arg.DeviceRevocationHashes, DeviceSinces: arg.DeviceSinces, DeviceWindows: arg.DeviceWindows,
		})
		if err != nil {
			return nil, err
		}
		for _, row := range rows {
			var user *db.User
			if row.UserID != nil {
				user = &db.User{
					ID:              *row.UserID,
					Email:           *row.UserEmail,
					Name:            *row.UserName,
					PasswordHash:    *row.UserPasswordHash,
					EmailVerifiedAt: row.UserEmailVerifiedAt,
					UnsubscribedAt:  row.UserUnsubscribedAt,
					CreatedAt:       *row.UserCreatedAt,
					UpdatedAt:       *row.UserUpdatedAt,
					Locale:          *row.UserLocale,
				}
			}
			i := row.Ord - 1
			results[i] = chainResult(chains[i], row.DeviceTrusted, user, row.Count1, row.Count2, row.Count3)
		}
		return results, nil
	})
	if err != nil {
		return nil, wrap("consuming rate limit counters of a batch", err)
	}
	return results, nil
}

// batchParams are the batch statement's arguments, and the users' emails of its variant that
// reads them.
type batchParams struct {
	dbsqlc.RateLimitCounterConsumeBatchParams
	userEmails []string
}

// batchArgs are the batch statement's arguments for chains (each checked by db's Tables): the
// i-th element of each array is chain i's, a window past a chain's last one a NULL key (and a
// zero time and limit, never read), no device a NULL bucket. lookup says a chain reads a user.
func batchArgs(chains []*db.RateLimitCounterChainParams) (arg batchParams, lookup bool) {
	n := len(chains)
	a := &arg.RateLimitCounterConsumeBatchParams
	keys := [db.RateLimitChainMax]*[][]byte{&a.KeyHashes1, &a.KeyHashes2, &a.KeyHashes3}
	starts := [db.RateLimitChainMax]*[]time.Time{&a.WindowStarts1, &a.WindowStarts2, &a.WindowStarts3}
	ends := [db.RateLimitChainMax]*[]time.Time{&a.WindowEnds1, &a.WindowEnds2, &a.WindowEnds3}
	limits := [db.RateLimitChainMax]*[]int64{&a.LimitCounts1, &a.LimitCounts2, &a.LimitCounts3}
	for w := range db.RateLimitChainMax {
		*keys[w], *starts[w], *ends[w], *limits[w] = make([][]byte, n), make([]time.Time, n), make([]time.Time, n), make([]int64, n)
	}
	a.DeviceKeyHashes, a.DeviceRevocationHashes = make([][]byte, n), make([][]byte, n)
	a.DeviceSinces, a.DeviceWindows = make([]time.Time, n), make([]int32, n)
	arg.userEmails = make([]string, n)
	for i, chain := range chains {
		for w, window := range chain.Windows {
			(*keys[w])[i], (*starts[w])[i], (*ends[w])[i], (*limits[w])[i] = window.KeyHash, window.WindowStart, window.WindowEnd, window.LimitCount
		}
		device := deviceArgsOf(chain.Device)
		a.DeviceKeyHashes[i], a.DeviceRevocationHashes[i], a.DeviceSinces[i] = device.keyHash, device.revocationHash, device.since
		a.DeviceWindows[i] = int32(device.window) //nolint:gosec // 0 to db.RateLimitChainMax
		arg.userEmails[i] = chain.UserEmail
		lookup = lookup || chain.UserEmail != ""
	}
	return arg, lookup
}

// chainResult is the result of a chain of params whose statement returned counts (0 for a window
// that refused or was not spent), whether the device was trusted, and user.
func chainResult(params *db.RateLimitCounterChainParams, deviceTrusted bool, user *db.User, counts ...int64) *db.RateLimitCounterChainResult {
	result := &db.RateLimitCounterChainResult{DeviceTrusted: deviceTrusted, User: user}
	for _, count := range counts[:len(params.Windows)] {
		if count == 0 {
			break
		}
		result.Counts = append(result.Counts, count)
	}
	return result
}

// chainArgs are the statement's arguments for params (1 to db.RateLimitChainMax windows, checked
// by db's Tables): its unused windows' keys NULL.
func chainArgs(params *db.RateLimitCounterChainParams) dbsqlc.RateLimitCounterConsumeChainParams {
	var w [db.RateLimitChainMax]db.RateLimitCounterConsumeParams
	copy(w[:], params.Windows)
	arg := dbsqlc.RateLimitCounterConsumeChainParams{
		KeyHash1: w[0].KeyHash, WindowStart1: w[0].WindowStart, WindowEnd1: w[0].WindowEnd, LimitCount1: w[0].LimitCount,
		KeyHash2: w[1].KeyHash, WindowStart2: w[1].WindowStart, WindowEnd2: w[1].WindowEnd, LimitCount2: w[1].LimitCount,
		KeyHash3: w[2].KeyHash, WindowStart3: w[2].WindowStart, WindowEnd3: w[2].WindowEnd, LimitCount3: w[2].LimitCount,
	}
	device := deviceArgsOf(params.Device)
	arg.DeviceKeyHash, arg.DeviceRevocationHash, arg.DeviceSince, arg.DeviceWindow = device.keyHash, device.revocationHash, device.since, int32(device.window) //nolint:gosec // 0 to db.RateLimitChainMax
	return arg
}

// deviceArgs are a device's parameters as the statements take them: no device is a NULL bucket
// (never trusted) and window 0; window is 1-based, as SQL's ordinality.
type deviceArgs struct {
	keyHash, revocationHash []byte
	since                   time.Time
	window                  int64
}

func deviceArgsOf(device *db.RateLimitDeviceParams) deviceArgs {
	if device == nil {
		return deviceArgs{since: time.Unix(0, 0)}
	}
	return deviceArgs{keyHash: device.KeyHash, revocationHash: device.RevocationHash, since: device.Since, window: int64(device.Window) + 1}
}

// windowsArgs are params' windows and device as the statements over several windows
// (RateLimitCounterGetMany, RateLimitCounterRefund, RateLimitCounterDeleteMany) take them: the
// three have the same parameters, so each converts this struct to its own.
func windowsArgs(params *db.RateLimitCounterWindowsParams) dbsqlc.RateLimitCounterGetManyParams {
	device := deviceArgsOf(params.Device)
	arg := dbsqlc.RateLimitCounterGetManyParams{
		DeviceKeyHash:        device.keyHash,
		DeviceRevocationHash: device.revocationHash,
		DeviceSince:          device.since,
		DeviceWindow:         device.window,
		KeyHashes:            make([][]byte, len(params.Windows)),
		WindowStarts:         make([]time.Time, len(params.Windows)),
	}
	for i, w := range params.Windows {
		arg.KeyHashes[i], arg.WindowStarts[i] = w.KeyHash, w.WindowStart
	}
	return arg
}

// RateLimitCounterGet implements db.Counters: no row is a count of 0.
func (c *counters) RateLimitCounterGet(ctx context.Context, params *db.RateLimitCounterGetParams) (int64, error) {
	count, err := retryOnce(ctx, true, func(ctx context.Context) (int64, error) {
		return sqlc.RateLimitCounterGet(ctx, c.pool, dbsqlc.RateLimitCounterGetParams{KeyHash: params.KeyHash, WindowStart: params.WindowStart})
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return count, wrap("reading rate limit counter", err)
}

// RateLimitCounterGetMany implements db.Counters in one statement, the device checked in it.
func (c *counters) RateLimitCounterGetMany(ctx context.Context, params *db.RateLimitCounterWindowsParams) (*db.RateLimitCounterGetManyResult, error) {
	arg := windowsArgs(params)
	rows, err := retryOnce(ctx, true, func(ctx context.Context) ([]*dbsqlc.RateLimitCounterGetManyRow, error) {
		return sqlc.RateLimitCounterGetMany(ctx, c.pool, arg)
	})
	if err != nil {
		return nil, wrap("reading rate limit counters", err)
	}
	result := &db.RateLimitCounterGetManyResult{Counts: make([]int64, len(params.Windows))}
	for _, row := range rows {
		result.Counts[row.Ord-1] = row.Count
		result.DeviceTrusted = row.DeviceTrusted
	}
	return result, nil
}

// RateLimitCounterRefund implements db.Counters in one statement, the device checked in it. Not
// idempotent: a retry after a lost answer would give back twice.
func (c *counters) RateLimitCounterRefund(ctx context.Context, params *db.RateLimitCounterWindowsParams) (bool, error) {
	arg := dbsqlc.RateLimitCounterRefundParams(windowsArgs(params))
	row, err := retryOnce(ctx, false, func(ctx context.Context) (*dbsqlc.RateLimitCounterRefundRow, error) {
		return sqlc.RateLimitCounterRefund(ctx, c.pool, arg)
	})
	if err != nil {
		return false, wrap("refunding rate limit counters", err)
	}
	return row.DeviceTrusted, nil
}

// RateLimitCounterDeleteMany implements db.Counters in one statement, the device checked in it.
// Deleting twice leaves what deleting once does, so it may run again after a lost answer.
func (c *counters) RateLimitCounterDeleteMany(ctx context.Context, params *db.RateLimitCounterWindowsParams) (bool, error) {
	arg := dbsqlc.RateLimitCounterDeleteManyParams(windowsArgs(params))
	row, err := retryOnce(ctx, true, func(ctx context.Context) (*dbsqlc.RateLimitCounterDeleteManyRow, error) {
		return sqlc.RateLimitCounterDeleteMany(ctx, c.pool, arg)
	})
	if err != nil {
		return false, wrap("deleting rate limit counters", err)
	}
	return row.DeviceTrusted, nil
}

// RateLimitCounterDelete implements db.Counters. Deleting twice leaves what deleting once does,
// so it may run again after a lost answer.
func (c *counters) RateLimitCounterDelete(ctx context.Context, params *db.RateLimitCounterDeleteParams) error {
	_, err := retryOnce(ctx, true, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, sqlc.RateLimitCounterDelete(ctx, c.pool, dbsqlc.RateLimitCounterDeleteParams{KeyHash: params.KeyHash, WindowStart: params.WindowStart})
	})
	return wrap("deleting rate limit counter", err)
}

// SecretCheckRecord implements db.Queries. Both statements may run again after a lost answer:
// the insert does nothing once a value is recorded.
func (q *queries) SecretCheckRecord(ctx context.Context, params *db.SecretCheckParams) ([]byte, error) {
	_, err := run(ctx, q, true, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, sqlc.SecretCheckInsert(ctx, q.dbtx, dbsqlc.SecretCheckInsertParams(*params))
	})
	if err != nil {
		return nil, wrap("recording the secret's check value", err)
	}
	recorded, err := run(ctx, q, true, func(ctx context.Context) ([]byte, error) { return sqlc.SecretCheckGet(ctx, q.dbtx) })
	return recorded, wrap("reading the secret's check value", err)
}

// SecretCheckReplace implements db.Queries. Running it twice leaves what running it once does.
func (q *queries) SecretCheckReplace(ctx context.Context, params *db.SecretCheckParams) error {
	_, err := run(ctx, q, true, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, sqlc.SecretCheckReplace(ctx, q.dbtx, dbsqlc.SecretCheckReplaceParams(*params))
	})
	return wrap("replacing the secret's check value", err)
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

// RateLimitCounterConns is how many statements of checks may run at once: the rate-limit pool's
// connections (db's Tables batch the checks that arrive while all of them are taken).
func (c *counters) RateLimitCounterConns() int { return int(c.pool.Config().MaxConns) }
