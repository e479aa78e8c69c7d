package jobs

import (
	"sync"
	"time"
)

// DefaultCircuitCooldown is how long a provider's circuit stays open after an outage when
// Config.CircuitCooldown is zero.
const DefaultCircuitCooldown = 30 * time.Second

// circuitState is a circuit's state.
type circuitState string

const (
	// circuitClosed: the provider takes mail; attempts go to it in its turn.
	circuitClosed circuitState = "closed"
	// circuitOpen: the provider had an outage less than a cool-down ago; attempts try it only
	// after every provider whose circuit is closed.
	circuitOpen circuitState = "open"
	// circuitHalfOpen: the cool-down is over; the next attempt tries the provider in its turn
	// again, and its answer closes the circuit or opens it again.
	circuitHalfOpen circuitState = "half-open"
)

// circuit is one provider's health as this process has seen it: a circuit breaker that opens on
// the first outage (a failure mail.Classify calls one: a 5xx, a 429, a timeout, a network error,
// an SMTP 4xx reply) and half-opens after its cool-down; any answer that is not an outage (an
// acceptance, or a refusal of the message itself) closes it. Its state is per process: each
// worker process learns of an outage by its own first failed send.
//
// It is written here, not taken from a library (sony/gobreaker), because the mailer's clock runs
// it: tests stub that clock to put a circuit exactly where they want it.
type circuit struct {
	cooldown time.Duration

	mu       sync.Mutex
	openedAt time.Time // zero while closed
}

func newCircuit(cooldown time.Duration) *circuit {
	return &circuit{cooldown: cooldown}
}

// state is the circuit's state at now.
func (c *circuit) state(now time.Time) circuitState {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.openedAt.IsZero():
		return circuitClosed
	case now.Before(c.openedAt.Add(c.cooldown)):
		return circuitOpen
	}
	return circuitHalfOpen
}

// record takes an answer of the provider at now: an outage opens the circuit (again, from now),
// anything else closes it. changed says the circuit went from closed to open or back.
func (c *circuit) record(outage bool, now time.Time) (changed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	wasOpen := !c.openedAt.IsZero()
	if outage {
		c.openedAt = now
	} else {
		c.openedAt = time.Time{}
	}
	return wasOpen != outage
}
