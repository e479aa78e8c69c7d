package jobs

import (
	"testing"
	"time"

	"github.com/riverqueue/river/rivertype"
)

func BenchmarkRetryPolicy_NextRetry(b *testing.B) {
	policy := &RetryPolicy{}
	job := &rivertype.JobRow{Attempt: 3, Errors: []rivertype.AttemptError{{At: time.Now()}, {At: time.Now()}}}
	b.ReportAllocs()
	for b.Loop() {
		_ = policy.NextRetry(job)
	}
}
