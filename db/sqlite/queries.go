package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/sqlite/dbsqlc"
)

// sqlc is the app's generated statements; each call names its executor.
var sqlc = dbsqlc.New() //nolint:gochecknoglobals // stateless

// queries runs the app's statements, and the rate limiter's, on dbtx: the engine's *sql.DB or a
// transaction. The app's tables keep times as INTEGER unix microseconds (they compare and sort
// as numbers, with no text format to agree on): us and at convert them.
type queries struct {
	dbtx dbsqlc.DBTX
	// stmts are the batch of checks' prepared statements: the engine's counters' only.
	stmts *stmtCache
}

// Users.

// UserInsert implements db.Queries.
func (q *queries) UserInsert(ctx context.Context, params *db.UserInsertParams) (*db.User, error) {
	row, err := sqlc.UserInsert(ctx, q.dbtx, dbsqlc.UserInsertParams{
		Email:        params.Email,
		Name:         params.Name,
		PasswordHash: params.PasswordHash,
		Locale:       params.Locale,
		Now:          us(params.Now),
	})
	if errors.Is(err, sql.ErrNoRows) { // ON CONFLICT DO NOTHING
		return nil, db.ErrEmailTaken
	}
	return user(row, err, "inserting user")
}

// UserGetByEmail implements db.Queries.
func (q *queries) UserGetByEmail(ctx context.Context, email string) (*db.User, error) {
	row, err := sqlc.UserGetByEmail(ctx, q.dbtx, email)
	return user(row, err, "getting user by email")
}

// UserGetByID implements db.Queries.
func (q *queries) UserGetByID(ctx context.Context, id int64) (*db.User, error) {
	row, err := sqlc.UserGetByID(ctx, q.dbtx, id)
	return user(row, err, "getting user by id")
}

// UserMarkEmailVerified implements db.Queries.
func (q *queries) UserMarkEmailVerified(ctx context.Context, id int64, now time.Time) (string, error) {
	locale, err := sqlc.UserMarkEmailVerified(ctx, q.dbtx, dbsqlc.UserMarkEmailVerifiedParams{ID: id, Now: us(now)})
	return locale, failed("marking email verified", err)
}

// UserSetPassword implements db.Queries.
func (q *queries) UserSetPassword(ctx context.Context, id int64, passwordHash string, now time.Time) error {
	return mustUpdate(sqlc.UserSetPassword(ctx, q.dbtx, dbsqlc.UserSetPasswordParams{ID: id, PasswordHash: passwordHash, Now: us(now)}))("setting password")
}

// UserUnsubscribe implements db.Queries.
func (q *queries) UserUnsubscribe(ctx context.Context, id int64, now time.Time) (string, error) {
	locale, err := sqlc.UserUnsubscribe(ctx, q.dbtx, dbsqlc.UserUnsubscribeParams{ID: id, Now: us(now)})
	return locale, failed("unsubscribing user", err)
}

func user(row *dbsqlc.User, err error, doing string) (*db.User, error) {
	if err != nil {
		return nil, failed(doing, err)
	}
	return &db.User{
		ID:              row.ID,
		Email:           row.Email,
		Name:            row.Name,
		PasswordHash:    row.PasswordHash,
		EmailVerifiedAt: atPtr(row.EmailVerifiedAt),
		UnsubscribedAt:  atPtr(row.UnsubscribedAt),
		CreatedAt:       at(row.CreatedAt),
		UpdatedAt:       at(row.UpdatedAt),
		Locale:          row.Locale,
	}, nil
}

// Email tokens.

// EmailTokenInsert implements db.Queries.
func (q *queries) EmailTokenInsert(ctx context.Context, params *db.EmailTokenInsertParams) error {
	err := sqlc.EmailTokenInsert(ctx, q.dbtx, dbsqlc.EmailTokenInsertParams{
		TokenHash: params.TokenHash,
		UserID:    params.UserID,
		Purpose:   params.Purpose,
		JobID:     params.JobID,
		Sealed:    params.Sealed,
		ExpiresAt: us(params.ExpiresAt),
		Now:       us(params.Now),
	})
	return failed("inserting email token", err)
}

