package jobs

import (
	"math/rand/v2"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

const (
	// RetryMinDelay is the delay after a job's first failure, and the shortest delay ever.
	RetryMinDelay = time.Minute
	// RetryMaxDelay is the longest delay between two attempts.
	RetryMaxDelay = 15 * time.Minute

	// retryJitterFraction is the most jitter added to a delay, as a fraction of it. Jitter only
	// lengthens a delay, and never past RetryMaxDelay, so the schedule stays inside its range.
	retryJitterFraction = 0.1
)

var _ river.ClientRetryPolicy = (*RetryPolicy)(nil)

// RetryPolicy is the client-wide retry schedule of postguard's jobs: 1 minute after the first
// failure, doubling after each further one, clamped to [RetryMinDelay, RetryMaxDelay]; with
// MaxAttempts 5 an email job is tried at about 0, 1, 3, 7 and 15 minutes. Up to 10% of jitter
// spreads retries of jobs that failed together (a provider outage), but never below the minimum
// or past the maximum.
//
// Like River's DefaultClientRetryPolicy, it counts errors (len(job.Errors)+1), not attempts, so
// snoozes, which give their attempt back, do not move the schedule.
type RetryPolicy struct {
	// NowFunc returns the current time. Defaults to time.Now.
	NowFunc func() time.Time

	// jitterFunc returns a number in [0, 1); rand.Float64 by default. Tests stub it.
	jitterFunc func() float64
}

// NextRetry returns when job should be tried again after the failure being recorded now.
func (p *RetryPolicy) NextRetry(job *rivertype.JobRow) time.Time {
	now := time.Now
	if p.NowFunc != nil {
		now = p.NowFunc
	}
	jitter := rand.Float64
	if p.jitterFunc != nil {
		jitter = p.jitterFunc
	}

	base := RetryDelay(len(job.Errors) + 1)
	delay := min(base+time.Duration(float64(base)*retryJitterFraction*jitter()), RetryMaxDelay)
	return now().UTC().Add(delay)
}

// RetryDelay is the delay without jitter after the errorCount-th failure (1 for the first):
// RetryMinDelay × 2^(errorCount-1), clamped to [RetryMinDelay, RetryMaxDelay].
func RetryDelay(errorCount int) time.Duration {
	if errorCount < 1 {
		return RetryMinDelay
	}
	delay := RetryMinDelay
	// Double step by step so that a huge count can neither overflow nor loop for long.
	for i := 1; i < errorCount && delay < RetryMaxDelay; i++ {
		delay *= 2
	}
	return min(delay, RetryMaxDelay)
}
