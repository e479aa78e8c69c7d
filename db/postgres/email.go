package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/postgres/dbsqlc"
)

// EmailMessageDeleteBefore deletes up to limit message rows created before before.
func (s *Store) EmailMessageDeleteBefore(ctx context.Context, before time.Time, limit int) (int64, error) {
	deleted, err := retryOnce(ctx, false, func() (int64, error) {
		return dbsqlc.New().EmailMessageDeleteBefore(ctx, s.pool, dbsqlc.EmailMessageDeleteBeforeParams{
			Before: before,
			Max:    int64(limit),
		})
	})
	if err != nil {
		return 0, fmt.Errorf("error deleting old email messages: %w", interpretError(err))
	}
	return deleted, nil
}

// EmailTokenEraseSealedBefore erases up to limit sealed copies of tokens created before before.
func (s *Store) EmailTokenEraseSealedBefore(ctx context.Context, before time.Time, limit int) (int64, error) {
	erased, err := retryOnce(ctx, false, func() (int64, error) {
		return dbsqlc.New().EmailTokenEraseSealedBefore(ctx, s.pool, dbsqlc.EmailTokenEraseSealedBeforeParams{
			Before: before,
			Max:    int64(limit),
		})
	})
	if err != nil {
		return 0, fmt.Errorf("error erasing old sealed tokens: %w", interpretError(err))
	}
	return erased, nil
}

// EmailMessageGetByJob implements db.Queries.EmailMessageGetByJob.
func (e *executor) EmailMessageGetByJob(ctx context.Context, jobID int64) (*db.EmailMessage, error) {
	message, err := run(ctx, e, true, func() (*dbsqlc.EmailMessage, error) {
		return dbsqlc.New().EmailMessageGetByJob(ctx, e.dbtx, jobID)
	})
	if err != nil {
		return nil, fmt.Errorf("error getting email message: %w", interpretError(err))
	}
	return emailMessageFromRow(message), nil
}

// EmailMessageInsert implements db.Queries.EmailMessageInsert.
func (e *executor) EmailMessageInsert(ctx context.Context, params *db.EmailMessageInsertParams) (*db.EmailMessage, error) {
	message, err := run(ctx, e, false, func() (*dbsqlc.EmailMessage, error) {
		return dbsqlc.New().EmailMessageInsert(ctx, e.dbtx, dbsqlc.EmailMessageInsertParams{
			IdempotencyKey: params.IdempotencyKey,
			JobID:          params.JobID,
			Kind:           params.Kind,
			Now:            params.Now,
			UserID:         params.UserID,
		})
	})
	if errors.Is(err, pgx.ErrNoRows) { // ON CONFLICT DO NOTHING
		return nil, fmt.Errorf("error inserting email message of job %d: %w", params.JobID, db.ErrExists)
	}
	if err != nil {
		return nil, fmt.Errorf("error inserting email message: %w", interpretError(err))
	}
	return emailMessageFromRow(message), nil
}

// EmailMessageMarkAccepted implements db.Queries.EmailMessageMarkAccepted.
func (e *executor) EmailMessageMarkAccepted(ctx context.Context, jobID int64, providerID string, now time.Time) error {
	updated, err := run(ctx, e, true, func() (int64, error) {
		return dbsqlc.New().EmailMessageMarkAccepted(ctx, e.dbtx, dbsqlc.EmailMessageMarkAcceptedParams{
			JobID:      jobID,
			Now:        now,
			ProviderID: providerID,
		})
	})
	return requireUpdated("marking email message accepted", updated, err)
}

// EmailMessageRekey implements db.Queries.EmailMessageRekey.
func (e *executor) EmailMessageRekey(ctx context.Context, jobID int64, idempotencyKey string, now time.Time) error {
	updated, err := run(ctx, e, true, func() (int64, error) {
		return dbsqlc.New().EmailMessageRekey(ctx, e.dbtx, dbsqlc.EmailMessageRekeyParams{
			IdempotencyKey: idempotencyKey,
			JobID:          jobID,
			Now:            now,
		})
	})
	return requireUpdated("giving email message a new key", updated, err)
}

// EmailTokenDeleteByJob implements db.Queries.EmailTokenDeleteByJob.
func (e *executor) EmailTokenDeleteByJob(ctx context.Context, jobID int64) error {
	if _, err := run(ctx, e, true, func() (int64, error) { return dbsqlc.New().EmailTokenDeleteByJob(ctx, e.dbtx, jobID) }); err != nil {
		return fmt.Errorf("error deleting email token: %w", interpretError(err))
	}
	return nil
}

// EmailTokenEraseSealed implements db.Queries.EmailTokenEraseSealed.
func (e *executor) EmailTokenEraseSealed(ctx context.Context, jobID int64) error {
	if _, err := run(ctx, e, true, func() (int64, error) { return dbsqlc.New().EmailTokenEraseSealed(ctx, e.dbtx, jobID) }); err != nil {
		return fmt.Errorf("error erasing sealed token: %w", interpretError(err))
	}
	return nil
}

// EmailTokenGetByJob implements db.Queries.EmailTokenGetByJob.
func (e *executor) EmailTokenGetByJob(ctx context.Context, jobID int64) (*db.EmailToken, error) {
	token, err := run(ctx, e, true, func() (*dbsqlc.EmailToken, error) {
		return dbsqlc.New().EmailTokenGetByJob(ctx, e.dbtx, jobID)
	})
	if err != nil {
		return nil, fmt.Errorf("error getting email token: %w", interpretError(err))
	}
	return &db.EmailToken{
		TokenHash: token.TokenHash,
		UserID:    token.UserID,
		Purpose:   db.TokenPurpose(token.Purpose),
		JobID:     token.JobID,
		Sealed:    token.Sealed,
		ExpiresAt: token.ExpiresAt.UTC(),
		UsedAt:    timePtrUTC(token.UsedAt),
		CreatedAt: token.CreatedAt.UTC(),
	}, nil
}

func emailMessageFromRow(message *dbsqlc.EmailMessage) *db.EmailMessage {
	return &db.EmailMessage{
		JobID:          message.JobID,
		Kind:           message.Kind,
		UserID:         message.UserID,
		IdempotencyKey: message.IdempotencyKey,
		KeyCreatedAt:   message.KeyCreatedAt.UTC(),
		Status:         message.Status,
		ProviderID:     message.ProviderID,
		AcceptedAt:     timePtrUTC(message.AcceptedAt),
		CreatedAt:      message.CreatedAt.UTC(),
		UpdatedAt:      message.UpdatedAt.UTC(),
	}
}
