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
		{"RateLimitRetryAfter", &ProviderError{StatusCode: 429, Name: "rate_limit_exceeded", RetryAfter: 3 * time.Second}, Outcome{Action: ActionSnooze, SnoozeFor: 3 * time.Second, Outage: true}},
		{"RateLimitNoRetryAfter", &ProviderError{StatusCode: 429}, Outcome{Action: ActionSnooze, SnoozeFor: DefaultRateLimitSnooze, Outage: true}},
		{"QuotaExceeded", &ProviderError{StatusCode: 429, Name: "daily_quota_exceeded", RetryAfter: time.Hour}, Outcome{Action: ActionSnooze, SnoozeFor: time.Hour, Outage: true}},
		{"ConcurrentIdempotentRequests", &ProviderError{StatusCode: 409, Name: ErrorNameConcurrentIdempotentRequests}, Outcome{Action: ActionSnooze, SnoozeFor: ConcurrentIdempotencySnooze, MaybeAccepted: true}},
		{"InvalidIdempotentRequest", &ProviderError{StatusCode: 409, Name: ErrorNameInvalidIdempotentRequest}, Outcome{Action: ActionCancel}},
		{"ConflictOther", &ProviderError{StatusCode: 409, Name: "other"}, Outcome{Action: ActionCancel}},
		{"ValidationError", &ProviderError{StatusCode: 422, Name: "validation_error"}, Outcome{Action: ActionCancel}},
		{"BadRequest", &ProviderError{StatusCode: 400, Name: "invalid_idempotency_key"}, Outcome{Action: ActionCancel}},
		{"Unauthorized", &ProviderError{StatusCode: 401, Name: "missing_api_key"}, Outcome{Action: ActionCancel}},
		{"Forbidden", &ProviderError{StatusCode: 403, Name: "invalid_api_key"}, Outcome{Action: ActionCancel}},
		{"InternalServerError", &ProviderError{StatusCode: 500, Name: "internal_server_error"}, Outcome{Action: ActionRetry, Outage: true}},
		{"ServiceUnavailable", &ProviderError{StatusCode: 503}, Outcome{Action: ActionRetry, Outage: true}},
		{"Wrapped", wrap(&ProviderError{StatusCode: 422}), Outcome{Action: ActionCancel}},
		{"InvalidMessage", wrap(ErrInvalidMessage), Outcome{Action: ActionCancel}},
		{"ResendRateLimitError", &resend.RateLimitError{RetryAfter: "7"}, Outcome{Action: ActionSnooze, SnoozeFor: 7 * time.Second, Outage: true}},
		{"NetworkError", wrap(&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}), Outcome{Action: ActionRetry, Outage: true, MaybeAccepted: true}},
		{"Unsent", fmt.Errorf("error sending email: %w: %w", ErrUnsent, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}), Outcome{Action: ActionRetry, Outage: true}},
		{"Timeout", wrap(context.DeadlineExceeded), Outcome{Action: ActionRetry, Outage: true, MaybeAccepted: true}},
		{"Canceled", wrap(context.Canceled), Outcome{Action: ActionRetry, Outage: true, MaybeAccepted: true}},
		{"Unknown", errors.New("something else"), Outcome{Action: ActionRetry, Outage: true, MaybeAccepted: true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			require.Equal(t, tt.want, Classify(tt.err))
		})
	}
}

func TestClassify_SMTP(t *testing.T) {
	t.Parallel()

	const id = "<0123@example.com>"
	reply := func(phase SMTPPhase, code int, enhanced string) error {
		return fmt.Errorf("error in job: %w", &SMTPError{Phase: phase, Code: code, EnhancedCode: enhanced, MessageID: id})
	}
	lost := func(phase SMTPPhase) error {
		return &SMTPError{Phase: phase, MessageID: id, cause: errors.New("connection reset by peer")}
	}
	retry := Outcome{Action: ActionRetry, Outage: true}
	for _, tt := range []struct {
		name string
		err  error
		want Outcome
	}{
		{"ConnectRefused", lost(SMTPPhaseConnect), retry},
		{"Greeting421", reply(SMTPPhaseConnect, 421, "4.3.2"), retry},
		{"AuthFailed", reply(SMTPPhaseConnect, 535, "5.7.8"), retry},
		{"MailFromTemporary", reply(SMTPPhaseMailFrom, 451, ""), retry},
		{"MailFromRefused", reply(SMTPPhaseMailFrom, 553, "5.7.1"), retry},
		{"RcptTemporary", reply(SMTPPhaseRcptTo, 450, "4.2.1"), retry},
		{"RcptUnknownUser", reply(SMTPPhaseRcptTo, 550, "5.1.1"), Outcome{Action: ActionCancel, Bounce: &Bounce{Detail: "SMTP 550 5.1.1", EmailID: id}}},
		{"RcptNoEnhancedCode", reply(SMTPPhaseRcptTo, 550, ""), Outcome{Action: ActionCancel, Bounce: &Bounce{Detail: "SMTP 550", EmailID: id}}},
		{"RcptRelayDenied", reply(SMTPPhaseRcptTo, 554, "5.7.1"), retry},
		{"DataTemporary", reply(SMTPPhaseData, 451, ""), retry},
		{"DataRefused", reply(SMTPPhaseData, 554, "5.3.4"), Outcome{Action: ActionCancel}},
		{"DataLostBeforeEnd", lost(SMTPPhaseData), retry},
		{"EndOfDataTemporary", reply(SMTPPhaseEndOfData, 452, "4.3.1"), retry},
		{"EndOfDataRefused", reply(SMTPPhaseEndOfData, 550, "5.7.1"), Outcome{Action: ActionCancel}},
		{"EndOfDataLost", lost(SMTPPhaseEndOfData), Outcome{Action: ActionRetry, Outage: true, MaybeAccepted: true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			require.Equal(t, tt.want, Classify(tt.err))
		})
	}
}

func TestSMTPError_Error(t *testing.T) {
	t.Parallel()

	require.Equal(t, "SMTP RCPT TO answered 550 5.1.1", (&SMTPError{Phase: SMTPPhaseRcptTo, Code: 550, EnhancedCode: "5.1.1"}).Error())
	require.Equal(t, "SMTP DATA answered 451", (&SMTPError{Phase: SMTPPhaseData, Code: 451}).Error())
	err := &SMTPError{Phase: SMTPPhaseEndOfData, cause: fmt.Errorf("%w: closing SMTP DATA writer", context.Canceled)}
	require.Equal(t, "SMTP end of data: no reply: context canceled: closing SMTP DATA writer", err.Error())
	require.ErrorIs(t, err, context.Canceled, "a cut-short send stays recognisable")
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
