//go:build !baseline

package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/postguard/postguard/db"
)

// An app that uses postguard's limiter without its River jobs prunes the counters itself: every
// fresh key (a new IP, a new account) leaves a row per rule that nothing else deletes, so a flood
// of fresh keys would grow the table for good. postguard's own prune_counters job does the same,
// every minute (docs/operations.md, Sizing the counters table).
const (
	// counterRetention is how long a counter is kept after its window ends. Once ended it counts
	// nothing; the minute covers the clocks of the app's processes disagreeing, so that no counter
	// of a window still open in one of them is deleted (and started afresh).
	counterRetention = time.Minute
	// pruneInterval is how often the counters are pruned: between two runs the table holds at
	// most a minute's fresh keys more than the rate × (window + counterRetention).
	pruneInterval = time.Minute
	// pruneBatchSize bounds each delete; on SQLite it holds the one connection while it runs.
	pruneBatchSize = 10_000
	// pruneBatchPause is the breath between two full batches, for the app's own statements.
	pruneBatchPause = 20 * time.Millisecond
)

// PruneCounters deletes the counters whose window ended before before, in batches, until none is
// left; it returns how many it deleted. Two at once (two processes of the app) only share the
// work.
func PruneCounters(ctx context.Context, tables db.Tables, before time.Time) (int64, error) {
	var total int64
	for {
		n, err := tables.RateLimitCounterDeleteExpired(ctx, before, pruneBatchSize)
		total += n
		if err != nil || n < pruneBatchSize {
			return total, err
		}
		select {
		case <-ctx.Done():
			return total, ctx.Err()
		case <-time.After(pruneBatchPause):
		}
	}
}

// pruner prunes the counters of tables every pruneInterval, the first time at once.
type pruner struct {
	tables db.Tables
	logger *slog.Logger
	now    func() time.Time
}

// run prunes until ctx ends.
func (p *pruner) run(ctx context.Context) {
	ticker := time.NewTicker(pruneInterval)
	defer ticker.Stop()
	for {
		p.once(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// once prunes the counters past counterRetention, and logs what it deleted, or why it could not
// (the next run tries again).
func (p *pruner) once(ctx context.Context) {
	n, err := PruneCounters(ctx, p.tables, p.now().Add(-counterRetention))
	switch {
	case err != nil && ctx.Err() == nil:
		p.logger.WarnContext(ctx, "error pruning rate-limit counters", slog.Any("error", err), slog.Int64("deleted", n))
	case n > 0:
		p.logger.InfoContext(ctx, "rate-limit counters pruned", slog.Int64("deleted", n))
	}
}
