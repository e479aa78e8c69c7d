package mail

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/resend/resend-go/v2"
)

// Resend error names that change how a failure is handled. See
// https://resend.com/docs/api-reference/errors.
const (
	// ErrorNameConcurrentIdempotentRequests is the 409 Resend answers while a
	// request with the same idempotency key is still in progress.
	ErrorNameConcurrentIdempotentRequests = "concurrent_idempotent_requests"

	// ErrorNameInvalidIdempotentRequest is the 409 Resend answers when an
	// idempotency key is reused with another payload.
	ErrorNameInvalidIdempotentRequest = "invalid_idempotent_request"
)

const (
	// ConcurrentIdempotencySnooze is how long a job waits after a 409
	// concurrent_idempotent_requests: the earlier request with the same key
	// is still in progress and is expected to finish within seconds.
	ConcurrentIdempotencySnooze = 5 * time.Second

	// DefaultRateLimitSnooze is how long a job waits after a 429 that carries
	// no usable Retry-After header.
	DefaultRateLimitSnooze = time.Second
)

// ErrInvalidMessage is returned (wrapped) by senders for a message that can
// never be sent, such as one without a recipient or idempotency key.
// Classify answers ActionCancel for it.
var ErrInvalidMessage = errors.New("invalid message")

// ErrUnsent is wrapped by senders around a failure that happened before any
// of the message could reach the provider (a refused connection, a failed TLS
// handshake, a name that does not resolve): the provider cannot have the
// mail, so another provider may send it. A failure without it (and without a
// provider's answer) may have reached the provider.
var ErrUnsent = errors.New("nothing reached the provider")

// ProviderError is the provider's answer to a send that it refused: a non-2xx
// HTTP status with the error name and message of its JSON body. Network
// errors and timeouts are not ProviderErrors; they are returned (wrapped) as
// the HTTP client reported them.
type ProviderError struct {
	// StatusCode is the HTTP status of the answer.
	StatusCode int

	// Name is the provider's error name, such as validation_error or
	// rate_limit_exceeded. Empty when the body carried none.
	Name string

	// Message is the provider's human-readable message, or the HTTP status
	// text when the body carried none.
	Message string

	// RetryAfter is the wait the provider asked for in its Retry-After
	// header; zero when absent.
	RetryAfter time.Duration
}

// Error describes the answer, e.g.
// "provider answered 422 validation_error: Invalid `to` field.".
func (e *ProviderError) Error() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "provider answered %d", e.StatusCode)
	if e.Name != "" {
		sb.WriteString(" " + e.Name)
	}
	if e.Message != "" {
		sb.WriteString(": " + e.Message)
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(&sb, " (retry after %s)", e.RetryAfter)
	}
	return sb.String()
}

// Action is what a job should do after a failed send.
type Action int

const (
	// ActionRetry: the failure may be transient (5xx, timeout, network
	// error, anything unknown); return the error so the job is retried with
	// backoff. This is the zero value.
	ActionRetry Action = iota

	// ActionSnooze: the provider asked to wait (429, or 409
	// concurrent_idempotent_requests); snooze the job for Outcome.SnoozeFor
	// without spending an attempt.
	ActionSnooze

	// ActionCancel: retrying cannot help (4xx such as validation_error or
	// invalid_idempotent_request, or an invalid message); cancel the job.
	ActionCancel
)

// String returns "retry", "snooze" or "cancel".
func (a Action) String() string {
	switch a {
	case ActionRetry:
		return "retry"
	case ActionSnooze:
		return "snooze"
	case ActionCancel:
		return "cancel"
	}
	return "Action(" + strconv.Itoa(int(a)) + ")"
}

// Outcome is Classify's verdict on a failed send.
type Outcome struct {
	// Action is what the job should do.
	Action Action

	// SnoozeFor is how long to snooze when Action is ActionSnooze; zero
	// otherwise.
	SnoozeFor time.Duration

	// Outage says the failure is the provider's, not the message's: it is
	// down, slow, over its rate or refusing postguard itself (a 5xx, a 429, a
	// timeout, a network error, an SMTP 4xx reply). It counts against the
	// provider's circuit, and, unless MaybeAccepted, the attempt may go to the
	// next provider.
	Outage bool

	// MaybeAccepted says the provider may have taken the mail although the
	// send failed: the request reached it and its answer was lost (a timeout
	// or a connection lost while waiting for it), or it still holds the same
	// idempotency key in flight. Such a mail must not be handed to another
	// provider, which would deliver it a second time.
	MaybeAccepted bool

	// Bounce, when not nil, says the provider refused the recipient's address
	// for good (an SMTP 5xx reply to RCPT TO): the address goes on the
	// suppression list, as for a permanent bounce. Action is ActionCancel.
	Bounce *Bounce
}

// Bounce is a recipient a provider refused for good while a mail was sent.
type Bounce struct {
	// Detail is the provider's classification, e.g. "SMTP 550 5.1.1": the
	// reply's codes, never its text, which may quote the address.
	Detail string
	// EmailID is the id of the mail that was refused (its Message-ID).
	EmailID string
}

