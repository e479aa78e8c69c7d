package abuse

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
)

// BenchmarkKey compares the pooled keyer with a fresh hmac.New per key (the simple way).
func BenchmarkKey(b *testing.B) {
	const email = "alice.smith@example.com"

	b.Run("Pooled", func(b *testing.B) {
		k := newKeyer(testSecret)
		b.ReportAllocs()
		for b.Loop() {
			_ = k.key(ActionRegister, ScopeEmail, email)
		}
	})

	b.Run("PooledParallel", func(b *testing.B) {
		k := newKeyer(testSecret)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_ = k.key(ActionRegister, ScopeEmail, email)
			}
		})
	})

	b.Run("HMACNewPerCall", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			mac := hmac.New(sha256.New, testSecret)
			mac.Write([]byte(keyPrefix + string(ActionRegister) + ":" + string(ScopeEmail) + ":" + email))
			_ = mac.Sum(nil)
		}
	})
}

func BenchmarkClientIP(b *testing.B) {
	trusted, err := ParseTrustedProxies("10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, fd00::/8")
	if err != nil {
		b.Fatal(err)
	}
	resolver := NewIPResolver(trusted)

	b.Run("UntrustedPeer", func(b *testing.B) {
		h := http.Header{"X-Forwarded-For": {"1.2.3.4"}}
		b.ReportAllocs()
		for b.Loop() {
			_ = resolver.ClientIP("203.0.113.9:51234", h)
		}
	})

	b.Run("TrustedChain", func(b *testing.B) {
		h := http.Header{"X-Forwarded-For": {"6.6.6.6, 198.51.100.1:5678, 172.16.0.9, 10.0.0.2"}}
		b.ReportAllocs()
		for b.Loop() {
			_ = resolver.ClientIP("10.0.0.1:51234", h)
		}
	})

	b.Run("TrustedIPv6", func(b *testing.B) {
		h := http.Header{"X-Forwarded-For": {"[2001:db8:1:2::77]:443, fd00::1"}}
		b.ReportAllocs()
		for b.Loop() {
			addr := resolver.ClientIP("[fd00::2]:51234", h)
			_ = BucketKey(addr)
		}
	})
}

// BenchmarkLimiter_Allow measures one check (the IP rule alone) per op on each engine:
// FreshKeys inserts a new counter every time; HotKey increments one row (limit out of reach);
// HotKeyParallel does so from GOMAXPROCS goroutines; RefusedCached is a refusal from the deny
// cache. FreshIPAndEmail is a request of two rules (IP, then email) on new counters, the
// auth routes' case: one round trip for both.
func BenchmarkLimiter_Allow(b *testing.B) {
	engines := []struct {
		name     string
		newStore func(b *testing.B) riverstore.Store
	}{
		{"Postgres", func(b *testing.B) riverstore.Store { return dbtest.NewPostgres(b) }},
		{"SQLite", func(b *testing.B) riverstore.Store { return dbtest.NewSQLite(b) }},
	}
	for _, engine := range engines {
		b.Run(engine.name, func(b *testing.B) {
			ctx := context.Background()
			newLimiter := func(b *testing.B, limit int64) *Limiter {
				b.Helper()
				rules := Rules{}.With(Rule{Action: ActionRegister, Scope: ScopeIP, Limit: limit, Window: time.Hour})
				return mustLimiter(b, engine.newStore(b), rules, nil)
			}
			allow := func(b *testing.B, l *Limiter, ip netip.Addr) *Decision {
				d, err := l.Allow(ctx, ActionRegister, Subject{IP: ip})
				if err != nil {
					b.Fatal(err)
				}
				return d
			}

			b.Run("FreshKeys", func(b *testing.B) {
				l := newLimiter(b, 5)
				var n uint32
				b.ReportAllocs()
				for b.Loop() {
					n++
					ip := netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
					if !allow(b, l, ip).Allowed {
						b.Fatal("refused")
					}
				}
			})

			b.Run("FreshIPAndEmail", func(b *testing.B) {
				rules := Rules{}.
					With(Rule{Action: ActionRegister, Scope: ScopeIP, Limit: 5, Window: 15 * time.Minute}).
					With(Rule{Action: ActionRegister, Scope: ScopeEmail, Limit: 5, Window: time.Hour})
				l := mustLimiter(b, engine.newStore(b), rules, nil)
				var n uint32
				b.ReportAllocs()
				for b.Loop() {
					n++
					ip := netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
					d, err := l.Allow(ctx, ActionRegister, Subject{IP: ip, Email: "user" + strconv.FormatUint(uint64(n), 10) + "@example.com"})
					if err != nil || !d.Allowed {
						b.Fatal("error or refusal", err)
					}
				}
			})

			b.Run("HotKey", func(b *testing.B) {
				l := newLimiter(b, 1<<62)
				b.ReportAllocs()
				for b.Loop() {
					if !allow(b, l, clientIP).Allowed {
						b.Fatal("refused")
					}
				}
			})

			b.Run("HotKeyParallel", func(b *testing.B) {
				l := newLimiter(b, 1<<62)
				var failed atomic.Bool
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						d, err := l.Allow(ctx, ActionRegister, Subject{IP: clientIP})
						if err != nil || !d.Allowed {
							failed.Store(true)
						}
					}
				})
				if failed.Load() {
					b.Fatal("error or refusal")
				}
			})

			b.Run("RefusedCached", func(b *testing.B) {
				l := newLimiter(b, 1)
				allow(b, l, clientIP)
				allow(b, l, clientIP) // refused by the database, now cached
				b.ReportAllocs()
				for b.Loop() {
					if allow(b, l, clientIP).Allowed {
						b.Fatal("allowed")
					}
				}
			})
		})
	}
}
