package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/postguard/postguard/jobs/mail"
)

// Outcomes of one delivery attempt, the values of the outcome label of
// postguard_email_deliveries_total.
const (
	OutcomeSent      = "sent"      // the provider accepted the message
	OutcomeRetried   = "retried"   // the attempt failed and the job will be tried again
	OutcomeSnoozed   = "snoozed"   // the provider (or the pacer) asked to wait; no attempt spent
	OutcomeCancelled = "cancelled" // the provider refused the message; retrying cannot help
	OutcomeDiscarded = "discarded" // the last attempt failed
	OutcomeSkipped   = "skipped"   // nothing to send: the user was deleted or unsubscribed, or it was sent already
	// OutcomeSuppressed: the recipient's address is on the suppression list; nothing was sent.
	OutcomeSuppressed = "suppressed"
)

// skipped is an attempt with nothing to send: the job completes.
type skipped struct{ reason string }

func (s *skipped) Error() string { return s.reason }

// suppressedMail is an attempt whose recipient's address is on the suppression list: nothing is
// sent, and the job completes.
type suppressedMail struct{ reason string }

func (s *suppressedMail) Error() string { return s.reason }

// snoozed is an attempt that waits, by the pacer's schedule (pacer) or the provider's ask.
type snoozed struct {
	wait   time.Duration
	reason string
	pacer  bool
}

func (s *snoozed) Error() string { return fmt.Sprintf("%s; waiting %s", s.reason, s.wait) }

// outcome maps what an attempt of job ended with (err: nil when the provider accepted the mail)
// to what River does with it and the outcome the delivery metric counts (docs/design.md, Delivery):
//
//   - nil: completed, sent; a *skipped: completed, skipped; a *suppressedMail: completed,
//     suppressed;
//   - a *snoozed, 429 (for its Retry-After) or 409 concurrent_idempotent_requests (briefly):
//     snoozed, no attempt spent; but a provider's ask past MaxSnoozes, and any snooze that would
//     carry the job past its idempotency key's life, fails like an error;
//   - 409 invalid_idempotent_request, every other 4xx and an invalid message: cancelled;
//   - a context cancelled under the attempt (shutdown): its error, which River takes back
//     without spending the attempt, retried;
//   - anything else (5xx, timeouts, network errors, the database): its error, retried on the
//     RetryPolicy's schedule, or discarded on the last attempt.
//
// now is the attempt's clock; meta the job's metadata as it started; keyDeadline when the
// provider forgets the job's idempotency key.
func outcome(job *rivertype.JobRow, meta jobMetadata, keyDeadline, now time.Time, err error) (label string, result error) {
	var skip *skipped
	var suppressed *suppressedMail
	var snooze *snoozed
	switch {
	case err == nil:
		return OutcomeSent, nil
	case errors.As(err, &skip):
		return OutcomeSkipped, nil
	case errors.As(err, &suppressed):
		return OutcomeSuppressed, nil
	case errors.Is(err, context.Canceled):
		return OutcomeRetried, err
	case errors.As(err, &snooze):
	default:
		switch verdict := mail.Classify(err); verdict.Action {
		case mail.ActionCancel:
			return OutcomeCancelled, river.JobCancel(err)
		case mail.ActionSnooze:
			snooze = &snoozed{wait: verdict.SnoozeFor, reason: err.Error()}
		case mail.ActionRetry:
			return failedOutcome(job), err
		}
	}

	if providerSnoozes := meta.Snoozes - meta.PacerSnoozes; !snooze.pacer && providerSnoozes >= MaxSnoozes {
		return failedOutcome(job), fmt.Errorf("%w; not snoozing again: snoozed %d times already", err, providerSnoozes)
	}
	if now.Add(snooze.wait).After(keyDeadline) {
		return failedOutcome(job), fmt.Errorf("%w; not snoozing %s: it would outlive the idempotency key", err, snooze.wait)
	}
	return OutcomeSnoozed, river.JobSnooze(snooze.wait)
}

// failedOutcome is retried, or discarded on the job's last attempt.
func failedOutcome(job *rivertype.JobRow) string {
	if job.Attempt >= job.MaxAttempts {
		return OutcomeDiscarded
	}
	return OutcomeRetried
}