// EmailTokenGetByJob implements db.Queries.
func (q *queries) EmailTokenGetByJob(ctx context.Context, jobID int64) (*db.EmailToken, error) {
	row, err := sqlc.EmailTokenGetByJob(ctx, q.dbtx, jobID)
	if err != nil {
		return nil, failed("getting email token", err)
	}
	return &db.EmailToken{
		TokenHash: row.TokenHash,
		UserID:    row.UserID,
		Purpose:   row.Purpose,
		ExpiresAt: at(row.ExpiresAt),
		UsedAt:    atPtr(row.UsedAt),
		CreatedAt: at(row.CreatedAt),
		JobID:     row.JobID,
		Sealed:    row.Sealed,
	}, nil
}

// EmailTokenDeleteByJob implements db.Queries.
func (q *queries) EmailTokenDeleteByJob(ctx context.Context, jobID int64) error {
	return anyUpdate(sqlc.EmailTokenDeleteByJob(ctx, q.dbtx, jobID))("deleting email token")
}

// EmailTokenEraseSealed implements db.Queries.
func (q *queries) EmailTokenEraseSealed(ctx context.Context, jobID int64) error {
	return anyUpdate(sqlc.EmailTokenEraseSealed(ctx, q.dbtx, jobID))("erasing sealed token")
}

// EmailTokenConsume implements db.Queries.
func (q *queries) EmailTokenConsume(ctx context.Context, tokenHash []byte, purpose db.TokenPurpose, now time.Time) (int64, error) {
	nowUS := us(now)
	userID, err := sqlc.EmailTokenConsume(ctx, q.dbtx, dbsqlc.EmailTokenConsumeParams{Now: &nowUS, TokenHash: tokenHash, Purpose: purpose})
	return userID, failed("consuming email token", err)
}

// EmailTokenLookup implements db.Queries.
func (q *queries) EmailTokenLookup(ctx context.Context, tokenHash []byte, purpose db.TokenPurpose, now time.Time) (*db.TokenOwner, error) {
	row, err := sqlc.EmailTokenLookup(ctx, q.dbtx, dbsqlc.EmailTokenLookupParams{TokenHash: tokenHash, Purpose: purpose, Now: us(now)})
	if err != nil {
		return nil, failed("looking up email token", err)
	}
	return &db.TokenOwner{UserID: row.UserID, Locale: row.Locale}, nil
}

// EmailTokenInvalidateUser implements db.Queries.
func (q *queries) EmailTokenInvalidateUser(ctx context.Context, userID int64, purpose db.TokenPurpose, now time.Time) error {
	nowUS := us(now)
	return anyUpdate(sqlc.EmailTokenInvalidateUser(ctx, q.dbtx, dbsqlc.EmailTokenInvalidateUserParams{Now: &nowUS, UserID: userID, Purpose: purpose}))("invalidating email tokens")
}

// EmailTokenDeleteExpired implements db.Queries.
func (q *queries) EmailTokenDeleteExpired(ctx context.Context, before time.Time, limit int) (int64, error) {
	return counted(sqlc.EmailTokenDeleteExpired(ctx, q.dbtx, dbsqlc.EmailTokenDeleteExpiredParams{Before: us(before), Max: int64(limit)}))("deleting expired email tokens")
}

// EmailTokenEraseSealedBefore implements db.Queries.
func (q *queries) EmailTokenEraseSealedBefore(ctx context.Context, before time.Time, limit int) (int64, error) {
	return counted(sqlc.EmailTokenEraseSealedBefore(ctx, q.dbtx, dbsqlc.EmailTokenEraseSealedBeforeParams{Before: us(before), Max: int64(limit)}))("erasing old sealed tokens")
}

// Email messages.

