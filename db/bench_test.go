package db_test

import (
	"crypto/rand"
	"testing"
	"time"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/dbtest"
)

// benchEngines are the engines the store's benchmarks run on, each on a store of its own.
var benchEngines = []struct {
	name     string
	newStore func(testing.TB) db.Tables
}{
	{"Postgres", func(tb testing.TB) db.Tables { return dbtest.NewPostgres(tb) }},
	{"SQLite", func(tb testing.TB) db.Tables { return dbtest.NewSQLite(tb) }},
}

// freshPair is a request's two windows (IP, then email) in window, their keys to be filled.
func freshPair(window time.Time) []db.RateLimitCounterConsumeParams {
	return []db.RateLimitCounterConsumeParams{
		{KeyHash: make([]byte, 32), WindowStart: window, WindowEnd: window.Add(time.Hour), LimitCount: 5},
		{KeyHash: make([]byte, 32), WindowStart: window, WindowEnd: window.Add(time.Hour), LimitCount: 5},
	}
}

// BenchmarkStore_RateLimitCounterConsume measures one rate-limit statement, one round trip, on
// each engine: on fresh keys (an insert) and on one hot key (an update, or a refusal once the key
// is at its limit). 16 goroutines on two cores, like pgbench -c 16 running the same statement
// (see docs/operations.md, Capacity).
func BenchmarkStore_RateLimitCounterConsume(b *testing.B) {
	window := time.Now().Truncate(time.Hour)
	for _, engine := range benchEngines {
		b.Run(engine.name, func(b *testing.B) {
			store := engine.newStore(b)

			b.Run("FreshKeys", func(b *testing.B) {
				b.SetParallelism(8)
				b.RunParallel(func(pb *testing.PB) {
					params := &db.RateLimitCounterConsumeParams{KeyHash: make([]byte, 32), WindowStart: window, WindowEnd: window.Add(time.Hour), LimitCount: 5}
					for pb.Next() {
						rand.Read(params.KeyHash)
						if _, _, err := store.RateLimitCounterConsume(b.Context(), params); err != nil {
							b.Fatal(err)
						}
					}
				})
			})

			b.Run("HotKey", func(b *testing.B) {
				key := make([]byte, 32)
				rand.Read(key)
				b.SetParallelism(8)
				b.RunParallel(func(pb *testing.PB) {
					params := &db.RateLimitCounterConsumeParams{KeyHash: key, WindowStart: window, WindowEnd: window.Add(time.Hour), LimitCount: 1 << 40}
					for pb.Next() {
						if _, _, err := store.RateLimitCounterConsume(b.Context(), params); err != nil {
							b.Fatal(err)
						}
					}
				})
			})
		})
	}
}

// BenchmarkStore_RateLimitCounterConsumeChain measures a request's two checks (IP, then email) on
// fresh keys, 16 goroutines on two cores: as one chain (one round trip), as one chain that also
// reads an (absent) user, as one chain whose second window is a trusted device's (its revocation
// checked in the statement), and as the two statements one after the other that the chain
// replaced.
func BenchmarkStore_RateLimitCounterConsumeChain(b *testing.B) {
	window := time.Now().Truncate(time.Hour)
	for _, engine := range benchEngines {
		b.Run(engine.name, func(b *testing.B) {
			store := engine.newStore(b)
			chain := func(b *testing.B, lookup, device bool) {
				b.SetParallelism(8)
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					params := &db.RateLimitCounterChainParams{Windows: freshPair(window)}
					if device {
						params.Device = &db.RateLimitDeviceParams{Window: 1, KeyHash: make([]byte, 32), RevocationHash: make([]byte, 32), Since: time.Unix(0, 0)}
					}
					for pb.Next() {
						rand.Read(params.Windows[0].KeyHash)
						rand.Read(params.Windows[1].KeyHash)
						if lookup {
							params.UserEmail = rand.Text() + "@example.com"
						}
						if device {
							rand.Read(params.Device.KeyHash)
							rand.Read(params.Device.RevocationHash)
						}
						result, err := store.RateLimitCounterConsumeChain(b.Context(), params)
						if err != nil || len(result.Counts) != 2 {
							b.Fatal(err)
						}
					}
				})
			}
			b.Run("FreshPair", func(b *testing.B) { chain(b, false, false) })
			b.Run("FreshPairAndUser", func(b *testing.B) { chain(b, true, false) })
			b.Run("FreshPairTrustedDevice", func(b *testing.B) { chain(b, false, true) })
			b.Run("FreshPairTwoStatements", func(b *testing.B) {
				b.SetParallelism(8)
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					windows := freshPair(window)
					for pb.Next() {
						for i := range windows {
							rand.Read(windows[i].KeyHash)
							if _, _, err := store.RateLimitCounterConsume(b.Context(), &windows[i]); err != nil {
								b.Fatal(err)
							}
						}
					}
				})
			})
		})
	}
}

// BenchmarkStore_RateLimitCounterConsumeBatch measures a batch of 32 requests' checks as the
// Tables' batcher sends it under load (each request's IP and email on fresh keys, and its
// absent user), one batch at a time: one statement on PostgreSQL, one transaction on SQLite. It
// reports the cost per request (ns/check), to set beside FreshPairAndUser's.
func BenchmarkStore_RateLimitCounterConsumeBatch(b *testing.B) {
	const size = 32
	window := time.Now().Truncate(time.Hour)
	for _, engine := range benchEngines {
		b.Run(engine.name, func(b *testing.B) {
			store := engine.newStore(b)
			chains := make([]*db.RateLimitCounterChainParams, size)
			for i := range chains {
				chains[i] = &db.RateLimitCounterChainParams{Windows: freshPair(window)}
			}
			b.ReportAllocs()
			for b.Loop() {
				for _, chain := range chains {
					rand.Read(chain.Windows[0].KeyHash)
					rand.Read(chain.Windows[1].KeyHash)
					chain.UserEmail = rand.Text() + "@example.com"
				}
				results, err := store.RateLimitCounterConsumeBatch(b.Context(), chains)
				if err != nil || len(results) != size {
					b.Fatalf("%d results of %d: %v", len(results), size, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/check")
		})
	}
}