// Classify says what a job should do with an error returned by a Sender.
// For Resend's answers (*ProviderError):
//
//   - 429 → ActionSnooze for its Retry-After (DefaultRateLimitSnooze when
//     absent), an Outage (over the provider's rate: another provider may take
//     the mail now);
//   - 409 concurrent_idempotent_requests → ActionSnooze for
//     ConcurrentIdempotencySnooze, MaybeAccepted (the same key is in flight);
//   - 409 invalid_idempotent_request and every other 4xx → ActionCancel;
//   - 5xx → ActionRetry, an Outage. An answer, even an error, says the
//     provider did not take the mail.
//
// For an SMTP server's (*SMTPError), by the step that failed:
//
//   - the connection (dial, TLS, STARTTLS missing for smtp://, EHLO, AUTH)
//     and MAIL FROM → ActionRetry, an Outage (the relay is down or refuses
//     postguard itself), whatever the reply;
//   - a 4xx reply at any step → ActionRetry, an Outage;
//   - a 5xx reply to RCPT TO → ActionCancel with a Bounce (the address is
//     refused for good), except a 5.7.x one (relaying or authentication
//     denied: a refusal of postguard, retried as an Outage, suppressing no
//     one);
//   - a 5xx reply to DATA or to the end of data → ActionCancel (the content is
//     refused);
//   - no reply to the end of data (the connection lost after the content was
//     sent) → ActionRetry, an Outage, MaybeAccepted: a retry may deliver the
//     mail twice, with the same Message-ID.
//
// And for anything else:
//
//   - ErrInvalidMessage → ActionCancel;
//   - ErrUnsent (nothing reached the provider) → ActionRetry, an Outage;
//   - timeouts, network errors and anything unknown → ActionRetry, an Outage,
//     MaybeAccepted (the request may have reached the provider).
//
// A context cancelled under the send (a job cut short by shutdown) classifies
// as ActionRetry and stays recognisable with errors.Is(err,
// context.Canceled): the caller returns the error, wrapped with %w, so River
// puts the job back. err must not be nil.
func Classify(err error) Outcome {
	if errors.Is(err, ErrInvalidMessage) {
		return Outcome{Action: ActionCancel}
	}

	if providerErr, ok := errors.AsType[*ProviderError](err); ok {
		switch {
		case providerErr.StatusCode == http.StatusTooManyRequests:
			return Outcome{Action: ActionSnooze, SnoozeFor: rateLimitSnooze(providerErr.RetryAfter), Outage: true}
		case providerErr.StatusCode == http.StatusConflict && providerErr.Name == ErrorNameConcurrentIdempotentRequests:
			return Outcome{Action: ActionSnooze, SnoozeFor: ConcurrentIdempotencySnooze, MaybeAccepted: true}
		case providerErr.StatusCode >= 400 && providerErr.StatusCode < 500:
			return Outcome{Action: ActionCancel}
		}
		return Outcome{Action: ActionRetry, Outage: true}
	}

	if smtpErr, ok := errors.AsType[*SMTPError](err); ok {
		return classifySMTP(smtpErr)
	}

	// resend-go's own 429 error, in case it reaches here without having been
	// turned into a ProviderError.
	if rateLimitErr, ok := errors.AsType[*resend.RateLimitError](err); ok {
		return Outcome{Action: ActionSnooze, SnoozeFor: rateLimitSnooze(parseRetryAfter(rateLimitErr.RetryAfter, time.Now())), Outage: true}
	}

	return Outcome{Action: ActionRetry, Outage: true, MaybeAccepted: !errors.Is(err, ErrUnsent)}
}

// classifySMTP is Classify for an SMTP server's failure (see Classify).
func classifySMTP(err *SMTPError) Outcome {
	retry := Outcome{Action: ActionRetry, Outage: true}
	switch {
	case err.Phase == SMTPPhaseConnect, err.Phase == SMTPPhaseMailFrom, err.Temporary():
		return retry
	case err.Phase == SMTPPhaseEndOfData && err.Code == 0:
		retry.MaybeAccepted = true
		return retry
	case !err.Permanent():
		// No reply before the content's end (the server cannot have the mail), or a reply
		// that is neither 4xx nor 5xx.
		return retry
	case err.Phase == SMTPPhaseRcptTo && strings.HasPrefix(err.EnhancedCode, "5.7."):
		return retry
	case err.Phase == SMTPPhaseRcptTo:
		detail := fmt.Sprintf("SMTP %d", err.Code)
		if err.EnhancedCode != "" {
			detail += " " + err.EnhancedCode
		}
		return Outcome{Action: ActionCancel, Bounce: &Bounce{Detail: detail, EmailID: err.MessageID}}
	}
	return Outcome{Action: ActionCancel}
}

func rateLimitSnooze(retryAfter time.Duration) time.Duration {
	if retryAfter <= 0 {
		return DefaultRateLimitSnooze
	}
	return retryAfter
}

// parseRetryAfter reads a Retry-After header value: delay-seconds or an
// HTTP-date (RFC 9110 §10.2.3). Zero when absent or unparsable.
func parseRetryAfter(value string, now time.Time) time.Duration {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0
	}
	if seconds, err := strconv.ParseInt(value, 10, 64); err == nil {
		if seconds <= 0 {
			return 0
		}
		return time.Duration(min(seconds, int64(24*time.Hour/time.Second))) * time.Second
	}
	if at, err := http.ParseTime(value); err == nil {
		return max(at.Sub(now), 0)
	}
	return 0
}
