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

// Metrics are an abuse.Metrics on two Prometheus counters:
// postguard_rate_limit_decisions_total{action,scope,outcome} (outcome "allowed" or "refused") and
// postguard_rate_limit_device_tokens_total{action,outcome}, what the trusted-device tokens
// requests carried turned out to be (abuse.DeviceOutcomes).
type Metrics struct {
	decisions, deviceTokens *prometheus.CounterVec
}

var _ abuse.Metrics = (*Metrics)(nil)

// Register registers postguard_rate_limit_decisions_total and
// postguard_rate_limit_device_tokens_total on reg and returns the Metrics that count on them
// (abuse.LimiterConfig.Metrics). A counter registered under either name already (by another
// Limiter's Register on the same registry) is shared.
func Register(reg prometheus.Registerer) (*Metrics, error) {
	decisions, err := register(reg, prometheus.CounterOpts{
		Name: "postguard_rate_limit_decisions_total",
		Help: "Rate-limit checks by action, scope and outcome (allowed or refused).",
	}, "action", "scope", "outcome")
	if err != nil {
		return nil, err
	}
	deviceTokens, err := register(reg, prometheus.CounterOpts{
		Name: "postguard_rate_limit_device_tokens_total",
		Help: "Trusted-device tokens that requests carried, by action and outcome (trusted, revoked, expired, forged, malformed).",
	}, "action", "outcome")
	if err != nil {
		return nil, err
	}
	return &Metrics{decisions: decisions, deviceTokens: deviceTokens}, nil
}

// register registers a counter vector on reg, or returns the one registered under its name.
func register(reg prometheus.Registerer, opts prometheus.CounterOpts, labels ...string) (*prometheus.CounterVec, error) {
	vec := prometheus.NewCounterVec(opts, labels)
	if err := reg.Register(vec); err != nil {
		var already prometheus.AlreadyRegisteredError
		if errors.As(err, &already) {
			if existing, ok := already.ExistingCollector.(*prometheus.CounterVec); ok {
				return existing, nil
			}
		}
		return nil, fmt.Errorf("error registering %s: %w", opts.Name, err)
	}
	return vec, nil
}

// Counters implements abuse.Metrics.
func (m *Metrics) Counters(action abuse.Action, scope abuse.Scope) (allowed, refused abuse.Counter) {
	return m.decisions.WithLabelValues(string(action), string(scope), "allowed"),
		m.decisions.WithLabelValues(string(action), string(scope), "refused")
}

// DeviceCounter implements abuse.Metrics.
func (m *Metrics) DeviceCounter(action abuse.Action, outcome string) abuse.Counter {
	return m.deviceTokens.WithLabelValues(string(action), outcome)
}
