package abuseprom_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/api/abuse/abuseprom"
	"github.com/postguard/postguard/db"
)

var testSecret = []byte("test secret: 32 bytes or more....")

// consumer admits the first two requests of every window and refuses the others.
type consumer struct{ counts map[string]int64 }

func (c *consumer) RateLimitCounterConsumeChain(_ context.Context, params *db.RateLimitCounterChainParams) (*db.RateLimitCounterChainResult, error) {
	result := &db.RateLimitCounterChainResult{}
	for _, w := range params.Windows {
		key := string(w.KeyHash) + w.WindowStart.String()
		if c.counts[key] >= 2 {
			break
		}
		c.counts[key]++
		result.Counts = append(result.Counts, c.counts[key])
	}
	return result, nil
}

func (c *consumer) RateLimitCounterGetMany(context.Context, []db.RateLimitCounterGetParams) ([]int64, error) {
	return nil, nil
}

func (c *consumer) RateLimitCounterDelete(context.Context, *db.RateLimitCounterDeleteParams) error {
	return nil
}

// decisions reads one series of postguard_rate_limit_decisions_total from reg.
func decisions(t *testing.T, reg *prometheus.Registry, action, scope, outcome string) float64 {
	t.Helper()

	families, err := reg.Gather()
	require.NoError(t, err)
	for _, family := range families {
		if family.GetName() != "postguard_rate_limit_decisions_total" {
			continue
		}
		for _, metric := range family.GetMetric() {
			labels := map[string]string{}
			for _, lp := range metric.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["action"] == action && labels["scope"] == scope && labels["outcome"] == outcome {
				return metric.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no series action=%s scope=%s outcome=%s", action, scope, outcome)
	return 0
}

func TestRegister(t *testing.T) {
	t.Parallel()

	registry := prometheus.NewRegistry()
	newLimiter := func() *abuse.Limiter {
		metrics, err := abuseprom.Register(registry)
		require.NoError(t, err)
		rules := abuse.Rules{}.With(abuse.Rule{Action: "search", Scope: abuse.ScopeIP, Limit: 2, Window: time.Minute})
		limiter, err := abuse.NewLimiter(&consumer{counts: map[string]int64{}}, testSecret, rules, &abuse.LimiterConfig{Metrics: metrics})
		require.NoError(t, err)
		return limiter
	}
	limiter := newLimiter()
	require.Zero(t, decisions(t, registry, "search", "ip", "allowed"), "every rule's series exists at zero from the start")
	require.Zero(t, decisions(t, registry, "search", "ip", "refused"))

	for range 3 {
		_, err := limiter.Allow(t.Context(), "search", abuse.Subject{IP: netip.MustParseAddr("192.0.2.1")})
		require.NoError(t, err)
	}
	require.InDelta(t, 2, decisions(t, registry, "search", "ip", "allowed"), 0)
	require.InDelta(t, 1, decisions(t, registry, "search", "ip", "refused"), 0)

	// A second limiter on the same registry counts on the same series.
	_, err := newLimiter().Allow(t.Context(), "search", abuse.Subject{IP: netip.MustParseAddr("192.0.2.2")})
	require.NoError(t, err)
	require.InDelta(t, 3, decisions(t, registry, "search", "ip", "allowed"), 0)

	// A collector of another kind under the name is an error, not a panic.
	other := prometheus.NewRegistry()
	other.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "postguard_rate_limit_decisions_total", Help: "not a counter"}))
	_, err = abuseprom.Register(other)
	require.ErrorContains(t, err, "error registering postguard_rate_limit_decisions_total")
}
