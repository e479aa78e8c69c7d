package jobs

import (
	"context"
	"fmt"
	"time"
)

// pacerMargin widens the interval between sends a little, so that the time between a slot and
// its POST reaching the provider (which varies) and the provider's own window edges never push a
// send over the provider's rate.
const pacerMargin = 1.05

// pacerReserver is the part of db.Tables the pacer uses.
type pacerReserver interface {
	SendPacerReserve(ctx context.Context, name string, interval time.Duration) (slot, now time.Time, err error)
	Now(ctx context.Context) (time.Time, error)
}

// pacer spaces sends evenly under a rate shared by every worker process: each send reserves the
// next slot of a schedule kept in the database (GCRA's theoretical arrival time), one interval
// after the previous slot and never before the database's now, then waits for it. Sends are
// therefore paced, not bursted at window edges, and a backlog drains at the rate without 429s.
// The schedule and every wait are on the database's clock: a worker whose own clock is off
// (an hour ahead, say) neither pushes the shared schedule nor waits by its own clock.
type pacer struct {
	// name names the shared send budget in the send_pacer table: its provider's.
	name     string
	interval time.Duration
	store    pacerReserver
}

// newPacer returns the pacer of the budget name, or nil (unpaced) when maxRPS is 0.
func newPacer(store pacerReserver, name string, maxRPS float64) *pacer {
	// Slots are kept in microseconds: a rate whose slots would be closer is no pace at all.
	if !(maxRPS > 0) || pacerInterval(maxRPS) < time.Microsecond {
		return nil
	}
	return &pacer{
		name:     name,
		interval: pacerInterval(maxRPS),
		store:    store,
	}
}

// pacerInterval is the time between two sends at maxRPS, margin included.
func pacerInterval(maxRPS float64) time.Duration {
	return time.Duration(float64(time.Second) / maxRPS * pacerMargin)
}

// reserve takes the next send slot, and returns it with the database's now.
func (p *pacer) reserve(ctx context.Context) (slot, now time.Time, err error) {
	slot, now, err = p.store.SendPacerReserve(ctx, p.name, p.interval)
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("error reserving a send slot: %w", err)
	}
	return slot, now, nil
}

// now reads the database's clock, for a job that comes back to a slot it reserved before.
func (p *pacer) now(ctx context.Context) (time.Time, error) {
	now, err := p.store.Now(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("error reading the send pacer's clock: %w", err)
	}
	return now, nil
}

// sleepContext waits d, or until ctx is done (then it returns ctx's error).
func sleepContext(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}
