package main

import (
	"crypto/sha256"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/cmd/internal/service"
	"github.com/postguard/postguard/db"
)

// TestServe_PrunesCountersEveryInterval: `postguard serve` prunes the rate-limit counters every
// COUNTER_PRUNE_INTERVAL, apart from prune (PRUNE_INTERVAL, an hour): a counter whose window ended
// more than COUNTER_RETENTION ago, written after the start's run, is gone at a later run, and one
// within retention stays.
func TestServe_PrunesCountersEveryInterval(t *testing.T) {
	t.Parallel()

	tokenEngines(t, func(t *testing.T, engine *tokenEngine) {
		env := maps.Clone(engine.env)
		env["COUNTER_PRUNE_INTERVAL"] = "1s"
		env["COUNTER_RETENTION"] = "1m"
		env["LOG_LEVEL"] = "debug" // a run that deletes nothing says so at debug level only
		server := startServer(t, service.RoleServe, env)
		require.Eventually(t, func() bool { return strings.Contains(server.Logs.String(), "counters pruned") },
			30*time.Second, 10*time.Millisecond, "the counters' prune of the start did not run; logs:\n%s", server.Logs)

		store := engine.open(t)
		ctx := t.Context()
		now := time.Now().UTC().Truncate(time.Second)
		window := func(name string, end time.Time) *db.RateLimitCounterConsumeParams {
			sum := sha256.Sum256([]byte(name))
			return &db.RateLimitCounterConsumeParams{KeyHash: sum[:], WindowStart: end.Add(-15 * time.Minute), WindowEnd: end, LimitCount: 10}
		}
		expired := window("expired", now.Add(-2*time.Minute))
		kept := window("kept", now.Add(-30*time.Second))
		for _, p := range []*db.RateLimitCounterConsumeParams{expired, kept} {
			_, ok, err := store.RateLimitCounterConsume(ctx, p)
			require.NoError(t, err)
			require.True(t, ok)
		}
		counts := func() []int64 {
			res, err := store.RateLimitCounterGetMany(ctx, &db.RateLimitCounterWindowsParams{Windows: []db.RateLimitCounterGetParams{
				{KeyHash: expired.KeyHash, WindowStart: expired.WindowStart, WindowEnd: expired.WindowEnd},
				{KeyHash: kept.KeyHash, WindowStart: kept.WindowStart, WindowEnd: kept.WindowEnd},
			}})
			require.NoError(t, err)
			return res.Counts
		}
		require.Equal(t, []int64{1, 1}, counts())

		require.Eventually(t, func() bool { return counts()[0] == 0 }, 30*time.Second, 20*time.Millisecond,
			"the expired counter outlived COUNTER_PRUNE_INTERVAL; logs:\n%s", server.Logs)
		require.Equal(t, []int64{0, 1}, counts(), "the counter within COUNTER_RETENTION is kept")
		require.NoError(t, server.stop(t))
	})
}
