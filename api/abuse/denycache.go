package abuse

import (
	"math"
	"sync"
	"time"
)

// denyCache remembers refused (key, window) pairs until their window ends, so that a client
// hammering an exhausted window is answered without the database. A refusal is final until the
// window ends, for the built-in actions whose refusals it holds: counts only grow within a
// window, counters are pruned only after it ended, and only Limiter.Clear deletes one sooner
// (it removes the entry of its own process).
//
// It holds at most max entries and evicts the oldest insertion when full (a ring of keys beside
// the map; both always hold the same keys). Expired entries are not looked for: they answer no
// lookup and age out of the ring like any other. One mutex guards it; the critical sections are a
// map lookup or insertion.
type denyCache struct {
	mu      sync.Mutex
	entries map[denyKey]int64 // window end, Unix nanoseconds
	ring    []denyKey         // insertion order; when full, ring[next] is the oldest
	next    int
	max     int
}

type denyKey struct {
	key   keyHash
	start int64 // window start, Unix nanoseconds
}

func newDenyCache(size int) *denyCache {
	return &denyCache{
		entries: make(map[denyKey]int64, min(size, 1024)),
		ring:    make([]denyKey, 0, min(size, 1024)),
		max:     size,
	}
}

// contains reports whether (key, start) was refused and its window has not ended at now.
func (c *denyCache) contains(key keyHash, start time.Time, now time.Time) bool {
	k := denyKey{key: key, start: start.UnixNano()}
	c.mu.Lock()
	end, ok := c.entries[k]
	c.mu.Unlock()
	return ok && now.UnixNano() < end
}

// add remembers that (key, start) was refused, until end.
func (c *denyCache) add(key keyHash, start, end time.Time) {
	k := denyKey{key: key, start: start.UnixNano()}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[k]; ok {
		c.entries[k] = end.UnixNano()
		return
	}
	if len(c.ring) < c.max {
		c.ring = append(c.ring, k)
	} else {
		delete(c.entries, c.ring[c.next])
		c.ring[c.next] = k
		c.next = (c.next + 1) % c.max
	}
	c.entries[k] = end.UnixNano()
}

// remove forgets that (key, start) was refused. The entry is marked expired rather than deleted,
// so the map and the ring keep holding the same keys; a later add revives it in place.
func (c *denyCache) remove(key keyHash, start time.Time) {
	k := denyKey{key: key, start: start.UnixNano()}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[k]; ok {
		c.entries[k] = math.MinInt64
	}
}

// len returns the number of entries, expired ones included.
func (c *denyCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
