package jobs

import (
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

func (a PasswordResetEmailArgs) userID() int64 { return a.UserID }

// PasswordResetEmailWorker mails a link carrying a random token, valid ResetTokenTTL from the
// job's first attempt; every attempt mails the same token under the same idempotency key.
type PasswordResetEmailWorker struct {
	emailWorker[PasswordResetEmailArgs]
}

var passwordResetEmail = &emailSpec{ //nolint:gochecknoglobals // a constant spec
	purpose: db.TokenPurposeReset,
	ttl:     ResetTokenTTL,
	kind:    mail.KindPasswordReset,
	data: func(links *linkBuilder, user *Recipient, token string) (*mail.Data, map[string]string) {
		return &mail.Data{Name: user.Name, ActionURL: links.resetURL(token), ExpiresIn: ResetTokenTTL}, nil
	},
}
