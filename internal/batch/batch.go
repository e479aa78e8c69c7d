// Package batch is natural batching: calls that arrive while a statement is in flight wait and
// share the next one, so a busy process pays one round trip for many calls and an idle one pays
// no wait at all. The rate limiter's checks go through it (db's Tables).
//
// A Batcher runs at most MaxInFlight batches at once. A call that finds fewer in flight starts a
// batch at once, of itself and whatever waits before it; one that finds them all in flight waits
// in the queue until one ends, and then goes, with up to MaxSize calls queued in arrival order,
// in the next batch. Calls name keys (the rows they touch): no key is in two calls of one batch,
// nor in two batches in flight, and a call never overtakes an earlier call sharing one of its
// keys, so the calls of one key run one after another in arrival order.
package batch

import (
	"context"
	"errors"
	"sync"
)

// Config configures a Batcher.
type Config[T, R any] struct {
	// Run runs one batch, in one statement or one transaction: it returns one result per item,
	// in order, or an error for all of them. Its ctx ends when every caller of the batch has
	// given up (their contexts done), and carries the values of the first call's context.
	Run func(ctx context.Context, items []T) ([]R, error)

	// Keys returns the keys of item: the rows its run touches. They are compared as bytes.
	Keys func(item T) [][]byte

	// MaxInFlight is how many batches may run at once (at least 1): the connections the
	// statements may take.
	MaxInFlight int

	// MaxSize bounds a batch (at least 1).
	MaxSize int

	// Queued, when set, is told of each call that waits in the queue (all MaxInFlight batches
	// were running, or one held one of its keys), with the queue's length then: for tests.
	Queued func(n int)
}

// Batcher batches calls of Do; see the package documentation. It is safe for concurrent use.
type Batcher[T, R any] struct {
	config Config[T, R]

	mu       sync.Mutex
	queue    []*call[T, R] // in arrival order
	inFlight int
	busy     map[string]struct{} // the keys of the batches in flight
}

// call is one Do waiting for its result.
type call[T, R any] struct {
	ctx    context.Context
	item   T
	keys   [][]byte
	done   chan struct{} // closed once result and err are set
	result R
	err    error
	flight *flight // nil while queued
}

// flight is a batch in flight: cancel ends its run's context once no caller waits for it.
type flight struct {
	waiting int
	cancel  context.CancelFunc
}

// New returns a Batcher of config. It panics on a config without Run or Keys, or with bounds
// below 1: a programming error.
func New[T, R any](config Config[T, R]) *Batcher[T, R] {
	if config.Run == nil || config.Keys == nil || config.MaxInFlight < 1 || config.MaxSize < 1 {
		panic("batch.New: Run, Keys, MaxInFlight ≥ 1 and MaxSize ≥ 1 are required")
	}
	return &Batcher[T, R]{config: config, busy: make(map[string]struct{})}
}

// ErrDuplicateKey is returned by Do for an item naming one key twice: it could never share a
// batch with itself.
var ErrDuplicateKey = errors.New("batch: an item names one key twice")

// Do runs item in a batch and returns its result. When ctx ends while item waits in the queue,
// item is taken out of it and never runs, and Do returns ctx's error; when ctx ends while item's
// batch is in flight, Do returns ctx's error at once and the batch goes on for the others (item
// may then have run).
func (b *Batcher[T, R]) Do(ctx context.Context, item T) (R, error) {
	c := &call[T, R]{ctx: ctx, item: item, keys: b.config.Keys(item), done: make(chan struct{})}
	if duplicateKey(c.keys) {
		var zero R
		return zero, ErrDuplicateKey
	}

	b.mu.Lock()
	b.queue = append(b.queue, c)
	alone := b.startBatches(c)
	if c.flight == nil && b.config.Queued != nil {
		b.config.Queued(len(b.queue))
	}
	b.mu.Unlock()

	if alone {
		// An idle call is its batch alone: it runs on the caller's goroutine, under the
		// caller's ctx (nobody else waits for it), with no hand-off to another goroutine.
		results, err := b.config.Run(ctx, []T{item})
		b.finish([]*call[T, R]{c}, results, err)
		return c.result, c.err
	}

	select {
	case <-c.done:
		return c.result, c.err
	case <-ctx.Done():
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-c.done: // answered meanwhile: the answer stands
		return c.result, c.err
	default:
	}
	if c.flight == nil {
		b.remove(c)
	} else if c.flight.waiting--; c.flight.waiting == 0 {
		c.flight.cancel()
	}
	var zero R
	return zero, ctx.Err()
}

