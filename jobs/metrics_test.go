package jobs

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/internal/dbtest"
)

func TestQueueDepthCollector(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		store := newStore(t)
		registry := prometheus.NewRegistry()
		registry.MustRegister(newQueueDepthCollector(store.Jobs(), dbtest.Logger(t)))

		for i := range 3 {
			_, err := store.JobInsert(t.Context(), VerificationEmailArgs{UserID: int64(i + 1)}, nil)
			require.NoError(t, err)
		}
		_, err := store.JobInsert(t.Context(), WelcomeEmailArgs{UserID: 1}, &river.InsertOpts{ScheduledAt: time.Now().Add(time.Hour)})
		require.NoError(t, err)

		require.Equal(t, map[string]float64{
			"available": 3,
			"pending":   0,
			"retryable": 0,
			"running":   0,
			"scheduled": 1,
		}, gatherGauges(t, registry, "postguard_jobs"))
	})
}

// gatherGauges returns a gauge family's values by their state label.
func gatherGauges(t *testing.T, registry *prometheus.Registry, name string) map[string]float64 {
	t.Helper()

	families, err := registry.Gather()
	require.NoError(t, err)
	values := map[string]float64{}
	for _, family := range families {
		if family.GetName() != name {
			continue
		}
		for _, metric := range family.GetMetric() {
			for _, label := range metric.GetLabel() {
				if label.GetName() == "state" {
					values[label.GetValue()] = metric.GetGauge().GetValue()
				}
			}
		}
	}
	return values
}