// EmailMessageInsert implements db.Queries.
func (q *queries) EmailMessageInsert(ctx context.Context, params *db.EmailMessageInsertParams) (*db.EmailMessage, error) {
	row, err := sqlc.EmailMessageInsert(ctx, q.dbtx, dbsqlc.EmailMessageInsertParams{
		JobID:          params.JobID,
		Kind:           params.Kind,
		UserID:         params.UserID,
		IdempotencyKey: params.IdempotencyKey,
		Now:            us(params.Now),
		Locale:         params.Locale,
		PayloadSHA256:  params.PayloadSHA256,
		TraceParent:    params.TraceParent,
	})
	if errors.Is(err, sql.ErrNoRows) { // ON CONFLICT DO NOTHING
		return nil, fmt.Errorf("error inserting email message of job %d: %w", params.JobID, db.ErrExists)
	}
	return emailMessage(row, err, "inserting email message")
}

// EmailMessageGetByJob implements db.Queries.
func (q *queries) EmailMessageGetByJob(ctx context.Context, jobID int64) (*db.EmailMessage, error) {
	row, err := sqlc.EmailMessageGetByJob(ctx, q.dbtx, jobID)
	return emailMessage(row, err, "getting email message")
}

// EmailMessageRekey implements db.Queries.
func (q *queries) EmailMessageRekey(ctx context.Context, params *db.EmailMessageRekeyParams) error {
	return mustUpdate(sqlc.EmailMessageRekey(ctx, q.dbtx, dbsqlc.EmailMessageRekeyParams{
		JobID:          params.JobID,
		IdempotencyKey: params.IdempotencyKey,
		Locale:         params.Locale,
		PayloadSHA256:  params.PayloadSHA256,
		Now:            us(params.Now),
	}))("giving email message a new key")
}

// EmailMessageMarkAccepted implements db.Queries.
func (q *queries) EmailMessageMarkAccepted(ctx context.Context, params *db.EmailMessageMarkAcceptedParams) error {
	return mustUpdate(sqlc.EmailMessageMarkAccepted(ctx, q.dbtx, dbsqlc.EmailMessageMarkAcceptedParams{
		JobID:      params.JobID,
		Provider:   &params.Provider,
		ProviderID: &params.ProviderID,
		Now:        us(params.Now),
	}))("marking email message accepted")
}

// EmailMessageSetProviderInDoubt implements db.Queries.
func (q *queries) EmailMessageSetProviderInDoubt(ctx context.Context, params *db.EmailMessageSetProviderInDoubtParams) error {
	return mustUpdate(sqlc.EmailMessageSetProviderInDoubt(ctx, q.dbtx, dbsqlc.EmailMessageSetProviderInDoubtParams{
		JobID:    params.JobID,
		Provider: params.Provider,
		Now:      us(params.Now),
	}))("recording the provider an email message is handed to")
}

// EmailMessageMarkBounced implements db.Queries.
func (q *queries) EmailMessageMarkBounced(ctx context.Context, params *db.EmailMessageMarkBouncedParams) error {
	now := us(params.Now)
	return mustUpdate(sqlc.EmailMessageMarkBounced(ctx, q.dbtx, dbsqlc.EmailMessageMarkBouncedParams{
		JobID:         params.JobID,
		BounceType:    &params.BounceType,
		BounceSubType: &params.BounceSubType,
		Now:           &now,
	}))("marking email message bounced")
}

// EmailMessageDeleteBefore implements db.Queries.
func (q *queries) EmailMessageDeleteBefore(ctx context.Context, before time.Time, limit int) (int64, error) {
	return counted(sqlc.EmailMessageDeleteBefore(ctx, q.dbtx, dbsqlc.EmailMessageDeleteBeforeParams{Before: us(before), Max: int64(limit)}))("deleting old email messages")
}

// EmailMessageGetByProviderID implements db.Queries.
func (q *queries) EmailMessageGetByProviderID(ctx context.Context, providerID string) (*db.EmailMessage, error) {
	row, err := sqlc.EmailMessageGetByProviderID(ctx, q.dbtx, &providerID)
	return emailMessage(row, err, "getting email message by provider id")
}

