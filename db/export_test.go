package db

import "context"

// WithCounterBatchHooks sets config's hooks of the batching of checks: queued is told of each
// check that waits for a batch (with the queue's length), gate runs before each batch's
// statement (with the batch's size) and may hold it.
func WithCounterBatchHooks(config *TablesConfig, queued func(n int), gate func(ctx context.Context, n int)) *TablesConfig {
	config.batchQueued, config.batchGate = queued, gate
	return config
}
