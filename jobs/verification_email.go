package jobs

import (
	"context"
	"fmt"

	"github.com/riverqueue/river"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/jobs/mail"
)

// VerificationEmailArgs are the args of the email verification job, inserted at registration and
// by resend-verification. Only the user id: the token is derived from the job's id by the worker.
type VerificationEmailArgs struct {
	UserID int64 `json:"user_id"`
}

// Kind implements river.JobArgs.
func (VerificationEmailArgs) Kind() string { return "verification_email" }

// InsertOpts implements river.JobArgsWithInsertOpts: queue email, EmailMaxAttempts, and unique by
// args in the in-flight states only, so a resend while one is pending is absorbed but a resend
// after it was delivered sends a new mail.
func (VerificationEmailArgs) InsertOpts() river.InsertOpts {
	return emailInFlightUniqueInsertOpts()
}

// VerificationEmailWorker mails a link carrying VerifyToken(secret, job id), valid VerifyTokenTTL
// from the job's first attempt.
type VerificationEmailWorker struct {
	river.WorkerDefaults[VerificationEmailArgs]

	deliverer *emailDeliverer
	links     *linkBuilder
}

// Work implements river.Worker.
func (w *VerificationEmailWorker) Work(ctx context.Context, job *river.Job[VerificationEmailArgs]) error {
	logger := w.deliverer.jobLogger(ctx, job.JobRow, job.Args.UserID)

	user, err := w.deliverer.user(ctx, logger, job.JobRow, job.Args.UserID)
	if err != nil || user == nil {
		return err
	}

	raw := VerifyToken(w.links.secret, job.ID)
	if err := w.deliverer.storeToken(ctx, user.ID, raw, db.TokenPurposeVerify, VerifyTokenTTL); err != nil {
		return err
	}

	subject, html, text, err := mail.RenderVerification(&mail.VerificationData{
		Name:      user.Name,
		VerifyURL: w.links.verifyURL(raw),
		ExpiresIn: VerifyTokenTTL,
	})
	if err != nil {
		return fmt.Errorf("error rendering verification email: %w", err)
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

// emailInFlightUniqueInsertOpts are the insert options of the verification and reset jobs.
func emailInFlightUniqueInsertOpts() river.InsertOpts {
	return river.InsertOpts{
		MaxAttempts: EmailMaxAttempts,
		Queue:       QueueEmail,
		UniqueOpts: river.UniqueOpts{
			ByArgs:  true,
			ByState: inFlightStates(),
		},
	}
}
