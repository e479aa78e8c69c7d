package jobs

import (
	"context"
	"fmt"

	"github.com/riverqueue/river"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/jobs/mail"
)

// PasswordResetEmailArgs are the args of the password reset job, inserted by forgot-password.
// Only the user id: the token is derived from the job's id by the worker.
type PasswordResetEmailArgs struct {
	UserID int64 `json:"user_id"`
}

// Kind implements river.JobArgs.
func (PasswordResetEmailArgs) Kind() string { return "password_reset_email" }

// InsertOpts implements river.JobArgsWithInsertOpts: queue email, EmailMaxAttempts, and unique by
// args in the in-flight states only, so a later request sends a new mail.
func (PasswordResetEmailArgs) InsertOpts() river.InsertOpts {
	return emailInFlightUniqueInsertOpts()
}

// PasswordResetEmailWorker mails a link carrying ResetToken(secret, job id), valid ResetTokenTTL
// from the job's first attempt.
type PasswordResetEmailWorker struct {
	river.WorkerDefaults[PasswordResetEmailArgs]

	deliverer *emailDeliverer
	links     *linkBuilder
}

// Work implements river.Worker.
func (w *PasswordResetEmailWorker) Work(ctx context.Context, job *river.Job[PasswordResetEmailArgs]) error {
	logger := w.deliverer.jobLogger(ctx, job.JobRow, job.Args.UserID)

	user, err := w.deliverer.user(ctx, logger, job.JobRow, job.Args.UserID)
	if err != nil || user == nil {
		return err
	}

	raw := ResetToken(w.links.secret, job.ID)
	if err := w.deliverer.storeToken(ctx, user.ID, raw, db.TokenPurposeReset, ResetTokenTTL); err != nil {
		return err
	}

	subject, html, text, err := mail.RenderPasswordReset(&mail.PasswordResetData{
		Name:      user.Name,
		ResetURL:  w.links.resetURL(raw),
		ExpiresIn: ResetTokenTTL,
	})
	if err != nil {
		return fmt.Errorf("error rendering password reset email: %w", err)
	}

	return w.deliverer.deliver(ctx, logger, job.JobRow, &mail.Message{
		To:             user.Email,
		Subject:        subject,
		HTML:           html,
		Text:           text,
		IdempotencyKey: idempotencyKey(job.Kind, user.ID, job.ID),
		Kind:           job.Kind,
	})
}
