package jobs

import (
	"context"

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

// WelcomeEmailWorker sends the welcome email, with a one-click unsubscribe link (RFC 8058), unless
// the user unsubscribed before it went out.
type WelcomeEmailWorker struct {
	river.WorkerDefaults[WelcomeEmailArgs]

	deliverer *emailDeliverer
	links     *linkBuilder
}

// Work implements river.Worker.
func (w *WelcomeEmailWorker) Work(ctx context.Context, job *river.Job[WelcomeEmailArgs]) error {
	logger := w.deliverer.jobLogger(ctx, job.JobRow, job.Args.UserID)

	user, err := w.deliverer.user(ctx, logger, job.JobRow, job.Args.UserID)
	if err != nil || user == nil {
		return err
	}
	if user.UnsubscribedAt != nil {
		logger.InfoContext(ctx, "user unsubscribed; welcome email not sent")
		w.deliverer.metrics.delivery(job.Kind, OutcomeSkipped)
		return nil
	}

	unsubscribeURL := w.links.unsubscribeURL(user.ID)
	return w.deliverer.send(ctx, logger, job.JobRow, user, "", 0, func(string) (*mail.Message, error) {
		subject, html, text, err := mail.RenderWelcome(&mail.WelcomeData{
			Name:           user.Name,
			AppURL:         w.links.appURL,
			UnsubscribeURL: unsubscribeURL,
		})
		return &mail.Message{
			To:      user.Email,
			Subject: subject,
			HTML:    html,
			Text:    text,
			Headers: map[string]string{
				"List-Unsubscribe":      "<" + unsubscribeURL + ">",
				"List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
			},
		}, err
	})
}
