// Package mail renders postguard's transactional emails and hands them to a
// delivery provider.
//
// A Sender delivers one Message. ResendSender talks to Resend through the
// official resend-go client, and SMTPSender to any SMTP server through
// go-mail; both report every failure in a form Classify can turn into a job
// decision (retry, snooze or cancel; whether the provider is down, whether it
// may have the mail anyway, whether the recipient is refused). LogSender
// prints mail to the process log for development and keeps the last ones in
// an Outbox for /dev/mail. A Renderer builds each mail's subject, HTML and plain-text bodies
// from the built-in templates (English, branded with APP_NAME) and an
// operator's templates directory, in the locale that best matches the user's.
package mail

import (
	"context"
)

// Message is one email ready to be sent.
type Message struct {
	// To is the recipient's address.
	To string

	// Subject is the subject line.
	Subject string

	// HTML is the HTML body.
	HTML string

	// Text is the plain-text body.
	Text string

	// Headers are extra email headers, such as List-Unsubscribe and
	// List-Unsubscribe-Post. May be nil.
	Headers map[string]string

	// IdempotencyKey identifies the send at the provider: a second send with
	// the same key and payload within 24 hours is not delivered again. It is
	// required; it must stay the same on every attempt of one job.
	IdempotencyKey string

	// Kind is the job kind the message comes from (welcome_email, ...), used
	// in logs only; it is not sent to the provider.
	Kind string
}

// Sender delivers email. Implementations must be safe for concurrent use.
//
// Send returns the provider's id of the accepted message (Resend's email id,
// which its webhooks name). A failure is either a *ProviderError (the
// provider answered with an error status) or another error (network error,
// timeout, cancelled context, invalid message); Classify says what a job
// should do with any of them.
type Sender interface {
	Send(ctx context.Context, msg *Message) (id string, err error)
}
