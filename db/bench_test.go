package db_test

import (
	"crypto/rand"
	"testing"
	"time"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/dbtest"
)

// BenchmarkStore_RateLimitCounterConsume measures one rate-limit statement, one round trip, on
// each engine: on fresh keys (an insert) and on one hot key (an update, or a refusal once the key
// is at its limit). 16 goroutines on two cores, like pgbench -c 16 running the same statement
// (see docs/operations.md, Capacity).
func BenchmarkStore_RateLimitCounterConsume(b *testing.B) {
	window := time.Now().Truncate(time.Hour)
	for _, engine := range []struct {
		name     string
		newStore func(testing.TB) db.Store
	}{
		{"Postgres", func(tb testing.TB) db.Store { return dbtest.NewPostgres(tb) }},
		{"SQLite", func(tb testing.TB) db.Store { return dbtest.NewSQLite(tb) }},
	} {
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
