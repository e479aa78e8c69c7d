package mail

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/resend/resend-go/v2"
	"github.com/stretchr/testify/require"
)

func TestClassify(t *testing.T) {
	t.Parallel()

	wrap := func(err error) error { return fmt.Errorf("error in job: %w", err) }

	for _, tt := range []struct {
		name string
		err  error
		want Outcome
	}{
		{"RateLimitRetryAfter", &ProviderError{StatusCode: 429, Name: "rate_limit_exceeded", RetryAfter: 3 * time.Second}, Outcome{Action: ActionSnooze, SnoozeFor: 3 * time.Second}},
		{"RateLimitNoRetryAfter", &ProviderError{StatusCode: 429}, Outcome{Action: ActionSnooze, SnoozeFor: DefaultRateLimitSnooze}},
		{"QuotaExceeded", &ProviderError{StatusCode: 429, Name: "daily_quota_exceeded", RetryAfter: time.Hour}, Outcome{Action: ActionSnooze, SnoozeFor: time.Hour}},
		{"ConcurrentIdempotentRequests", &ProviderError{StatusCode: 409, Name: ErrorNameConcurrentIdempotentRequests}, Outcome{Action: ActionSnooze, SnoozeFor: ConcurrentIdempotencySnooze}},
		{"InvalidIdempotentRequest", &ProviderError{StatusCode: 409, Name: ErrorNameInvalidIdempotentRequest}, Outcome{Action: ActionCancel}},
		{"ConflictOther", &ProviderError{StatusCode: 409, Name: "other"}, Outcome{Action: ActionCancel}},
		{"ValidationError", &ProviderError{StatusCode: 422, Name: "validation_error"}, Outcome{Action: ActionCancel}},
		{"BadRequest", &ProviderError{StatusCode: 400, Name: "invalid_idempotency_key"}, Outcome{Action: ActionCancel}},
		{"Unauthorized", &ProviderError{StatusCode: 401, Name: "missing_api_key"}, Outcome{Action: ActionCancel}},
		{"Forbidden", &ProviderError{StatusCode: 403, Name: "invalid_api_key"}, Outcome{Action: ActionCancel}},
		{"InternalServerError", &ProviderError{StatusCode: 500, Name: "internal_server_error"}, Outcome{Action: ActionRetry}},
		{"ServiceUnavailable", &ProviderError{StatusCode: 503}, Outcome{Action: ActionRetry}},
		{"Wrapped", wrap(&ProviderError{StatusCode: 422}), Outcome{Action: ActionCancel}},
		{"InvalidMessage", wrap(ErrInvalidMessage), Outcome{Action: ActionCancel}},
		{"ResendRateLimitError", &resend.RateLimitError{RetryAfter: "7"}, Outcome{Action: ActionSnooze, SnoozeFor: 7 * time.Second}},
		{"NetworkError", wrap(&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}), Outcome{Action: ActionRetry}},
		{"Timeout", wrap(context.DeadlineExceeded), Outcome{Action: ActionRetry}},
		{"Canceled", wrap(context.Canceled), Outcome{Action: ActionRetry}},
		{"Unknown", errors.New("something else"), Outcome{Action: ActionRetry}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			require.Equal(t, tt.want, Classify(tt.err))
		})
	}
}

func TestAction_String(t *testing.T) {
	t.Parallel()

	require.Equal(t, "retry", ActionRetry.String())
	require.Equal(t, "snooze", ActionSnooze.String())
	require.Equal(t, "cancel", ActionCancel.String())
	require.Equal(t, "Action(9)", Action(9).String())
}

func TestProviderError_Error(t *testing.T) {
	t.Parallel()

	require.Equal(t, "provider answered 422 validation_error: Invalid `to` field.",
		(&ProviderError{StatusCode: 422, Name: "validation_error", Message: "Invalid `to` field."}).Error())
	require.Equal(t, "provider answered 429 rate_limit_exceeded: Too many requests (retry after 2s)",
		(&ProviderError{StatusCode: 429, Name: "rate_limit_exceeded", Message: "Too many requests", RetryAfter: 2 * time.Second}).Error())
	require.Equal(t, "provider answered 502", (&ProviderError{StatusCode: 502}).Error())
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()

	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tt := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"3", 3 * time.Second},
		{" 1 ", time.Second},
		{"0", 0},
		{"-4", 0},
		{"soon", 0},
		{"999999999", 24 * time.Hour},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
	} {
		require.Equal(t, tt.want, parseRetryAfter(tt.in, now), "parseRetryAfter(%q)", tt.in)
	}
}