// EmailMessageSetLifecycle implements db.Queries.
func (q *queries) EmailMessageSetLifecycle(ctx context.Context, params *db.EmailMessageLifecycleParams) error {
	return mustUpdate(sqlc.EmailMessageSetLifecycle(ctx, q.dbtx, dbsqlc.EmailMessageSetLifecycleParams{
		Status:        params.Status,
		StatusAt:      usPtr(params.StatusAt),
		SentAt:        usPtr(params.SentAt),
		DeliveredAt:   usPtr(params.DeliveredAt),
		DelayedAt:     usPtr(params.DelayedAt),
		BouncedAt:     usPtr(params.BouncedAt),
		ComplainedAt:  usPtr(params.ComplainedAt),
		SuppressedAt:  usPtr(params.SuppressedAt),
		FailedAt:      usPtr(params.FailedAt),
		BounceType:    params.BounceType,
		BounceSubType: params.BounceSubType,
		Now:           us(params.Now),
		JobID:         params.JobID,
	}))("setting email message lifecycle")
}

// EmailMessageMarkSuppressed implements db.Queries.
func (q *queries) EmailMessageMarkSuppressed(ctx context.Context, params *db.EmailMessageMarkSuppressedParams) (bool, error) {
	n, err := sqlc.EmailMessageMarkSuppressed(ctx, q.dbtx, dbsqlc.EmailMessageMarkSuppressedParams{
		JobID:          params.JobID,
		Kind:           params.Kind,
		UserID:         params.UserID,
		IdempotencyKey: params.IdempotencyKey,
		Now:            us(params.Now),
	})
	return n > 0, failed("marking email message suppressed", err)
}

// EmailMessageListByUser implements db.Queries.
func (q *queries) EmailMessageListByUser(ctx context.Context, userID int64, limit int) ([]*db.EmailMessage, error) {
	rows, err := sqlc.EmailMessageListByUser(ctx, q.dbtx, dbsqlc.EmailMessageListByUserParams{UserID: userID, Max: int64(limit)})
	if err != nil {
		return nil, failed("listing a user's email messages", err)
	}
	messages := make([]*db.EmailMessage, len(rows))
	for i, row := range rows {
		messages[i], _ = emailMessage(row, nil, "")
	}
	return messages, nil
}

func emailMessage(row *dbsqlc.EmailMessage, err error, doing string) (*db.EmailMessage, error) {
	if err != nil {
		return nil, failed(doing, err)
	}
	return &db.EmailMessage{
		JobID:           row.JobID,
		Kind:            row.Kind,
		UserID:          row.UserID,
		IdempotencyKey:  row.IdempotencyKey,
		KeyCreatedAt:    at(row.KeyCreatedAt),
		Status:          row.Status,
		ProviderID:      row.ProviderID,
		AcceptedAt:      atPtr(row.AcceptedAt),
		CreatedAt:       at(row.CreatedAt),
		UpdatedAt:       at(row.UpdatedAt),
		StatusAt:        atPtr(row.StatusAt),
		SentAt:          atPtr(row.SentAt),
		DeliveredAt:     atPtr(row.DeliveredAt),
		DelayedAt:       atPtr(row.DelayedAt),
		BouncedAt:       atPtr(row.BouncedAt),
		ComplainedAt:    atPtr(row.ComplainedAt),
		SuppressedAt:    atPtr(row.SuppressedAt),
		FailedAt:        atPtr(row.FailedAt),
		BounceType:      row.BounceType,
		BounceSubType:   row.BounceSubType,
		Locale:          row.Locale,
		PayloadSHA256:   row.PayloadSHA256,
		Provider:        row.Provider,
		ProviderInDoubt: row.ProviderInDoubt,
		TraceParent:     row.TraceParent,
	}, nil
}

// Email suppressions and webhook events.

