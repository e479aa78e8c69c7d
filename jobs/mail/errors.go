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
}

// Classify says what a job should do with an error returned by a Sender:
//
//   - 429 → ActionSnooze for its Retry-After (DefaultRateLimitSnooze when
//     absent);
//   - 409 concurrent_idempotent_requests → ActionSnooze for
//     ConcurrentIdempotencySnooze;
//   - 409 invalid_idempotent_request and every other 4xx → ActionCancel;
//   - ErrInvalidMessage → ActionCancel;
//   - 5xx, timeouts, network errors and anything unknown → ActionRetry.
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
			return Outcome{Action: ActionSnooze, SnoozeFor: rateLimitSnooze(providerErr.RetryAfter)}
		case providerErr.StatusCode == http.StatusConflict && providerErr.Name == ErrorNameConcurrentIdempotentRequests:
			return Outcome{Action: ActionSnooze, SnoozeFor: ConcurrentIdempotencySnooze}
		case providerErr.StatusCode >= 400 && providerErr.StatusCode < 500:
			return Outcome{Action: ActionCancel}
		}
		return Outcome{Action: ActionRetry}
	}

	// resend-go's own 429 error, in case it reaches here without having been
	// turned into a ProviderError.
	if rateLimitErr, ok := errors.AsType[*resend.RateLimitError](err); ok {
		return Outcome{Action: ActionSnooze, SnoozeFor: rateLimitSnooze(parseRetryAfter(rateLimitErr.RetryAfter, time.Now()))}
	}

	return Outcome{Action: ActionRetry}
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
