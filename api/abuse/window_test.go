package abuse

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestWindowAt(t *testing.T) {
	t.Parallel()

	// 2026-01-01T00:00:00Z is a multiple of 15 minutes (and of an hour) since the epoch.
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const size = 15 * time.Minute

	tests := []struct {
		name  string
		now   time.Time
		start time.Time
	}{
		{"ExactlyAtStart", base, base},
		{"OneNanosecondAfterStart", base.Add(time.Nanosecond), base},
		{"Middle", base.Add(6 * time.Minute), base},
		{"OneNanosecondBeforeEnd", base.Add(size - time.Nanosecond), base},
		{"ExactlyAtEnd", base.Add(size), base.Add(size)},
		{"OtherTimeZone", base.Add(7 * time.Minute).In(time.FixedZone("X", 5*3600+1800)), base},
		{"BeforeEpoch", time.Unix(-1, 0), time.Unix(-900, 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			win := windowAt(tt.now, size)
			require.True(t, tt.start.Equal(win.start), "start %s, want %s", win.start, tt.start)
			require.Equal(t, size, win.end.Sub(win.start))
			require.Equal(t, time.UTC, win.start.Location())
			require.Zero(t, win.start.UnixNano()%int64(size), "aligned on the epoch")
		})
	}
}

func TestDecision_RetryAfterSeconds(t *testing.T) {
	t.Parallel()

	tests := []struct {
		resetAfter time.Duration
		want       int64
	}{
		{15 * time.Minute, 900},
		{540 * time.Second, 540},
		{540*time.Second + time.Nanosecond, 541},
		{time.Second, 1},
		{time.Second - time.Nanosecond, 1},
		{time.Nanosecond, 1},
		{0, 1},
		{-time.Second, 1},
	}
	for _, tt := range tests {
		d := &Decision{ResetAfter: tt.resetAfter}
		require.Equal(t, tt.want, d.RetryAfterSeconds(), "ResetAfter %s", tt.resetAfter)
	}
}

func TestDecision_SetHeaders(t *testing.T) {
	t.Parallel()

	rule := Rule{Action: ActionRegister, Scope: ScopeIP, Limit: 5, Window: 15 * time.Minute}

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()

		h := http.Header{}
		(&Decision{Rule: rule, ResetAfter: 540 * time.Second}).SetHeaders(h)
		require.Equal(t, `"register-ip";q=5;w=900`, h.Get("RateLimit-Policy"))
		require.Equal(t, `"register-ip";r=0;t=540`, h.Get("RateLimit"))
		require.Equal(t, "540", h.Get("Retry-After"))
	})

	t.Run("RefusedRoundsUp", func(t *testing.T) {
		t.Parallel()

		h := http.Header{}
		(&Decision{Rule: rule, ResetAfter: time.Nanosecond}).SetHeaders(h)
		require.Equal(t, `"register-ip";r=0;t=1`, h.Get("RateLimit"))
		require.Equal(t, "1", h.Get("Retry-After"))
	})

	t.Run("Allowed", func(t *testing.T) {
		t.Parallel()

		h := http.Header{}
		(&Decision{
			Allowed:    true,
			Rule:       Rule{Action: ActionForgotPassword, Scope: ScopeEmail, Limit: 3, Window: time.Hour},
			Remaining:  2,
			ResetAfter: 3599*time.Second + time.Millisecond,
		}).SetHeaders(h)
		require.Equal(t, `"forgot-password-email";q=3;w=3600`, h.Get("RateLimit-Policy"))
		require.Equal(t, `"forgot-password-email";r=2;t=3600`, h.Get("RateLimit"))
		require.Empty(t, h.Values("Retry-After"))
	})

	t.Run("NoRule", func(t *testing.T) {
		t.Parallel()

		h := http.Header{}
		(&Decision{Allowed: true}).SetHeaders(h)
		require.Empty(t, h)
	})
}