// EmailSuppressionInsert implements db.Queries.
func (q *queries) EmailSuppressionInsert(ctx context.Context, params *db.EmailSuppressionInsertParams) error {
	err := sqlc.EmailSuppressionInsert(ctx, q.dbtx, dbsqlc.EmailSuppressionInsertParams{
		AddressHash:  params.AddressHash,
		Reason:       params.Reason,
		Detail:       params.Detail,
		EmailID:      params.EmailID,
		SuppressedAt: us(params.SuppressedAt),
		Now:          us(params.Now),
	})
	return failed("inserting email suppression", err)
}

// EmailSuppressionGet implements db.Queries.
func (q *queries) EmailSuppressionGet(ctx context.Context, addressHash []byte) (*db.EmailSuppression, error) {
	row, err := sqlc.EmailSuppressionGet(ctx, q.dbtx, addressHash)
	if err != nil {
		return nil, failed("getting email suppression", err)
	}
	return emailSuppression(row), nil
}

// EmailSuppressionDelete implements db.Queries.
func (q *queries) EmailSuppressionDelete(ctx context.Context, addressHash []byte) (bool, error) {
	n, err := sqlc.EmailSuppressionDelete(ctx, q.dbtx, addressHash)
	return n > 0, failed("deleting email suppression", err)
}

// EmailSuppressionList implements db.Queries.
func (q *queries) EmailSuppressionList(ctx context.Context, params *db.EmailSuppressionListParams) ([]*db.EmailSuppression, error) {
	rows, err := sqlc.EmailSuppressionList(ctx, q.dbtx, dbsqlc.EmailSuppressionListParams{
		BeforeAt:   us(params.BeforeAt),
		BeforeHash: params.BeforeHash,
		Max:        int64(params.Max),
	})
	if err != nil {
		return nil, failed("listing email suppressions", err)
	}
	suppressions := make([]*db.EmailSuppression, len(rows))
	for i, row := range rows {
		suppressions[i] = emailSuppression(row)
	}
	return suppressions, nil
}

func emailSuppression(row *dbsqlc.EmailSuppression) *db.EmailSuppression {
	return &db.EmailSuppression{
		AddressHash:  row.AddressHash,
		Reason:       row.Reason,
		Detail:       row.Detail,
		EmailID:      row.EmailID,
		SuppressedAt: at(row.SuppressedAt),
		CreatedAt:    at(row.CreatedAt),
	}
}

// WebhookEventInsert implements db.Queries.
func (q *queries) WebhookEventInsert(ctx context.Context, svixID string, now time.Time) error {
	n, err := sqlc.WebhookEventInsert(ctx, q.dbtx, dbsqlc.WebhookEventInsertParams{SvixID: svixID, Now: us(now)})
	if err == nil && n == 0 {
		return fmt.Errorf("error recording webhook event %q: %w", svixID, db.ErrExists)
	}
	return failed("recording webhook event", err)
}

// WebhookEventDeleteBefore implements db.Queries.
func (q *queries) WebhookEventDeleteBefore(ctx context.Context, before time.Time, limit int) (int64, error) {
	return counted(sqlc.WebhookEventDeleteBefore(ctx, q.dbtx, dbsqlc.WebhookEventDeleteBeforeParams{Before: us(before), Max: int64(limit)}))("deleting old webhook events")
}

// Rate-limit counters and the send pacer.

// RateLimitCounterConsume implements db.Counters. When the window is at its limit, ok is false,
// nothing is counted, and count is the limit.
func (q *queries) RateLimitCounterConsume(ctx context.Context, params *db.RateLimitCounterConsumeParams) (int64, bool, error) {
	count, err := sqlc.RateLimitCounterConsume(ctx, q.dbtx, dbsqlc.RateLimitCounterConsumeParams{
		KeyHash:     params.KeyHash,
		WindowStart: us(params.WindowStart),
		WindowEnd:   us(params.WindowEnd),
		LimitCount:  params.LimitCount,
	})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return params.LimitCount, false, nil
	case err != nil:
		return 0, false, failed("consuming rate limit counter", err)
	}
	return count, true, nil
}

