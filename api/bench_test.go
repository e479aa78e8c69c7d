package api

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/dbtest"
	"github.com/postguard/postguard/tokens"
)

// benchEngines are the stores the benchmarks run on.
var benchEngines = []struct {
	name     string
	newStore func(testing.TB) db.Store
}{
	{"Postgres", func(tb testing.TB) db.Store { return dbtest.NewPostgres(tb) }},
	{"SQLite", func(tb testing.TB) db.Store { return dbtest.NewSQLite(tb) }},
}

// serveBench sends req through router and fails b unless the answer has status want.
func serveBench(b *testing.B, router http.Handler, req *http.Request, want int) {
	rec := httptest.NewRecorder()
	router.ServeHTTP(rec, req)
	if rec.Code != want {
		b.Fatalf("%s %s: want %d, got %d: %s", req.Method, req.URL.Path, want, rec.Code, rec.Body.String())
	}
}

// BenchmarkPasswordRoutes measures, in one run and through the router with the real argon2id
// hasher, one registration per op next to one reset-password with an unknown token per op:
// the reset looks its token up and is refused before any hash, so it costs a small fraction of
// a registration rather than as much.
func BenchmarkPasswordRoutes(b *testing.B) {
	for _, engine := range benchEngines {
		b.Run(engine.name, func(b *testing.B) {
			bundle := setup(b, engine.newStore(b), nil)

			b.Run("Register", func(b *testing.B) {
				var n int
				for b.Loop() {
					n++
					serveBench(b, bundle.router, jsonRequest(b, "/v1/auth/register", map[string]string{
						"email": fmt.Sprintf("bench-%d-%s@example.com", n, rand.Text()[:8]), "password": "correct horse battery",
					}), http.StatusCreated)
				}
			})

			b.Run("ResetPasswordUnknownToken", func(b *testing.B) {
				for b.Loop() {
					serveBench(b, bundle.router, resetRequest(b, tokens.New(), "192.0.2.1"), http.StatusBadRequest)
				}
			})
		})
	}
}

// BenchmarkRegisterUnderResetFlood measures a genuine registration's latency (one per op, the
// ns/op, and its median as p50-ms) with the service otherwise idle, and while 100 clients send
// reset-password requests with made-up tokens as fast as they are answered (flood-req/s). Each
// flooding request costs a token lookup, not a password hash, so registrations keep the hasher
// to themselves. The figures are evidence, not assertions: compare Quiet with Flood100 of the
// same run.
func BenchmarkRegisterUnderResetFlood(b *testing.B) {
	for _, engine := range benchEngines {
		b.Run(engine.name, func(b *testing.B) {
			bundle := setup(b, engine.newStore(b), nil)

			for _, flooders := range []int{0, 100} {
				name := "Quiet"
				if flooders > 0 {
					name = fmt.Sprintf("Flood%d", flooders)
				}
				b.Run(name, func(b *testing.B) {
					ctx, stop := context.WithCancel(context.Background())
					var (
						wg      sync.WaitGroup
						flooded atomic.Int64
					)
					for range flooders {
						wg.Go(func() {
							for ctx.Err() == nil {
								serveBench(b, bundle.router, resetRequest(b, tokens.New(), "198.51.100.1"), http.StatusBadRequest)
								flooded.Add(1)
							}
						})
					}

					latencies := make([]time.Duration, 0, 64)
					var n int
					start := time.Now()
					for b.Loop() {
						n++
						req := jsonRequest(b, "/v1/auth/register", map[string]string{
							"email": fmt.Sprintf("flood-%d-%s@example.com", n, rand.Text()[:8]), "password": "correct horse battery",
						})
						began := time.Now()
						serveBench(b, bundle.router, req, http.StatusCreated)
						latencies = append(latencies, time.Since(began))
					}
					elapsed := time.Since(start)
					stop()
					wg.Wait()

					slices.Sort(latencies)
					b.ReportMetric(float64(latencies[len(latencies)/2])/float64(time.Millisecond), "p50-ms")
					b.ReportMetric(float64(flooded.Load())/elapsed.Seconds(), "flood-req/s")
				})
			}
		})
	}
}
