package jobs

import (
	"context"

	"github.com/riverqueue/river"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/jobs/mail"
)

// PasswordResetEmailArgs are the args of the password reset job, inserted by forgot-password.
// Only the user id: the worker makes the token at the job's first attempt.
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

// PasswordResetEmailWorker mails a link carrying a random token, valid ResetTokenTTL from the
// job's first attempt; every attempt mails the same token under the same idempotency key.
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

	return w.deliverer.send(ctx, logger, job.JobRow, user, db.TokenPurposeReset, ResetTokenTTL, func(token string) (*mail.Message, error) {
		subject, html, text, err := mail.RenderPasswordReset(&mail.PasswordResetData{
			Name:      user.Name,
			ResetURL:  w.links.resetURL(token),
			ExpiresIn: ResetTokenTTL,
		})
		return &mail.Message{To: user.Email, Subject: subject, HTML: html, Text: text}, err
	})
}