// RateLimitCounterConsumeChain implements db.Counters. On the engine's counters it is a batch of
// one (RateLimitCounterConsumeBatch): one transaction on prepared statements, all or nothing,
// with one commit rather than one per window. Otherwise (queries on a transaction of the
// caller's) its statements run one after another on one connection, taken once, and the user is
// read on it last. SQLite runs in the process: one call is the round trip. db's Tables checked
// the chain.
func (q *queries) RateLimitCounterConsumeChain(ctx context.Context, params *db.RateLimitCounterChainParams) (*db.RateLimitCounterChainResult, error) {
	if _, ok := q.dbtx.(*sql.DB); ok && q.stmts != nil {
		results, err := q.RateLimitCounterConsumeBatch(ctx, []*db.RateLimitCounterChainParams{params})
		if err != nil {
			return nil, err
		}
		return results[0], nil
	}
	onConn, release, err := q.oneConn(ctx)
	if err != nil {
		return nil, failed("consuming rate limit counters", err)
	}
	defer release()
	trusted, err := onConn.deviceTrusted(ctx, params.Device)
	if err != nil {
		return nil, err
	}
	result := &db.RateLimitCounterChainResult{DeviceTrusted: trusted}
	for i := range params.Windows {
		window := params.Windows[i]
		if trusted && i == params.Device.Window {
			window.KeyHash = params.Device.KeyHash
		}
		count, ok, err := onConn.RateLimitCounterConsume(ctx, &window)
		if err != nil {
			return nil, err
		}
		if !ok {
			return result, nil
		}
		result.Counts = append(result.Counts, count)
	}
	if params.UserEmail != "" {
		user, err := onConn.UserGetByEmail(ctx, params.UserEmail)
		switch {
		case errors.Is(err, db.ErrNotFound):
		case err != nil:
			return nil, err
		default:
			result.User = user
		}
	}
	return result, nil
}

// RateLimitCounterConns is how many statements of checks may run at once: 1, SQLite's one
// writer (db's Tables batch the checks that arrive while it runs).
func (q *queries) RateLimitCounterConns() int { return 1 }

// RateLimitCounterGet implements db.Counters: no row is a count of 0.
func (q *queries) RateLimitCounterGet(ctx context.Context, params *db.RateLimitCounterGetParams) (int64, error) {
	count, err := sqlc.RateLimitCounterGet(ctx, q.dbtx, dbsqlc.RateLimitCounterGetParams{WindowEnd: us(params.WindowEnd), KeyHash: params.KeyHash, WindowStart: us(params.WindowStart)})
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return count, failed("reading rate limit counter", err)
}

// RateLimitCounterGetMany implements db.Counters: the device's check, then one statement per
// window, on one connection taken once, like RateLimitCounterConsumeChain.
func (q *queries) RateLimitCounterGetMany(ctx context.Context, params *db.RateLimitCounterWindowsParams) (*db.RateLimitCounterGetManyResult, error) {
	counts := make([]int64, len(params.Windows))
	trusted, err := q.eachWindow(ctx, "reading rate limit counters", params, func(onConn *queries, i int, w *db.RateLimitCounterGetParams) error {
		count, err := onConn.RateLimitCounterGet(ctx, w)
		counts[i] = count
		return err
	})
	if err != nil {
		return nil, err
	}
	return &db.RateLimitCounterGetManyResult{Counts: counts, DeviceTrusted: trusted}, nil
}

// RateLimitCounterRefund implements db.Counters: the device's check, then one statement per
// window, on one connection taken once.
func (q *queries) RateLimitCounterRefund(ctx context.Context, params *db.RateLimitCounterWindowsParams) (bool, error) {
	return q.eachWindow(ctx, "refunding rate limit counters", params, func(onConn *queries, _ int, w *db.RateLimitCounterGetParams) error {
		_, err := sqlc.RateLimitCounterRefund(ctx, onConn.dbtx, dbsqlc.RateLimitCounterRefundParams{WindowEnd: us(w.WindowEnd), KeyHash: w.KeyHash, WindowStart: us(w.WindowStart)})
		return failed("refunding rate limit counter", err)
	})
}

