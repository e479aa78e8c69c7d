package jobs

import (
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

func (a VerificationEmailArgs) userID() int64 { return a.UserID }

// VerificationEmailWorker mails a link carrying a random token, valid VerifyTokenTTL from the
// job's first attempt; every attempt mails the same token under the same idempotency key.
type VerificationEmailWorker struct {
	emailWorker[VerificationEmailArgs]
}

var verificationEmail = &emailSpec{ //nolint:gochecknoglobals // a constant spec
	purpose: db.TokenPurposeVerify,
	ttl:     VerifyTokenTTL,
	kind:    mail.KindVerification,
	data: func(links *linkBuilder, user *Recipient, token string) (*mail.Data, map[string]string) {
		return &mail.Data{Name: user.Name, ActionURL: links.verifyURL(token), ExpiresIn: VerifyTokenTTL}, nil
	},
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
