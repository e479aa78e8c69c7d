package abuseprom_test

import (
	"maps"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/api/abuse/abuseprom"
	"github.com/postguard/postguard/internal/dbtest"
)

var testSecret = []byte("test secret: 32 bytes or more....")

// decisions reads one series of postguard_rate_limit_decisions_total from reg.
func decisions(t *testing.T, reg *prometheus.Registry, action, scope, outcome string) float64 {
	t.Helper()
	return series(t, reg, "postguard_rate_limit_decisions_total", map[string]string{"action": action, "scope": scope, "outcome": outcome})
}

// deviceTokens reads one series of postguard_rate_limit_device_tokens_total from reg.
func deviceTokens(t *testing.T, reg *prometheus.Registry, action, outcome string) float64 {
	t.Helper()
	return series(t, reg, "postguard_rate_limit_device_tokens_total", map[string]string{"action": action, "outcome": outcome})
}

// series reads the counter of name whose labels are want from reg.
func series(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()

	families, err := reg.Gather()
	require.NoError(t, err)
	for _, family := range families {
		if family.GetName() != name {
			continue
		}
		for _, metric := range family.GetMetric() {
			labels := map[string]string{}
			for _, lp := range metric.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if maps.Equal(labels, want) {
				return metric.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no series %s%v", name, want)
	return 0
}

func TestRegister(t *testing.T) {
	t.Parallel()

	registry := prometheus.NewRegistry()
	store := dbtest.NewSQLite(t)
	newLimiter := func() *abuse.Limiter {
		metrics, err := abuseprom.Register(registry)
		require.NoError(t, err)
		rules := abuse.Rules{}.With(abuse.Rule{Action: "search", Scope: abuse.ScopeIP, Limit: 2, Window: time.Minute})
		limiter, err := abuse.NewLimiter(store, testSecret, rules, &abuse.LimiterConfig{Metrics: metrics})
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

	// The device tokens' series exist from the start for an action with a key rule.
	metrics, err := abuseprom.Register(registry)
	require.NoError(t, err)
	keyRules := abuse.Rules{}.With(abuse.Rule{Action: "login", Scope: abuse.ScopeKey, Limit: 2, Window: time.Minute})
	_, err = abuse.NewLimiter(store, testSecret, keyRules, &abuse.LimiterConfig{Metrics: metrics})
	require.NoError(t, err)
	for _, outcome := range abuse.DeviceOutcomes() {
		require.Zero(t, deviceTokens(t, registry, "login", outcome), outcome)
	}

	// A collector of another kind under the name is an error, not a panic.
	other := prometheus.NewRegistry()
	other.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "postguard_rate_limit_decisions_total", Help: "not a counter"}))
	_, err = abuseprom.Register(other)
	require.ErrorContains(t, err, "error registering postguard_rate_limit_decisions_total")
}