// RateLimitCounterDeleteMany implements db.Counters: the device's check, then one statement per
// window, on one connection taken once.
func (q *queries) RateLimitCounterDeleteMany(ctx context.Context, params *db.RateLimitCounterWindowsParams) (bool, error) {
	return q.eachWindow(ctx, "deleting rate limit counters", params, func(onConn *queries, _ int, w *db.RateLimitCounterGetParams) error {
		return onConn.RateLimitCounterDelete(ctx, &db.RateLimitCounterDeleteParams{KeyHash: w.KeyHash, WindowStart: w.WindowStart, WindowEnd: w.WindowEnd})
	})
}

// eachWindow takes one connection, checks params' device on it, and calls fn for each window in
// order (the device's own bucket in place of its window's key while it stands), outside any
// transaction: SQLite runs in the process, so the call is one round trip. It returns whether the
// device stood.
func (q *queries) eachWindow(ctx context.Context, doing string, params *db.RateLimitCounterWindowsParams, fn func(onConn *queries, i int, w *db.RateLimitCounterGetParams) error) (bool, error) {
	onConn, release, err := q.oneConn(ctx)
	if err != nil {
		return false, failed(doing, err)
	}
	defer release()
	trusted, err := onConn.deviceTrusted(ctx, params.Device)
	if err != nil {
		return false, err
	}
	for i := range params.Windows {
		window := params.Windows[i]
		if trusted && i == params.Device.Window {
			window.KeyHash = params.Device.KeyHash
		}
		if err := fn(onConn, i, &window); err != nil {
			return false, err
		}
	}
	return trusted, nil
}

// deviceTrusted says whether device stands: no revocation of its account's devices is recorded
// after the one it was issued under. No device is not trusted, and costs no statement.
func (q *queries) deviceTrusted(ctx context.Context, device *db.RateLimitDeviceParams) (bool, error) {
	if device == nil {
		return false, nil
	}
	trusted, err := sqlc.RateLimitDeviceRevocationTrusted(ctx, q.dbtx, dbsqlc.RateLimitDeviceRevocationTrustedParams{KeyHash: device.RevocationHash, Since: us(device.Since)})
	return trusted, failed("checking device revocation", err)
}

// RateLimitDeviceRevocationUpsert implements db.Queries.
func (q *queries) RateLimitDeviceRevocationUpsert(ctx context.Context, keyHash []byte) error {
	return failed("revoking devices", sqlc.RateLimitDeviceRevocationUpsert(ctx, q.dbtx, keyHash))
}

// RateLimitDeviceRevocationGet implements db.Queries: no row is the Unix epoch.
func (q *queries) RateLimitDeviceRevocationGet(ctx context.Context, keyHash []byte) (time.Time, error) {
	revokedAt, err := sqlc.RateLimitDeviceRevocationGet(ctx, q.dbtx, keyHash)
	if errors.Is(err, sql.ErrNoRows) {
		return at(0), nil
	}
	return at(revokedAt), failed("reading device revocation", err)
}

// RateLimitDeviceRevocationDeleteBefore implements db.Queries.
func (q *queries) RateLimitDeviceRevocationDeleteBefore(ctx context.Context, before time.Time, limit int) (int64, error) {
	return counted(sqlc.RateLimitDeviceRevocationDeleteBefore(ctx, q.dbtx, dbsqlc.RateLimitDeviceRevocationDeleteBeforeParams{Before: us(before), Max: int64(limit)}))("deleting old device revocations")
}

// oneConn is q on one connection of its *sql.DB, taken once for several statements, and its
// release; q itself when it runs on a connection or a transaction already.
func (q *queries) oneConn(ctx context.Context) (*queries, func(), error) {
	pool, ok := q.dbtx.(*sql.DB)
	if !ok {
		return q, func() {}, nil
	}
	conn, err := pool.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	return &queries{dbtx: conn}, func() { conn.Close() }, nil
}