// startBatches starts batches from the queue while fewer than MaxInFlight run and a call can go.
// A batch that is caller alone is not started but counted in flight, and alone is true: the
// caller runs it itself. b.mu is held.
func (b *Batcher[T, R]) startBatches(caller *call[T, R]) (alone bool) {
	for b.inFlight < b.config.MaxInFlight && len(b.queue) > 0 {
		calls := b.take()
		if len(calls) == 0 { // every queued call waits on a key in flight
			return alone
		}
		b.inFlight++
		if len(calls) == 1 && calls[0] == caller {
			caller.flight = &flight{waiting: 1, cancel: func() {}}
			alone = true
			continue
		}
		ctx, cancel := context.WithCancel(context.WithoutCancel(calls[0].ctx))
		f := &flight{waiting: len(calls), cancel: cancel}
		for _, c := range calls {
			c.flight = f
		}
		go b.run(ctx, f, calls)
	}
	return alone
}

// take takes the next batch out of the queue: the calls, in arrival order, up to MaxSize, whose
// keys are in no batch in flight, in no call taken before them, and in no call left waiting
// before them (so that no call overtakes an earlier one of its keys). b.mu is held.
func (b *Batcher[T, R]) take() []*call[T, R] {
	var calls []*call[T, R]
	var waiting map[string]struct{} // the keys of calls left in the queue by this pass
	kept := b.queue[:0]
	for i, c := range b.queue {
		if len(calls) == b.config.MaxSize {
			kept = append(kept, b.queue[i:]...)
			break
		}
		if b.conflicts(c.keys, waiting) {
			if waiting == nil {
				waiting = make(map[string]struct{})
			}
			for _, key := range c.keys {
				waiting[string(key)] = struct{}{}
			}
			kept = append(kept, c)
			continue
		}
		for _, key := range c.keys {
			b.busy[string(key)] = struct{}{}
		}
		calls = append(calls, c)
	}
	clear(b.queue[len(kept):])
	b.queue = kept
	return calls
}

// conflicts says one of keys is busy or waiting. b.mu is held.
func (b *Batcher[T, R]) conflicts(keys [][]byte, waiting map[string]struct{}) bool {
	for _, key := range keys {
		if _, ok := b.busy[string(key)]; ok {
			return true
		}
		if _, ok := waiting[string(key)]; ok {
			return true
		}
	}
	return false
}

// run runs a batch in flight, answers its calls, and starts the batches it made room for.
func (b *Batcher[T, R]) run(ctx context.Context, f *flight, calls []*call[T, R]) {
	items := make([]T, len(calls))
	for i, c := range calls {
		items[i] = c.item
	}
	results, err := b.config.Run(ctx, items)
	f.cancel()
	b.finish(calls, results, err)
}

// finish answers the calls of a batch that ran, and starts the batches it made room for.
func (b *Batcher[T, R]) finish(calls []*call[T, R], results []R, err error) {
	if err == nil && len(results) != len(calls) {
		err = errors.New("batch: Run returned a result count other than its items'")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, c := range calls {
		if err != nil {
			c.err = err
		} else {
			c.result = results[i]
		}
		close(c.done)
		for _, key := range c.keys {
			delete(b.busy, string(key))
		}
	}
	b.inFlight--
	b.startBatches(nil)
}

// remove takes c out of the queue. b.mu is held.
func (b *Batcher[T, R]) remove(c *call[T, R]) {
	for i, queued := range b.queue {
		if queued == c {
			n := copy(b.queue[i:], b.queue[i+1:])
			b.queue[i+n] = nil
			b.queue = b.queue[:i+n]
			break
		}
	}
	// Calls behind c that waited only on c's keys may go now.
	b.startBatches(nil)
}

func duplicateKey(keys [][]byte) bool {
	for i := range keys {
		for j := range i {
			if string(keys[i]) == string(keys[j]) {
				return true
			}
		}
	}
	return false
}
