package jobs

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCircuit(t *testing.T) {
	t.Parallel()

	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	type answer struct {
		at     time.Duration
		outage bool
	}
	for _, tt := range []struct {
		name string
		// answers are the provider's, at offsets from start; the state is read at at.
		answers []answer
		at      time.Duration
		want    circuitState
	}{
		{name: "NewIsClosed", at: 0, want: circuitClosed},
		{name: "OutageOpens", answers: []answer{{0, true}}, at: time.Second, want: circuitOpen},
		{name: "OpenUntilTheCooldownEnds", answers: []answer{{0, true}}, at: 30*time.Second - time.Nanosecond, want: circuitOpen},
		{name: "HalfOpenAfterTheCooldown", answers: []answer{{0, true}}, at: 30 * time.Second, want: circuitHalfOpen},
		{name: "AnOutageWhileHalfOpenOpensAgain", answers: []answer{{0, true}, {40 * time.Second, true}}, at: 60 * time.Second, want: circuitOpen},
		{name: "AnAnswerCloses", answers: []answer{{0, true}, {40 * time.Second, false}}, at: 41 * time.Second, want: circuitClosed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			c := newCircuit(30 * time.Second)
			for _, answer := range tt.answers {
				c.record(answer.outage, start.Add(answer.at))
			}
			require.Equal(t, tt.want, c.state(start.Add(tt.at)))
		})
	}

	t.Run("RecordSaysWhenItChanges", func(t *testing.T) {
		t.Parallel()

		c := newCircuit(time.Minute)
		require.False(t, c.record(false, start), "closed stays closed")
		require.True(t, c.record(true, start), "opens")
		require.False(t, c.record(true, start.Add(time.Second)), "open stays open")
		require.True(t, c.record(false, start.Add(2*time.Second)), "closes")
	})
}