// RateLimitCounterDelete implements db.Counters.
func (q *queries) RateLimitCounterDelete(ctx context.Context, params *db.RateLimitCounterDeleteParams) error {
	err := sqlc.RateLimitCounterDelete(ctx, q.dbtx, dbsqlc.RateLimitCounterDeleteParams{WindowEnd: us(params.WindowEnd), KeyHash: params.KeyHash, WindowStart: us(params.WindowStart)})
	return failed("deleting rate limit counter", err)
}

// RateLimitCounterDeleteExpired implements db.Queries.
func (q *queries) RateLimitCounterDeleteExpired(ctx context.Context, before time.Time, limit int) (int64, error) {
	return counted(sqlc.RateLimitCounterDeleteExpired(ctx, q.dbtx, dbsqlc.RateLimitCounterDeleteExpiredParams{Before: us(before), Max: int64(limit)}))("deleting expired rate limit counters")
}

// SendPacerReserve implements db.Queries: in one statement shared by every worker, on the
// database's clock (the process's own: SQLite runs in it).
func (q *queries) SendPacerReserve(ctx context.Context, name string, interval time.Duration) (time.Time, time.Time, error) {
	if interval <= 0 {
		return time.Time{}, time.Time{}, fmt.Errorf("send pacer interval must be positive, got %s", interval)
	}
	intervalUS := interval.Microseconds()
	row, err := sqlc.SendPacerReserve(ctx, q.dbtx, dbsqlc.SendPacerReserveParams{Name: name, IntervalUs: intervalUS})
	if err != nil {
		return time.Time{}, time.Time{}, failed("reserving send slot", err)
	}
	return at(row.TatUs - intervalUS), at(row.Column2), nil
}

// Now implements db.Queries: the clock SendPacerReserve schedules on.
func (q *queries) Now(ctx context.Context) (time.Time, error) {
	nowUS, err := sqlc.SendPacerNow(ctx, q.dbtx)
	if err != nil {
		return time.Time{}, failed("reading the database's clock", err)
	}
	return at(nowUS), nil
}

// SecretCheckRecord implements db.Queries.
func (q *queries) SecretCheckRecord(ctx context.Context, params *db.SecretCheckParams) ([]byte, error) {
	if err := sqlc.SecretCheckInsert(ctx, q.dbtx, dbsqlc.SecretCheckInsertParams{CheckValue: params.CheckValue, Now: us(params.Now)}); err != nil {
		return nil, failed("recording the secret's check value", err)
	}
	recorded, err := sqlc.SecretCheckGet(ctx, q.dbtx)
	return recorded, failed("reading the secret's check value", err)
}

// SecretCheckReplace implements db.Queries.
func (q *queries) SecretCheckReplace(ctx context.Context, params *db.SecretCheckParams) error {
	return failed("replacing the secret's check value", sqlc.SecretCheckReplace(ctx, q.dbtx, dbsqlc.SecretCheckReplaceParams{CheckValue: params.CheckValue, Now: us(params.Now)}))
}

// failed says what failed, its error converted to db's; nil stays nil.
func failed(doing string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("error %s: %w", doing, interpretError(err))
}

// counted, anyUpdate and mustUpdate take an exec's (rows, error) and, given what it did, return
// the rows or the error: mustUpdate's statement must touch a row (none is db.ErrNotFound).
func counted(n int64, err error) func(doing string) (int64, error) {
	return func(doing string) (int64, error) { return n, failed(doing, err) }
}

func anyUpdate(_ int64, err error) func(doing string) error {
	return func(doing string) error { return failed(doing, err) }
}

func mustUpdate(n int64, err error) func(doing string) error {
	if err == nil && n == 0 {
		err = db.ErrNotFound
	}
	return func(doing string) error { return failed(doing, err) }
}

// us is t in the app's INTEGER form, unix microseconds; at reads it back, in UTC.
func us(t time.Time) int64 { return t.UnixMicro() }

func at(us int64) time.Time { return time.UnixMicro(us).UTC() }

func usPtr(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	v := us(*t)
	return &v
}

func atPtr(us *int64) *time.Time {
	if us == nil {
		return nil
	}
	t := at(*us)
	return &t
}
