// Package abuseprom counts an abuse.Limiter's decisions in Prometheus, for an app that asks for
// it: abuse itself links no metrics library. postguard's server registers it on its /metrics
// registry.
package abuseprom

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/postguard/postguard/api/abuse"
)

// Metrics are an abuse.Metrics on one Prometheus counter,
// postguard_rate_limit_decisions_total{action,scope,outcome} (outcome "allowed" or "refused").
type Metrics struct {
	decisions *prometheus.CounterVec
}

var _ abuse.Metrics = (*Metrics)(nil)

// Register registers postguard_rate_limit_decisions_total on reg and returns the Metrics that
// count on it (abuse.LimiterConfig.Metrics). A counter registered under that name already (by
// another Limiter's Register on the same registry) is shared.
func Register(reg prometheus.Registerer) (*Metrics, error) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "postguard_rate_limit_decisions_total",
		Help: "Rate-limit checks by action, scope and outcome (allowed or refused).",
	}, []string{"action", "scope", "outcome"})
	if err := reg.Register(vec); err != nil {
		var already prometheus.AlreadyRegisteredError
		existing, ok := vec, false
		if errors.As(err, &already) {
			existing, ok = already.ExistingCollector.(*prometheus.CounterVec)
		}
		if !ok {
			return nil, fmt.Errorf("error registering postguard_rate_limit_decisions_total: %w", err)
		}
		vec = existing
	}
	return &Metrics{decisions: vec}, nil
}

// Counters implements abuse.Metrics.
func (m *Metrics) Counters(action abuse.Action, scope abuse.Scope) (allowed, refused abuse.Counter) {
	return m.decisions.WithLabelValues(string(action), string(scope), "allowed"),
		m.decisions.WithLabelValues(string(action), string(scope), "refused")
}
