package jobs

import (
	"context"
	"fmt"
	"time"
)

// pacerName names the shared send budget in the send_pacer table: one for all of Resend.
const pacerName = "resend"

// pacerMargin widens the interval between sends a little, so that clock skew between worker
// processes and the provider's own window edges never push a send over the provider's rate.
const pacerMargin = 1.05

// pacerReserver is the part of db.Store the pacer uses.
type pacerReserver interface {
	SendPacerReserve(ctx context.Context, name string, interval time.Duration, now time.Time) (time.Time, error)
}

// pacer spaces sends evenly under a rate shared by every worker process: each send reserves the
// next slot of a schedule kept in the database (GCRA's theoretical arrival time), one interval
// after the previous slot and never before now, then waits for it. Sends are therefore paced,
// not bursted at window edges, and a backlog drains at the rate without 429s.
type pacer struct {
	interval time.Duration
	store    pacerReserver
}

// newPacer returns nil (unpaced) when maxRPS is 0.
func newPacer(store pacerReserver, maxRPS float64) *pacer {
	if maxRPS <= 0 {
		return nil
	}
	return &pacer{
		interval: pacerInterval(maxRPS),
		store:    store,
	}
}

// pacerInterval is the time between two sends at maxRPS, margin included.
func pacerInterval(maxRPS float64) time.Duration {
	return time.Duration(float64(time.Second) / maxRPS * pacerMargin)
}

// reserve takes the next send slot.
func (p *pacer) reserve(ctx context.Context, now time.Time) (time.Time, error) {
	slot, err := p.store.SendPacerReserve(ctx, pacerName, p.interval, now)
	if err != nil {
		return time.Time{}, fmt.Errorf("error reserving a send slot: %w", err)
	}
	return slot, nil
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
