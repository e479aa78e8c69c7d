package jobs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/jobs/mail"
)

func TestOutcome(t *testing.T) {
	t.Parallel()

	created := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	now := created.Add(time.Hour)
	job := func(attempt int) *rivertype.JobRow {
		return &rivertype.JobRow{Attempt: attempt, MaxAttempts: EmailMaxAttempts, CreatedAt: created}
	}
	provider := func(status int, name string, retryAfter time.Duration) error {
		return fmt.Errorf("error sending welcome_email email: %w", &mail.ProviderError{StatusCode: status, Name: name, RetryAfter: retryAfter})
	}
	dbDown := errors.New("error getting user 1: database unavailable")

	type want struct {
		label string
		// exactly one of: nil result, a snooze of this length, a cancel, or an error (retried)
		snooze time.Duration
		cancel bool
		err    bool
	}
	for _, tt := range []struct {
		name string
		job  *rivertype.JobRow
		meta jobMetadata
		now  time.Time
		err  error
		want want
	}{
		{"Accepted", job(1), jobMetadata{}, now, nil, want{label: OutcomeSent}},
		{"Skipped", job(1), jobMetadata{}, now, &skipped{reason: "the user was deleted"}, want{label: OutcomeSkipped}},
		{"Suppressed", job(1), jobMetadata{}, now, &suppressedMail{reason: "the address is suppressed"}, want{label: OutcomeSuppressed}},
		{"SuppressedLastAttempt", job(EmailMaxAttempts), jobMetadata{}, now, &suppressedMail{reason: "the address is suppressed"}, want{label: OutcomeSuppressed}},
		{"RateLimited", job(1), jobMetadata{}, now, provider(http.StatusTooManyRequests, "rate_limit_exceeded", 7*time.Second), want{label: OutcomeSnoozed, snooze: 7 * time.Second}},
		{"RateLimitedWithoutRetryAfter", job(1), jobMetadata{}, now, provider(http.StatusTooManyRequests, "rate_limit_exceeded", 0), want{label: OutcomeSnoozed, snooze: mail.DefaultRateLimitSnooze}},
		{"KeyInFlight", job(1), jobMetadata{}, now, provider(http.StatusConflict, mail.ErrorNameConcurrentIdempotentRequests, 0), want{label: OutcomeSnoozed, snooze: mail.ConcurrentIdempotencySnooze}},
		{"KeyReusedWithOtherPayload", job(1), jobMetadata{}, now, provider(http.StatusConflict, mail.ErrorNameInvalidIdempotentRequest, 0), want{label: OutcomeCancelled, cancel: true}},
		{"Validation", job(1), jobMetadata{}, now, provider(http.StatusUnprocessableEntity, "validation_error", 0), want{label: OutcomeCancelled, cancel: true}},
		{"InvalidMessage", job(1), jobMetadata{}, now, fmt.Errorf("%w: no recipient", mail.ErrInvalidMessage), want{label: OutcomeCancelled, cancel: true}},
		{"ServerError", job(1), jobMetadata{}, now, provider(http.StatusBadGateway, "", 0), want{label: OutcomeRetried, err: true}},
		{"ServerErrorLastAttempt", job(EmailMaxAttempts), jobMetadata{}, now, provider(http.StatusBadGateway, "", 0), want{label: OutcomeDiscarded, err: true}},
		{"Database", job(2), jobMetadata{}, now, dbDown, want{label: OutcomeRetried, err: true}},
		{"Shutdown", job(EmailMaxAttempts), jobMetadata{}, now, fmt.Errorf("error sending: %w", context.Canceled), want{label: OutcomeRetried, err: true}},
		{"PacerSlotFar", job(0), jobMetadata{}, now, &snoozed{wait: 20 * time.Second, pacer: true}, want{label: OutcomeSnoozed, snooze: 20 * time.Second}},
		{"ProviderSnoozesUsedUp", job(1), jobMetadata{Snoozes: MaxSnoozes}, now, provider(http.StatusTooManyRequests, "rate_limit_exceeded", time.Second), want{label: OutcomeRetried, err: true}},
		{"PacerSnoozesNotCounted", job(1), jobMetadata{Snoozes: MaxSnoozes, PacerSnoozes: 1}, now, provider(http.StatusTooManyRequests, "rate_limit_exceeded", time.Second), want{label: OutcomeSnoozed, snooze: time.Second}},
		{"PacerSnoozeNotCapped", job(1), jobMetadata{Snoozes: 50, PacerSnoozes: 50}, now, &snoozed{wait: time.Minute, pacer: true}, want{label: OutcomeSnoozed, snooze: time.Minute}},
		{"SnoozePastKeyLifetime", job(1), jobMetadata{}, created.Add(IdempotencyKeyLifetime - time.Second), provider(http.StatusTooManyRequests, "rate_limit_exceeded", 5*time.Second), want{label: OutcomeRetried, err: true}},
		{"PacerSnoozePastKeyLifetime", job(1), jobMetadata{}, created.Add(IdempotencyKeyLifetime - time.Second), &snoozed{wait: 5 * time.Second, pacer: true}, want{label: OutcomeRetried, err: true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			// The job's key was made when the job was.
			label, result := outcome(tt.job, tt.meta, created.Add(IdempotencyKeyLifetime), tt.now, tt.err)
			require.Equal(t, tt.want.label, label)

			var snooze *river.JobSnoozeError
			var cancel *river.JobCancelError
			switch {
			case tt.want.snooze > 0:
				require.ErrorAs(t, result, &snooze)
				require.Equal(t, tt.want.snooze, snooze.Duration)
			case tt.want.cancel:
				require.ErrorAs(t, result, &cancel)
			case tt.want.err:
				require.Error(t, result)
				require.NotErrorAs(t, result, &snooze)
				require.NotErrorAs(t, result, &cancel)
				if errors.Is(tt.err, context.Canceled) {
					require.ErrorIs(t, result, context.Canceled, "River puts the job back")
				}
			default:
				require.NoError(t, result)
			}
		})
	}

	// A job older than a key's life got a new key when it started over: the new key's life, not
	// the job's age, bounds its snoozes.
	t.Run("RekeyedJobSnoozes", func(t *testing.T) {
		t.Parallel()

		now := created.Add(30 * time.Hour)
		keyDeadline := now.Add(-time.Hour).Add(IdempotencyKeyLifetime)
		label, result := outcome(job(3), jobMetadata{}, keyDeadline, now, &snoozed{wait: time.Minute, pacer: true})
		require.Equal(t, OutcomeSnoozed, label)
		var snooze *river.JobSnoozeError
		require.ErrorAs(t, result, &snooze)
		require.Equal(t, time.Minute, snooze.Duration)
	})
}
