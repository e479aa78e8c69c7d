package api

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs/mail/resendfake"
	"github.com/postguard/postguard/tokens"
)

// benchEngines are the stores the benchmarks run on.
var benchEngines = []struct {
	name     string
	newStore func(testing.TB) riverstore.Store
}{
	{"Postgres", func(tb testing.TB) riverstore.Store { return dbtest.NewPostgres(tb) }},
	{"SQLite", func(tb testing.TB) riverstore.Store { return dbtest.NewSQLite(tb) }},
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

// BenchmarkResendWebhook measures POST /v1/webhooks/resend through the router, one process:
// each op is one signed email.delivered event, a new svix-id, about one of 100 accepted mails
// (its time later than the mail's last, so every event applies: the svix-id recorded, the
// message locked, read and written, in one transaction; the benchmark checks that none was
// taken for a replay or an unknown mail). Serial sends one event at a time;
// Parallel sends from GOMAXPROCS goroutines at once. events/s is the figure to read.
func BenchmarkResendWebhook(b *testing.B) {
	for _, engine := range benchEngines {
		b.Run(engine.name, func(b *testing.B) {
			store := engine.newStore(b)
			fake := resendfake.New(b, nil)
			bundle := setup(b, store, &setupOpts{configFunc: func(config *Config) { config.ResendWebhookSecret = fake.WebhookSecret() }})

			deliveries := make([]resendfake.Delivery, 100)
			for i := range deliveries {
				user, err := store.UserInsert(b.Context(), &db.UserInsertParams{
					Email: fmt.Sprintf("bench-%d-%s@example.com", i, strings.ToLower(rand.Text()[:8])), PasswordHash: "x", Now: time.Now(),
				})
				if err != nil {
					b.Fatal(err)
				}
				jobID := int64(5_000_000 + i)
				if _, err := store.EmailMessageInsert(b.Context(), &db.EmailMessageInsertParams{
					JobID: jobID, Kind: "welcome_email", UserID: user.ID, IdempotencyKey: tokens.IdempotencyKey("welcome_email", user.ID), Now: time.Now(),
				}); err != nil {
					b.Fatal(err)
				}
				deliveries[i] = resendfake.Delivery{ID: fmt.Sprintf("re_bench_%d_%s", i, rand.Text()[:8]), To: []string{user.Email}, ReceivedAt: time.Now()}
				if err := store.EmailMessageMarkAccepted(b.Context(), &db.EmailMessageMarkAcceptedParams{JobID: jobID, Provider: "resend", ProviderID: deliveries[i].ID, Now: time.Now()}); err != nil {
					b.Fatal(err)
				}
			}

			var seq atomic.Int64
			post := func(b *testing.B) {
				n := seq.Add(1)
				delivery := deliveries[n%int64(len(deliveries))]
				webhook := fake.Event(delivery, resendfake.EventDelivered, &resendfake.EventOpts{At: time.Now().Add(time.Duration(n) * time.Millisecond)})
				req, err := fake.WebhookRequest(context.Background(), "/v1/webhooks/resend", webhook)
				if err != nil {
					b.Fatal(err)
				}
				serveBench(b, bundle.router, req, http.StatusNoContent)
			}

			b.Run("Serial", func(b *testing.B) {
				start := time.Now()
				for b.Loop() {
					post(b)
				}
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
			})
			b.Run("Parallel", func(b *testing.B) {
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						post(b)
					}
				})
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
			})

			// Every event was merged into its message, none taken for a replay or an unknown mail.
			// (Two parallel events of one mail may be applied in the other order than their
			// times: the older is then out of order, merged all the same.)
			merged := events(b, bundle.registry, "email.delivered", EventApplied) + events(b, bundle.registry, "email.delivered", EventOutOfOrder)
			if merged != float64(seq.Load()) {
				b.Fatalf("%v of %d events merged", merged, seq.Load())
			}
		})
	}
}

// BenchmarkRateLimitedRoutes measures, through the router, one rate-limited request per op that
// every rule admits, each from a new client IP for a new email (fresh counters, as in a flood
// from many IPs), without forgot-password's uniform hold (ns/op is the work; the hold is
// timing, not cost): ForgotPasswordUnknownEmail and ResendVerificationUnknownEmail are two checks
// and a user lookup with no account found; ForgotPasswordKnownEmail adds the reset job's
// transaction; LimitsSpend is a custom action's IP and key checks.
func BenchmarkRateLimitedRoutes(b *testing.B) {
	for _, engine := range benchEngines {
		b.Run(engine.name, func(b *testing.B) {
			rules := generousRules().
				With(abuse.Rule{Action: "login", Scope: abuse.ScopeIP, Limit: 1 << 40, Window: 15 * time.Minute}).
				With(abuse.Rule{Action: "login", Scope: abuse.ScopeKey, Limit: 1 << 40, Window: 15 * time.Minute})
			bundle := setup(b, engine.newStore(b), &setupOpts{rules: &rules, configFunc: func(config *Config) {
				config.noUniformHold = true
				config.LimitsToken = limitsToken
			}})
			known := "known-" + rand.Text()[:8] + "@example.com"
			register(b, bundle.router, known)

			var n uint32
			fromNewIP := func(req *http.Request) *http.Request {
				n++
				req.RemoteAddr = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(n >> 16), byte(n >> 8), byte(n)}), 40000).String()
				return req
			}
			emailRoute := func(path, email string) func(b *testing.B) {
				return func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						addr := email
						if addr == "" {
							addr = fmt.Sprintf("nobody-%d-%s@example.com", n, rand.Text()[:8])
						}
						serveBench(b, bundle.router, fromNewIP(jsonRequest(b, path, map[string]string{"email": addr})), http.StatusAccepted)
					}
				}
			}
			b.Run("ForgotPasswordUnknownEmail", emailRoute("/v1/auth/forgot-password", ""))
			b.Run("ResendVerificationUnknownEmail", emailRoute("/v1/auth/resend-verification", ""))
			b.Run("ForgotPasswordKnownEmail", emailRoute("/v1/auth/forgot-password", known))
			b.Run("LimitsSpend", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					body := fmt.Sprintf(`{"ip":"10.1.%d.%d","key":"account-%d"}`, byte(n>>8), byte(n), n)
					n++
					serveBench(b, bundle.router, limitsRequestOf(b, http.MethodPost, "/v1/limits/login", body), http.StatusOK)
				}
			})
		})
	}
}
