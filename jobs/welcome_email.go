package jobs

import (
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/postguard/postguard/jobs/mail"
)

// WelcomeEmailArgs are the args of the welcome email job, inserted with the user at registration.
// Only the user id: nothing secret goes into job args.
type WelcomeEmailArgs struct {
	UserID int64 `json:"user_id"`
}

// Kind implements river.JobArgs.
func (WelcomeEmailArgs) Kind() string { return "welcome_email" }

// InsertOpts implements river.JobArgsWithInsertOpts: queue email, EmailMaxAttempts, and unique by
// args in every state, so a user gets one welcome job for as long as finished jobs are kept.
func (WelcomeEmailArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		MaxAttempts: EmailMaxAttempts,
		Queue:       QueueEmail,
		UniqueOpts: river.UniqueOpts{
			ByArgs:  true,
			ByState: rivertype.JobStates(),
		},
	}
}

func (a WelcomeEmailArgs) userID() int64 { return a.UserID }

// WelcomeEmailWorker sends the welcome email, with a one-click unsubscribe link (RFC 8058), unless
// the user unsubscribed before it went out.
type WelcomeEmailWorker struct {
	emailWorker[WelcomeEmailArgs]
}

var welcomeEmail = &emailSpec{ //nolint:gochecknoglobals // a constant spec
	skip: func(user *Recipient) string {
		if user.Unsubscribed {
			return "the user unsubscribed; welcome email not sent"
		}
		return ""
	},
	kind: mail.KindWelcome,
	data: func(links *linkBuilder, user *Recipient, _ string) (*mail.Data, map[string]string) {
		unsubscribeURL := links.unsubscribeURL(user.ID)
		return &mail.Data{
				Name:           user.Name,
				ActionURL:      links.loginURL,
				UnsubscribeURL: unsubscribeURL,
			}, map[string]string{
				"List-Unsubscribe":      "<" + unsubscribeURL + ">",
				"List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
			}
	},
}
