package jobs

import (
	"strconv"
	"testing"
	"time"

	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"
)

func TestRetryPolicy_NextRetry(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		now time.Time
	}

	setup := func(t *testing.T) *testBundle {
		t.Helper()
		return &testBundle{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	}

	// jobWithErrors is a job on its attempt-th attempt, each earlier one having failed.
	jobWithErrors := func(attempt int) *rivertype.JobRow {
		job := &rivertype.JobRow{Attempt: attempt}
		for i := 1; i < attempt; i++ {
			job.Errors = append(job.Errors, rivertype.AttemptError{Attempt: i, Error: "boom"})
		}
		return job
	}

	// The delay scheduled when the attempt-th attempt fails.
	schedule := []struct {
		attempt int
		delay   time.Duration
	}{
		{1, 1 * time.Minute},
		{2, 2 * time.Minute},
		{3, 4 * time.Minute},
		{4, 8 * time.Minute},
		{5, 15 * time.Minute}, // 16 minutes, clamped
		{6, 15 * time.Minute},
		{20, 15 * time.Minute},
		{1000, 15 * time.Minute},
	}

	t.Run("ScheduleWithoutJitter", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t)
		policy := &RetryPolicy{NowFunc: func() time.Time { return bundle.now }, jitterFunc: func() float64 { return 0 }}

		for _, tt := range schedule {
			t.Run(strconv.Itoa(tt.attempt), func(t *testing.T) {
				require.Equal(t, bundle.now.Add(tt.delay), policy.NextRetry(jobWithErrors(tt.attempt)))
				require.Equal(t, tt.delay, RetryDelay(tt.attempt))
			})
		}
	})

	t.Run("MaxJitterStaysInRange", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t)
		policy := &RetryPolicy{NowFunc: func() time.Time { return bundle.now }, jitterFunc: func() float64 { return 0.999999 }}

		for _, tt := range schedule {
			next := policy.NextRetry(jobWithErrors(tt.attempt))
			delay := next.Sub(bundle.now)
			require.GreaterOrEqual(t, delay, tt.delay, "attempt %d", tt.attempt)
			require.LessOrEqual(t, delay, min(tt.delay+tt.delay/10, RetryMaxDelay), "attempt %d", tt.attempt)
			if tt.delay < RetryMaxDelay {
				require.Greater(t, delay, tt.delay, "jitter applied below the cap, attempt %d", tt.attempt)
			}
		}
	})

	t.Run("RealJitterStaysInRange", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t)
		policy := &RetryPolicy{NowFunc: func() time.Time { return bundle.now }}

		for range 200 {
			for _, tt := range schedule {
				delay := policy.NextRetry(jobWithErrors(tt.attempt)).Sub(bundle.now)
				require.GreaterOrEqual(t, delay, max(tt.delay, RetryMinDelay))
				require.LessOrEqual(t, delay, RetryMaxDelay)
			}
		}
	})

	t.Run("SnoozesDoNotCount", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t)
		policy := &RetryPolicy{NowFunc: func() time.Time { return bundle.now }, jitterFunc: func() float64 { return 0 }}

		// A job snoozed many times has a low attempt count and metadata, but it is its errors
		// that set the delay.
		job := jobWithErrors(3)
		job.Metadata = []byte(`{"snoozes": 7}`)
		require.Equal(t, bundle.now.Add(4*time.Minute), policy.NextRetry(job))
	})

	t.Run("DefaultsToTimeNow", func(t *testing.T) {
		t.Parallel()

		before := time.Now()
		next := (&RetryPolicy{}).NextRetry(jobWithErrors(1))
		require.WithinRange(t, next, before.Add(time.Minute), time.Now().Add(time.Minute+6*time.Second))
	})
}
