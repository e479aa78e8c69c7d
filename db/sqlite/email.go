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

// EmailMessageDeleteBefore deletes up to limit message rows created before before.
func (s *Store) EmailMessageDeleteBefore(ctx context.Context, before time.Time, limit int) (int64, error) {
	deleted, err := dbsqlc.New().EmailMessageDeleteBefore(ctx, s.db, dbsqlc.EmailMessageDeleteBeforeParams{
		Before: before.UnixMicro(),
		Max:    int64(limit),
	})
	if err != nil {
		return 0, fmt.Errorf("error deleting old email messages: %w", interpretError(err))
	}
	return deleted, nil
}

// EmailTokenEraseSealedBefore erases up to limit sealed copies of tokens created before before.
func (s *Store) EmailTokenEraseSealedBefore(ctx context.Context, before time.Time, limit int) (int64, error) {
	erased, err := dbsqlc.New().EmailTokenEraseSealedBefore(ctx, s.db, dbsqlc.EmailTokenEraseSealedBeforeParams{
		Before: before.UnixMicro(),
		Max:    int64(limit),
	})
	if err != nil {
		return 0, fmt.Errorf("error erasing old sealed tokens: %w", interpretError(err))
	}
	return erased, nil
}

// EmailMessageGetByJob implements db.Queries.EmailMessageGetByJob.
func (e *executor) EmailMessageGetByJob(ctx context.Context, jobID int64) (*db.EmailMessage, error) {
	message, err := dbsqlc.New().EmailMessageGetByJob(ctx, e.dbtx, jobID)
	if err != nil {
		return nil, fmt.Errorf("error getting email message: %w", interpretError(err))
	}
	return emailMessageFromRow(message), nil
}

// EmailMessageInsert implements db.Queries.EmailMessageInsert.
func (e *executor) EmailMessageInsert(ctx context.Context, params *db.EmailMessageInsertParams) (*db.EmailMessage, error) {
	message, err := dbsqlc.New().EmailMessageInsert(ctx, e.dbtx, dbsqlc.EmailMessageInsertParams{
		IdempotencyKey: params.IdempotencyKey,
		JobID:          params.JobID,
		Kind:           params.Kind,
		Now:            params.Now.UnixMicro(),
		UserID:         params.UserID,
	})
	if errors.Is(err, sql.ErrNoRows) { // ON CONFLICT DO NOTHING
		return nil, fmt.Errorf("error inserting email message of job %d: %w", params.JobID, db.ErrExists)
	}
	if err != nil {
		return nil, fmt.Errorf("error inserting email message: %w", interpretError(err))
	}
	return emailMessageFromRow(message), nil
}

// EmailMessageMarkAccepted implements db.Queries.EmailMessageMarkAccepted.
func (e *executor) EmailMessageMarkAccepted(ctx context.Context, jobID int64, providerID string, now time.Time) error {
	updated, err := dbsqlc.New().EmailMessageMarkAccepted(ctx, e.dbtx, dbsqlc.EmailMessageMarkAcceptedParams{
		JobID:      jobID,
		Now:        now.UnixMicro(),
		ProviderID: &providerID,
	})
	return requireUpdated("marking email message accepted", updated, err)
}

// EmailMessageRekey implements db.Queries.EmailMessageRekey.
func (e *executor) EmailMessageRekey(ctx context.Context, jobID int64, idempotencyKey string, now time.Time) error {
	updated, err := dbsqlc.New().EmailMessageRekey(ctx, e.dbtx, dbsqlc.EmailMessageRekeyParams{
		IdempotencyKey: idempotencyKey,
		JobID:          jobID,
		Now:            now.UnixMicro(),
	})
	return requireUpdated("giving email message a new key", updated, err)
}

// EmailTokenDeleteByJob implements db.Queries.EmailTokenDeleteByJob.
func (e *executor) EmailTokenDeleteByJob(ctx context.Context, jobID int64) error {
	if _, err := dbsqlc.New().EmailTokenDeleteByJob(ctx, e.dbtx, jobID); err != nil {
		return fmt.Errorf("error deleting email token: %w", interpretError(err))
	}
	return nil
}

// EmailTokenEraseSealed implements db.Queries.EmailTokenEraseSealed.
func (e *executor) EmailTokenEraseSealed(ctx context.Context, jobID int64) error {
	if _, err := dbsqlc.New().EmailTokenEraseSealed(ctx, e.dbtx, jobID); err != nil {
		return fmt.Errorf("error erasing sealed token: %w", interpretError(err))
	}
	return nil
}

// EmailTokenGetByJob implements db.Queries.EmailTokenGetByJob.
func (e *executor) EmailTokenGetByJob(ctx context.Context, jobID int64) (*db.EmailToken, error) {
	token, err := dbsqlc.New().EmailTokenGetByJob(ctx, e.dbtx, jobID)
	if err != nil {
		return nil, fmt.Errorf("error getting email token: %w", interpretError(err))
	}
	return &db.EmailToken{
		TokenHash: token.TokenHash,
		UserID:    token.UserID,
		Purpose:   db.TokenPurpose(token.Purpose),
		JobID:     token.JobID,
		Sealed:    token.Sealed,
		ExpiresAt: timeFromMicros(token.ExpiresAt),
		UsedAt:    timePtrFromMicros(token.UsedAt),
		CreatedAt: timeFromMicros(token.CreatedAt),
	}, nil
}

func emailMessageFromRow(message *dbsqlc.EmailMessage) *db.EmailMessage {
	return &db.EmailMessage{
		JobID:          message.JobID,
		Kind:           message.Kind,
		UserID:         message.UserID,
		IdempotencyKey: message.IdempotencyKey,
		KeyCreatedAt:   timeFromMicros(message.KeyCreatedAt),
		Status:         message.Status,
		ProviderID:     message.ProviderID,
		AcceptedAt:     timePtrFromMicros(message.AcceptedAt),
		CreatedAt:      timeFromMicros(message.CreatedAt),
		UpdatedAt:      timeFromMicros(message.UpdatedAt),
	}
}
