package jobs

import (
	"context"

	"github.com/riverqueue/river"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/jobs/mail"
)

// VerificationEmailArgs are the args of the email verification job, inserted at registration and
// by resend-verification. Only the user id: the worker makes the token at the job's first attempt.
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

// VerificationEmailWorker mails a link carrying a random token, valid VerifyTokenTTL from the
// job's first attempt; every attempt mails the same token under the same idempotency key.
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

	return w.deliverer.send(ctx, logger, job.JobRow, user, db.TokenPurposeVerify, VerifyTokenTTL, func(token string) (*mail.Message, error) {
		subject, html, text, err := mail.RenderVerification(&mail.VerificationData{
			Name:      user.Name,
			VerifyURL: w.links.verifyURL(token),
			ExpiresIn: VerifyTokenTTL,
		})
		return &mail.Message{To: user.Email, Subject: subject, HTML: html, Text: text}, err
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
