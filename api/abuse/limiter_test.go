package abuse

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/tokens"
)

var testSecret = []byte("test secret: 32 bytes or more....")

// mustLimiter is NewLimiter with testSecret, failing tb on an error.
func mustLimiter(tb testing.TB, store Consumer, rules Rules, config *LimiterConfig) *Limiter {
	tb.Helper()
	l, err := NewLimiter(store, testSecret, rules, config)
	require.NoError(tb, err)
	return l
}

// testMetrics are Metrics in memory: each rule's counts by outcome, and which rules' counters
// NewLimiter asked for.
type testMetrics struct {
	mu     sync.Mutex
	counts map[string]*testCounter
}

type testCounter struct{ n atomic.Int64 }

func (c *testCounter) Inc() { c.n.Add(1) }

func newTestMetrics() *testMetrics { return &testMetrics{counts: map[string]*testCounter{}} }

func (m *testMetrics) Counters(action Action, scope Scope) (allowed, refused Counter) {
	m.mu.Lock()
	defer m.mu.Unlock()
	counter := func(outcome string) *testCounter {
		key := string(action) + "/" + string(scope) + "/" + outcome
		if m.counts[key] == nil {
			m.counts[key] = &testCounter{}
		}
		return m.counts[key]
	}
	return counter("allowed"), counter("refused")
}

func (m *testMetrics) DeviceCounter(action Action, outcome string) Counter {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := string(action) + "/device/" + outcome
	if m.counts[key] == nil {
		m.counts[key] = &testCounter{}
	}
	return m.counts[key]
}

// count is the count of one rule (scope "device": of the device tokens) and outcome; it fails t for a rule whose counters NewLimiter
// never asked for.
func (m *testMetrics) count(t *testing.T, action, scope, outcome string) int64 {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.counts[action+"/"+scope+"/"+outcome]
	require.True(t, ok, "no counter of action=%s scope=%s outcome=%s", action, scope, outcome)
	return c.n.Load()
}

// memConsumer is the counter statement's semantics in memory (insert at 1, or increment while
// below the limit), for the pure tests of window math and decisions. The same behaviours run
// against both real engines in limiter_db_test.go.
type memConsumer struct {
	mu          sync.Mutex
	counts      map[memKey]int64
	revocations map[string]time.Time
	calls       atomic.Int64
	params      []db.RateLimitCounterConsumeParams
	err         error
}

type memKey struct {
	key   string
	start int64
}

func newMemConsumer() *memConsumer {
	return &memConsumer{counts: make(map[memKey]int64), revocations: make(map[string]time.Time)}
}

// trusted says device stands; the caller holds m.mu.
func (m *memConsumer) trusted(device *db.RateLimitDeviceParams) bool {
	return device != nil && !m.revocations[string(device.RevocationHash)].After(device.Since)
}

// keyOf is window i's key, the device's bucket in its window while it stands.
func keyOf(keyHash []byte, i int, device *db.RateLimitDeviceParams, trusted bool) []byte {
	if trusted && i == device.Window {
		return device.KeyHash
	}
	return keyHash
}

// RateLimitCounterConsumeChain is one call, however many windows it spends (one round trip to a
// real store). It reads no user: the store tests cover the lookup.
func (m *memConsumer) RateLimitCounterConsumeChain(_ context.Context, params *db.RateLimitCounterChainParams) (*db.RateLimitCounterChainResult, error) {
	m.calls.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		m.params = append(m.params, params.Windows[0])
		return nil, m.err
	}
	result := &db.RateLimitCounterChainResult{DeviceTrusted: m.trusted(params.Device)}
	for i, w := range params.Windows {
		w.KeyHash = keyOf(w.KeyHash, i, params.Device, result.DeviceTrusted)
		m.params = append(m.params, w)
		k := memKey{string(w.KeyHash), w.WindowStart.UnixNano()}
		if m.counts[k] >= w.LimitCount {
			break
		}
		m.counts[k]++
		result.Counts = append(result.Counts, m.counts[k])
	}
	return result, nil
}

// each calls fn with each window's key, under the lock, and says whether the device stood.
func (m *memConsumer) each(params *db.RateLimitCounterWindowsParams, fn func(i int, k memKey)) (bool, error) {
	m.calls.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return false, m.err
	}
	trusted := m.trusted(params.Device)
	for i, w := range params.Windows {
		fn(i, memKey{string(keyOf(w.KeyHash, i, params.Device, trusted)), w.WindowStart.UnixNano()})
	}
	return trusted, nil
}

func (m *memConsumer) RateLimitCounterGetMany(_ context.Context, params *db.RateLimitCounterWindowsParams) (*db.RateLimitCounterGetManyResult, error) {
	counts := make([]int64, len(params.Windows))
	trusted, err := m.each(params, func(i int, k memKey) { counts[i] = m.counts[k] })
	if err != nil {
		return nil, err
	}
	return &db.RateLimitCounterGetManyResult{Counts: counts, DeviceTrusted: trusted}, nil
}

func (m *memConsumer) RateLimitCounterRefund(_ context.Context, params *db.RateLimitCounterWindowsParams) (bool, error) {
	return m.each(params, func(_ int, k memKey) {
		if m.counts[k] > 0 {
			m.counts[k]--
		}
	})
}

func (m *memConsumer) RateLimitCounterDeleteMany(_ context.Context, params *db.RateLimitCounterWindowsParams) (bool, error) {
	return m.each(params, func(_ int, k memKey) { delete(m.counts, k) })
}

func (m *memConsumer) RateLimitDeviceRevocationGet(_ context.Context, keyHash []byte) (time.Time, error) {
	m.calls.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	if revokedAt, ok := m.revocations[string(keyHash)]; ok {
		return revokedAt, nil
	}
	return time.Unix(0, 0).UTC(), nil
}

func (m *memConsumer) RateLimitDeviceRevocationUpsert(_ context.Context, keyHash []byte) error {
	m.calls.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	// The database's clock, at its precision, always moving forward.
	revokedAt := time.Now().UTC().Truncate(time.Microsecond)
	if prev := m.revocations[string(keyHash)]; !revokedAt.After(prev) {
		revokedAt = prev.Add(time.Microsecond)
	}
	m.revocations[string(keyHash)] = revokedAt
	return nil
}

// countingConsumer wraps a Consumer and counts the calls that reach it.
type countingConsumer struct {
	Consumer
	calls atomic.Int64
}

func (c *countingConsumer) RateLimitCounterConsumeChain(ctx context.Context, params *db.RateLimitCounterChainParams) (*db.RateLimitCounterChainResult, error) {
	c.calls.Add(1)
	return c.Consumer.RateLimitCounterConsumeChain(ctx, params)
}

func (c *countingConsumer) RateLimitCounterDeleteMany(ctx context.Context, params *db.RateLimitCounterWindowsParams) (bool, error) {
	c.calls.Add(1)
	return c.Consumer.RateLimitCounterDeleteMany(ctx, params)
}

func (c *countingConsumer) RateLimitCounterRefund(ctx context.Context, params *db.RateLimitCounterWindowsParams) (bool, error) {
	c.calls.Add(1)
	return c.Consumer.RateLimitCounterRefund(ctx, params)
}

func (c *countingConsumer) RateLimitCounterGetMany(ctx context.Context, params *db.RateLimitCounterWindowsParams) (*db.RateLimitCounterGetManyResult, error) {
	c.calls.Add(1)
	return c.Consumer.RateLimitCounterGetMany(ctx, params)
}

// stubClock is a settable clock for NowFunc.
type stubClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stubClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stubClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// windowBase is aligned on 15 minutes, 30 minutes and an hour.
var windowBase = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

var (
	clientIP  = netip.MustParseAddr("198.51.100.7")
	clientIP2 = netip.MustParseAddr("198.51.100.8")
)

func TestLimiter_Allow(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		clock    *stubClock
		consumer *memConsumer
		metrics  *testMetrics
	}

	setup := func(t *testing.T, config *LimiterConfig) (*Limiter, *testBundle) {
		t.Helper()

		bundle := &testBundle{
			clock:    &stubClock{now: windowBase},
			consumer: newMemConsumer(),
			metrics:  newTestMetrics(),
		}
		if config == nil {
			config = &LimiterConfig{}
		}
		config.NowFunc = bundle.clock.Now
		config.Metrics = bundle.metrics
		return mustLimiter(t, bundle.consumer, DefaultRules(), config), bundle
	}

	ctx := context.Background()

	allow := func(t *testing.T, l *Limiter, action Action, ip netip.Addr, email string) *Decision {
		t.Helper()
		d, err := l.Allow(ctx, action, Subject{IP: ip, Email: email})
		require.NoError(t, err)
		return d
	}

	t.Run("WindowEdges", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t, nil)

		// Exactly at the window start: the whole window remains.
		d := allow(t, l, ActionRegister, clientIP, "")
		require.True(t, d.Allowed)
		require.Equal(t, int64(4), d.Remaining)
		require.Equal(t, 15*time.Minute, d.ResetAfter)

		for range 4 {
			require.True(t, allow(t, l, ActionRegister, clientIP, "").Allowed)
		}

		bundle.clock.Set(windowBase.Add(6 * time.Minute))
		d = allow(t, l, ActionRegister, clientIP, "")
		require.False(t, d.Allowed)
		require.Equal(t, 9*time.Minute, d.ResetAfter)
		require.Equal(t, int64(540), d.RetryAfterSeconds())
		h := http.Header{}
		d.SetHeaders(h)
		require.Equal(t, `"register-ip";q=5;w=900`, h.Get("RateLimit-Policy"))
		require.Equal(t, `"register-ip";r=0;t=540`, h.Get("RateLimit"))
		require.Equal(t, "540", h.Get("Retry-After"))

		// One nanosecond before the end: still refused, retry after 1 second.
		bundle.clock.Set(windowBase.Add(15*time.Minute - time.Nanosecond))
		d = allow(t, l, ActionRegister, clientIP, "")
		require.False(t, d.Allowed)
		require.Equal(t, time.Nanosecond, d.ResetAfter)
		require.Equal(t, int64(1), d.RetryAfterSeconds())

		// Exactly at the end: a new window.
		bundle.clock.Set(windowBase.Add(15 * time.Minute))
		d = allow(t, l, ActionRegister, clientIP, "")
		require.True(t, d.Allowed)
		require.Equal(t, int64(4), d.Remaining)
		require.Equal(t, 15*time.Minute, d.ResetAfter)

		p := bundle.consumer.params[len(bundle.consumer.params)-1]
		require.True(t, windowBase.Add(15*time.Minute).Equal(p.WindowStart))
		require.True(t, windowBase.Add(30*time.Minute).Equal(p.WindowEnd))
		require.Equal(t, int64(5), p.LimitCount)
	})

	t.Run("IPRuleFirstThenEmail", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t, nil)

		// Three requests for one email from three IPs pass; the fourth is refused by the email rule.
		for i := range 3 {
			d := allow(t, l, ActionForgotPassword, netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), "alice@example.com")
			require.True(t, d.Allowed)
		}
		d := allow(t, l, ActionForgotPassword, clientIP, "alice@example.com")
		require.False(t, d.Allowed)
		require.Equal(t, ScopeEmail, d.Rule.Scope)
		require.Equal(t, time.Hour, d.ResetAfter)

		// That refused request spent clientIP's allowance: 4 left, not 5.
		d = allow(t, l, ActionForgotPassword, clientIP, "")
		require.True(t, d.Allowed)
		require.Equal(t, int64(3), d.Remaining)
		require.Equal(t, ScopeIP, d.Rule.Scope)

		calls := bundle.consumer.calls.Load()
		// IP allowance now spent (2 used + 3 more); the IP refusal answers before the email rule.
		for range 3 {
			require.True(t, allow(t, l, ActionForgotPassword, clientIP, "").Allowed)
		}
		d = allow(t, l, ActionForgotPassword, clientIP, "bob@example.com")
		require.False(t, d.Allowed)
		require.Equal(t, ScopeIP, d.Rule.Scope)
		require.Equal(t, calls+3+1, bundle.consumer.calls.Load(), "email rule not checked after an IP refusal")

		// bob's email counter was never touched: bob from elsewhere has all 3.
		d = allow(t, l, ActionForgotPassword, clientIP2, "bob@example.com")
		require.True(t, d.Allowed)
		require.Equal(t, int64(2), d.Remaining)
	})

	t.Run("OfTellsEachRule", func(t *testing.T) {
		t.Parallel()

		l, _ := setup(t, nil)

		// Allowed: the answer is the tightest rule (the email's, 2 left), Of gives each.
		d := allow(t, l, ActionForgotPassword, clientIP, "alice@example.com")
		require.Equal(t, ScopeEmail, d.Rule.Scope)
		ip, ok := d.Of(ScopeIP)
		require.True(t, ok)
		require.True(t, ip.Allowed)
		require.Equal(t, int64(4), ip.Remaining)
		require.Equal(t, 15*time.Minute, ip.ResetAfter)
		email, ok := d.Of(ScopeEmail)
		require.True(t, ok)
		require.Equal(t, int64(2), email.Remaining)

		// Refused by the email rule: Of(ScopeIP) is the IP rule's admission, with its headers only.
		for i := range 2 {
			allow(t, l, ActionForgotPassword, netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), "alice@example.com")
		}
		d = allow(t, l, ActionForgotPassword, clientIP2, "alice@example.com")
		require.False(t, d.Allowed)
		require.Equal(t, ScopeEmail, d.Rule.Scope)
		ip, ok = d.Of(ScopeIP)
		require.True(t, ok)
		require.True(t, ip.Allowed)
		require.Equal(t, int64(4), ip.Remaining)
		h := http.Header{}
		ip.SetHeaders(h)
		require.Equal(t, `"forgot-password-ip";q=5;w=900`, h.Get("RateLimit-Policy"))
		require.Equal(t, `"forgot-password-ip";r=4;t=900`, h.Get("RateLimit"))
		require.Empty(t, h.Get("Retry-After"))

		// Refused by the IP rule: the email rule was not checked.
		for range 4 {
			allow(t, l, ActionForgotPassword, clientIP2, "")
		}
		d = allow(t, l, ActionForgotPassword, clientIP2, "bob@example.com")
		require.False(t, d.Allowed)
		ip, ok = d.Of(ScopeIP)
		require.True(t, ok)
		require.Same(t, d, ip)
		_, ok = d.Of(ScopeEmail)
		require.False(t, ok)

		// No email given: no email decision.
		d = allow(t, l, ActionRegister, clientIP, "")
		_, ok = d.Of(ScopeEmail)
		require.False(t, ok)
	})

	t.Run("EmptyEmailSkipsEmailRule", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t, nil)

		d := allow(t, l, ActionResendVerification, clientIP, "")
		require.True(t, d.Allowed)
		require.Equal(t, ScopeIP, d.Rule.Scope)
		require.Equal(t, int64(5), d.Remaining)
		require.Equal(t, int64(1), bundle.consumer.calls.Load())
	})

	t.Run("AllowedShowsLeastRemaining", func(t *testing.T) {
		t.Parallel()

		l, _ := setup(t, nil)

		// IP: 5/15m → 4 left; email: 3/1h → 2 left.
		d := allow(t, l, ActionRegister, clientIP, "alice@example.com")
		require.True(t, d.Allowed)
		require.Equal(t, ScopeEmail, d.Rule.Scope)
		require.Equal(t, int64(2), d.Remaining)
		require.Equal(t, time.Hour, d.ResetAfter)

		// Other IP, spend it down to 1 left while the email has 1 left too: tie → the later reset.
		for range 3 {
			allow(t, l, ActionRegister, clientIP2, "")
		}
		d = allow(t, l, ActionRegister, clientIP2, "alice@example.com")
		require.True(t, d.Allowed)
		require.Equal(t, int64(1), d.Remaining)
		require.Equal(t, ScopeEmail, d.Rule.Scope)

		// IP has 0 left, email refuses next anyway; with a fresh email the IP rule is the tightest.
		d = allow(t, l, ActionRegister, clientIP2, "carol@example.com")
		require.True(t, d.Allowed)
		require.Equal(t, ScopeIP, d.Rule.Scope)
		require.Equal(t, int64(0), d.Remaining)
	})

	t.Run("ActionsAndIPv6BucketsAreSeparate", func(t *testing.T) {
		t.Parallel()

		l, _ := setup(t, nil)

		a := netip.MustParseAddr("2001:db8:1:2::1")
		b := netip.MustParseAddr("2001:db8:1:2:dead:beef::9") // same /64
		for range 5 {
			require.True(t, allow(t, l, ActionRegister, a, "").Allowed)
		}
		require.False(t, allow(t, l, ActionRegister, b, "").Allowed, "same /64, same counter")
		require.True(t, allow(t, l, ActionRegister, netip.MustParseAddr("2001:db8:1:3::1"), "").Allowed, "other /64")
		require.True(t, allow(t, l, ActionForgotPassword, b, "").Allowed, "other action")
	})

	t.Run("UnknownAction", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t, nil)

		_, err := l.Allow(ctx, "login", Subject{IP: clientIP})
		require.ErrorContains(t, err, `no rate-limit rule for action "login"`)
		require.Zero(t, bundle.consumer.calls.Load())
	})

	t.Run("StoreError", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t, nil)
		bundle.consumer.err = errors.New("connection refused")

		d, err := l.Allow(ctx, ActionRegister, Subject{IP: clientIP, Email: "alice@example.com"})
		require.Nil(t, d)
		require.ErrorIs(t, err, bundle.consumer.err)
		require.ErrorContains(t, err, "error consuming rate limits of register")
	})

	t.Run("ParamsCarryNoRawValues", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t, nil)

		allow(t, l, ActionRegister, clientIP, "alice@example.com")
		require.Len(t, bundle.consumer.params, 2)
		keys := newKeyer(testSecret)
		ipKey, emailKey := keys.key(ActionRegister, ScopeIP, "198.51.100.7"), keys.key(ActionRegister, ScopeEmail, "alice@example.com")
		require.Equal(t, ipKey[:], bundle.consumer.params[0].KeyHash)
		require.Equal(t, emailKey[:], bundle.consumer.params[1].KeyHash)
		for _, p := range bundle.consumer.params {
			require.Len(t, p.KeyHash, 32)
			require.NotContains(t, string(p.KeyHash), "198.51.100.7")
			require.NotContains(t, string(p.KeyHash), "alice")
		}
	})

	t.Run("DenyCache", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t, nil)

		for range 5 {
			require.True(t, allow(t, l, ActionRegister, clientIP, "").Allowed)
		}
		require.False(t, allow(t, l, ActionRegister, clientIP, "").Allowed)
		require.Equal(t, int64(6), bundle.consumer.calls.Load())

		// Repeat refusals come from the cache, with the same answer.
		bundle.clock.Set(windowBase.Add(10 * time.Minute))
		for range 20 {
			d := allow(t, l, ActionRegister, clientIP, "")
			require.False(t, d.Allowed)
			require.Equal(t, 5*time.Minute, d.ResetAfter)
			require.Equal(t, ScopeIP, d.Rule.Scope)
		}
		require.Equal(t, int64(6), bundle.consumer.calls.Load(), "no database call for a cached refusal")

		// Another client is unaffected.
		require.True(t, allow(t, l, ActionRegister, clientIP2, "").Allowed)
		require.Equal(t, int64(7), bundle.consumer.calls.Load())

		// The entry ends with its window.
		bundle.clock.Set(windowBase.Add(15 * time.Minute))
		require.True(t, allow(t, l, ActionRegister, clientIP, "").Allowed)
		require.Equal(t, int64(8), bundle.consumer.calls.Load())
	})

	t.Run("DenyCacheEmailRefusal", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t, nil)

		for i := range 4 {
			allow(t, l, ActionRegister, netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), "alice@example.com")
		}
		calls := bundle.consumer.calls.Load()
		// A cached email refusal still spends the IP allowance through the database, and only
		// it.
		spent := len(bundle.consumer.params)
		d := allow(t, l, ActionRegister, clientIP, "alice@example.com")
		require.False(t, d.Allowed)
		require.Equal(t, ScopeEmail, d.Rule.Scope)
		require.Equal(t, calls+1, bundle.consumer.calls.Load())
		require.Len(t, bundle.consumer.params, spent+1, "the cached email's window went to the store")
	})

	t.Run("OneCallPerRequest", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t, nil)

		for i := range 10 {
			d := allow(t, l, ActionRegister, netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), "alice@example.com")
			require.Equal(t, i < 3, d.Allowed)
		}
		require.Equal(t, int64(10), bundle.consumer.calls.Load(), "both rules of each request in one call")
		// Three admitted and one refused by the email's window spent both windows; the six after
		// the email's refusal was cached spent the IP's only.
		require.Len(t, bundle.consumer.params, 4*2+6)
	})

	t.Run("DenyCacheDisabled", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t, &LimiterConfig{DenyCacheSize: -1})

		for range 10 {
			allow(t, l, ActionRegister, clientIP, "")
		}
		require.Equal(t, int64(10), bundle.consumer.calls.Load())
	})

	t.Run("Metrics", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t, nil)

		for range 7 {
			allow(t, l, ActionRegister, clientIP, "") // 5 allowed, 1 refused by the store, 1 by the cache
		}
		allow(t, l, ActionForgotPassword, clientIP, "alice@example.com")

		require.Equal(t, int64(5), bundle.metrics.count(t, "register", "ip", "allowed"))
		require.Equal(t, int64(2), bundle.metrics.count(t, "register", "ip", "refused"))
		require.Equal(t, int64(1), bundle.metrics.count(t, "forgot_password", "ip", "allowed"))
		require.Equal(t, int64(1), bundle.metrics.count(t, "forgot_password", "email", "allowed"))
		require.Zero(t, bundle.metrics.count(t, "resend_verification", "email", "refused"), "every rule's counters exist from the start")
	})
}

func TestLimiter_Peek(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		clock    *stubClock
		consumer *memConsumer
		metrics  *testMetrics
	}

	setup := func(t *testing.T, config *LimiterConfig) (*Limiter, *testBundle) {
		t.Helper()

		bundle := &testBundle{
			clock:    &stubClock{now: windowBase.Add(time.Minute)},
			consumer: newMemConsumer(),
			metrics:  newTestMetrics(),
		}
		if config == nil {
			config = &LimiterConfig{}
		}
		config.NowFunc = bundle.clock.Now
		config.Metrics = bundle.metrics
		return mustLimiter(t, bundle.consumer, DefaultRules(), config), bundle
	}

	ctx := context.Background()

	peek := func(t *testing.T, l *Limiter, action Action, ip netip.Addr, email string) *Decision {
		t.Helper()
		d, err := l.Peek(ctx, action, Subject{IP: ip, Email: email})
		require.NoError(t, err)
		return d
	}

	t.Run("SpendsNothing", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t, nil)

		for range 10 {
			d := peek(t, l, ActionRegister, clientIP, "alice@example.com")
			require.True(t, d.Allowed)
			require.Equal(t, ScopeEmail, d.Rule.Scope, "the tightest rule answers, as with Allow")
			require.Equal(t, int64(3), d.Remaining, "nothing spent yet: the whole window is left")
			require.Equal(t, time.Hour-time.Minute, d.ResetAfter)
		}
		require.Empty(t, bundle.consumer.counts, "a peek counted something")

		// Allow then sees the untouched window.
		d, err := l.Allow(ctx, ActionRegister, Subject{IP: clientIP, Email: "alice@example.com"})
		require.NoError(t, err)
		require.Equal(t, int64(2), d.Remaining)
		require.Equal(t, int64(2), peek(t, l, ActionRegister, clientIP, "alice@example.com").Remaining)
	})

	t.Run("RefusedAtLimit", func(t *testing.T) {
		t.Parallel()

		l, _ := setup(t, nil)

		for i := range 5 {
			require.Equal(t, int64(5-i), peek(t, l, ActionRegister, clientIP, "").Remaining)
			_, err := l.Allow(ctx, ActionRegister, Subject{IP: clientIP})
			require.NoError(t, err)
		}
		d := peek(t, l, ActionRegister, clientIP, "")
		require.False(t, d.Allowed)
		require.Equal(t, ScopeIP, d.Rule.Scope)
		require.Equal(t, int64(840), d.RetryAfterSeconds())
		ip, ok := d.Of(ScopeIP)
		require.True(t, ok)
		require.Same(t, d, ip)

		// The email rule is not read after an IP refusal; another IP is unaffected.
		_, ok = peek(t, l, ActionRegister, clientIP, "alice@example.com").Of(ScopeEmail)
		require.False(t, ok)
		require.True(t, peek(t, l, ActionRegister, clientIP2, "").Allowed)
	})

	t.Run("EmailAtLimit", func(t *testing.T) {
		t.Parallel()

		l, _ := setup(t, nil)

		for i := range 3 {
			_, err := l.Allow(ctx, ActionForgotPassword, Subject{IP: netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), Email: "alice@example.com"})
			require.NoError(t, err)
		}
		d := peek(t, l, ActionForgotPassword, clientIP, "alice@example.com")
		require.False(t, d.Allowed)
		require.Equal(t, ScopeEmail, d.Rule.Scope)
		ip, ok := d.Of(ScopeIP)
		require.True(t, ok)
		require.Equal(t, int64(5), ip.Remaining)
	})

	t.Run("DenyCache", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t, nil)

		for range 5 {
			_, err := l.Allow(ctx, ActionRegister, Subject{IP: clientIP})
			require.NoError(t, err)
		}
		require.False(t, peek(t, l, ActionRegister, clientIP, "").Allowed)
		calls := bundle.consumer.calls.Load()
		for range 10 {
			require.False(t, peek(t, l, ActionRegister, clientIP, "").Allowed)
		}
		require.Equal(t, calls, bundle.consumer.calls.Load(), "a window found exhausted is remembered")

		bundle.clock.Set(windowBase.Add(15 * time.Minute))
		require.True(t, peek(t, l, ActionRegister, clientIP, "").Allowed)
	})

	t.Run("NotInMetrics", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t, nil)

		peek(t, l, ActionRegister, clientIP, "alice@example.com")
		for _, outcome := range []string{"allowed", "refused"} {
			require.Zero(t, bundle.metrics.count(t, "register", "ip", outcome))
			require.Zero(t, bundle.metrics.count(t, "register", "email", outcome))
		}
	})

	t.Run("ErrorsAndUnknownAction", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t, nil)

		_, err := l.Peek(ctx, "login", Subject{IP: clientIP})
		require.ErrorContains(t, err, `no rate-limit rule for action "login"`)

		bundle.consumer.err = errors.New("connection refused")
		d, err := l.Peek(ctx, ActionRegister, Subject{IP: clientIP})
		require.Nil(t, d)
		require.ErrorIs(t, err, bundle.consumer.err)
		require.ErrorContains(t, err, "error reading rate limits of register")
	})
}

// loginRules are a host app's login limits: per IP (password spraying), per email (the address
// tried) and per key (the account), the login pattern's.
func loginRules() Rules {
	return DefaultRules().
		With(Rule{Action: "login", Scope: ScopeIP, Limit: 10, Window: 15 * time.Minute}).
		With(Rule{Action: "login", Scope: ScopeKey, Limit: 3, Window: time.Hour}).
		With(Rule{Action: "login", Scope: ScopeEmail, Limit: 5, Window: 30 * time.Minute})
}

func TestLimiter_CustomAction(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		clock    *stubClock
		consumer *memConsumer
	}

	setup := func(t *testing.T) (*Limiter, *testBundle) {
		t.Helper()

		bundle := &testBundle{clock: &stubClock{now: windowBase}, consumer: newMemConsumer()}
		return mustLimiter(t, bundle.consumer, loginRules(), &LimiterConfig{NowFunc: bundle.clock.Now}), bundle
	}

	ctx := context.Background()

	allow := func(t *testing.T, l *Limiter, subject Subject) *Decision {
		t.Helper()
		d, err := l.Allow(ctx, "login", subject)
		require.NoError(t, err)
		return d
	}

	t.Run("OrderIPEmailKey", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t)
		require.Equal(t, []Scope{ScopeIP, ScopeEmail, ScopeKey}, l.Scopes("login"), "checked in scope order, whatever the rules' order")

		subject := Subject{IP: clientIP, Email: "alice@example.com", Key: "account-42"}
		d := allow(t, l, subject)
		require.True(t, d.Allowed)
		keys := newKeyer(testSecret)
		want := []keyHash{
			keys.key("login", ScopeIP, "198.51.100.7"),
			keys.key("login", ScopeEmail, "alice@example.com"),
			keys.key("login", ScopeKey, "account-42"),
		}
		require.Len(t, bundle.consumer.params, 3)
		for i, p := range bundle.consumer.params {
			require.Equal(t, want[i][:], p.KeyHash, "check %d", i)
		}
		require.Equal(t, ScopeKey, d.Rule.Scope, "the tightest rule answers: 2 left of 3")
		require.Equal(t, int64(2), d.Remaining)
		for _, scope := range []Scope{ScopeIP, ScopeEmail, ScopeKey} {
			_, ok := d.Of(scope)
			require.True(t, ok, scope)
		}
	})

	t.Run("KeyRefusalSpendsEarlierRulesOnly", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t)

		// The key's 3 from three IPs and addresses; the 4th, from a fourth, is refused by the key
		// rule after spending its IP and email allowance.
		for i := range 3 {
			require.True(t, allow(t, l, Subject{IP: netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), Email: fmt.Sprintf("a%d@example.com", i), Key: "account-42"}).Allowed)
		}
		d := allow(t, l, Subject{IP: clientIP, Email: "bob@example.com", Key: "account-42"})
		require.False(t, d.Allowed)
		require.Equal(t, ScopeKey, d.Rule.Scope)
		require.Equal(t, time.Hour, d.ResetAfter)
		ip, ok := d.Of(ScopeIP)
		require.True(t, ok)
		require.Equal(t, int64(9), ip.Remaining, "the IP rule spent one")

		// An IP refusal spends nothing of the email or key rules.
		for range 9 {
			allow(t, l, Subject{IP: clientIP})
		}
		calls := bundle.consumer.calls.Load()
		d = allow(t, l, Subject{IP: clientIP, Email: "carol@example.com", Key: "account-7"})
		require.False(t, d.Allowed)
		require.Equal(t, ScopeIP, d.Rule.Scope)
		require.Equal(t, calls+1, bundle.consumer.calls.Load(), "email and key rules not checked after an IP refusal")
		_, ok = d.Of(ScopeKey)
		require.False(t, ok)
		require.True(t, allow(t, l, Subject{IP: clientIP2, Key: "account-7"}).Allowed)
		d, err := l.Peek(ctx, "login", Subject{IP: clientIP2, Key: "account-7"})
		require.NoError(t, err)
		require.Equal(t, int64(2), d.Remaining, "account-7 spent once, from clientIP2 only")
	})

	t.Run("EmptyValuesSkipRules", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t)

		d := allow(t, l, Subject{IP: clientIP})
		require.True(t, d.Allowed)
		require.Equal(t, ScopeIP, d.Rule.Scope)
		require.Equal(t, int64(1), bundle.consumer.calls.Load())
		_, ok := d.Of(ScopeKey)
		require.False(t, ok)
	})

	t.Run("RefusalsNotCached", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t)

		subject := Subject{IP: clientIP, Key: "account-42"}
		for range 3 {
			require.True(t, allow(t, l, subject).Allowed)
		}
		calls := bundle.consumer.calls.Load()
		for range 5 {
			require.False(t, allow(t, l, subject).Allowed)
			d, err := l.Peek(ctx, "login", subject)
			require.NoError(t, err)
			require.False(t, d.Allowed)
		}
		// Each refusal went to the store (the IP and key checks in one call per Allow, and per
		// Peek): a clear in another process must be seen at once.
		require.Equal(t, calls+5*(1+1), bundle.consumer.calls.Load())
	})
}

func TestLimiter_Clear(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		clock    *stubClock
		consumer *memConsumer
	}

	setup := func(t *testing.T) (*Limiter, *testBundle) {
		t.Helper()

		bundle := &testBundle{clock: &stubClock{now: windowBase.Add(time.Minute)}, consumer: newMemConsumer()}
		return mustLimiter(t, bundle.consumer, loginRules(), &LimiterConfig{NowFunc: bundle.clock.Now}), bundle
	}

	ctx := context.Background()

	t.Run("ClearsNamedScopesOnly", func(t *testing.T) {
		t.Parallel()

		l, _ := setup(t)

		subject := Subject{IP: clientIP, Key: "account-42"}
		for range 3 {
			_, err := l.Allow(ctx, "login", subject)
			require.NoError(t, err)
		}
		d, err := l.Peek(ctx, "login", subject)
		require.NoError(t, err)
		require.False(t, d.Allowed)
		require.Equal(t, ScopeKey, d.Rule.Scope)

		// A login that succeeded clears the account's failures, not the IP's.
		require.NoError(t, l.Clear(ctx, "login", Subject{Key: "account-42"}))
		d, err = l.Peek(ctx, "login", subject)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		key, _ := d.Of(ScopeKey)
		require.Equal(t, int64(3), key.Remaining, "the key's window starts afresh")
		ip, _ := d.Of(ScopeIP)
		require.Equal(t, int64(7), ip.Remaining, "the IP's failures still count")

		// Naming the IP clears it too.
		require.NoError(t, l.Clear(ctx, "login", Subject{IP: clientIP}))
		d, err = l.Peek(ctx, "login", subject)
		require.NoError(t, err)
		ip, _ = d.Of(ScopeIP)
		require.Equal(t, int64(10), ip.Remaining)
	})

	t.Run("OtherSubjectsKeepTheirCounts", func(t *testing.T) {
		t.Parallel()

		l, _ := setup(t)

		for _, key := range []string{"account-1", "account-2"} {
			_, err := l.Allow(ctx, "login", Subject{IP: clientIP, Key: key})
			require.NoError(t, err)
		}
		require.NoError(t, l.Clear(ctx, "login", Subject{Key: "account-1"}))
		d, err := l.Peek(ctx, "login", Subject{IP: clientIP2, Key: "account-2"})
		require.NoError(t, err)
		key, _ := d.Of(ScopeKey)
		require.Equal(t, int64(2), key.Remaining)
	})

	t.Run("DropsCachedRefusals", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t)

		for range 5 {
			_, err := l.Allow(ctx, ActionRegister, Subject{IP: clientIP})
			require.NoError(t, err)
		}
		d, err := l.Allow(ctx, ActionRegister, Subject{IP: clientIP})
		require.NoError(t, err)
		require.False(t, d.Allowed)
		calls := bundle.consumer.calls.Load()
		d, err = l.Allow(ctx, ActionRegister, Subject{IP: clientIP})
		require.NoError(t, err)
		require.False(t, d.Allowed)
		require.Equal(t, calls, bundle.consumer.calls.Load(), "refused from the deny cache")

		require.NoError(t, l.Clear(ctx, ActionRegister, Subject{IP: clientIP}))
		d, err = l.Allow(ctx, ActionRegister, Subject{IP: clientIP})
		require.NoError(t, err)
		require.True(t, d.Allowed, "the cleared window is not answered from memory")
		require.Equal(t, int64(4), d.Remaining)

		// Refused again once spent again: the revived entry works as a new one.
		for range 4 {
			_, err := l.Allow(ctx, ActionRegister, Subject{IP: clientIP})
			require.NoError(t, err)
		}
		d, err = l.Allow(ctx, ActionRegister, Subject{IP: clientIP})
		require.NoError(t, err)
		require.False(t, d.Allowed)
	})

	t.Run("NothingNamedClearsNothing", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t)

		require.NoError(t, l.Clear(ctx, "login", Subject{}))
		require.Zero(t, bundle.consumer.calls.Load())
	})

	t.Run("Errors", func(t *testing.T) {
		t.Parallel()

		l, bundle := setup(t)

		require.ErrorContains(t, l.Clear(ctx, "logout", Subject{Key: "x"}), `no rate-limit rule for action "logout"`)
		bundle.consumer.err = errors.New("connection refused")
		err := l.Clear(ctx, "login", Subject{Key: "x"})
		require.ErrorIs(t, err, bundle.consumer.err)
		require.ErrorContains(t, err, "error clearing rate limits of login")
	})
}

func TestLimiter_Rules(t *testing.T) {
	t.Parallel()

	rules := DefaultRules().With(Rule{Action: ActionRegister, Scope: ScopeIP, Limit: 9, Window: time.Hour})
	require.Equal(t, rules.All(), mustLimiter(t, newMemConsumer(), rules, nil).Rules().All())
}

func TestNewLimiter(t *testing.T) {
	t.Parallel()

	consumer := newMemConsumer()
	_, err := NewLimiter(nil, testSecret, DefaultRules(), nil)
	require.EqualError(t, err, "abuse.NewLimiter: nil store")

	for _, secret := range [][]byte{nil, {}, []byte("abc"), testSecret[:tokens.MinSecretLen-1]} {
		_, err := NewLimiter(consumer, secret, DefaultRules(), nil)
		require.ErrorIs(t, err, tokens.ErrWeakSecret, "a %d-byte secret", len(secret))
		require.ErrorContains(t, err, fmt.Sprintf("%d bytes, it must be at least 32", len(secret)))
	}

	_, err = NewLimiter(consumer, testSecret, DefaultRules().With(Rule{Action: ActionRegister, Scope: ScopeIP, Limit: 0, Window: time.Minute}), nil)
	require.ErrorContains(t, err, "abuse.NewLimiter: ")

	l, err := NewLimiter(consumer, testSecret[:tokens.MinSecretLen], DefaultRules(), nil)
	require.NoError(t, err)
	require.NotNil(t, l)
}

func TestDenyCache(t *testing.T) {
	t.Parallel()

	start := windowBase
	end := start.Add(time.Minute)
	key := func(i int) keyHash { return keyHash{byte(i), byte(i >> 8)} }

	t.Run("Bounded", func(t *testing.T) {
		t.Parallel()

		c := newDenyCache(3)
		for i := range 10 {
			c.add(key(i), start, end)
			require.LessOrEqual(t, c.len(), 3)
		}
		// The three newest stay; the oldest went first.
		for i := range 7 {
			require.False(t, c.contains(key(i), start, start), "key %d evicted", i)
		}
		for i := 7; i < 10; i++ {
			require.True(t, c.contains(key(i), start, start), "key %d kept", i)
		}
	})

	t.Run("ReAddDoesNotGrow", func(t *testing.T) {
		t.Parallel()

		c := newDenyCache(2)
		c.add(key(1), start, end)
		c.add(key(1), start, end)
		c.add(key(2), start, end)
		require.Equal(t, 2, c.len())
		require.True(t, c.contains(key(1), start, start))
		require.True(t, c.contains(key(2), start, start))
	})

	t.Run("Remove", func(t *testing.T) {
		t.Parallel()

		c := newDenyCache(2)
		c.add(key(1), start, end)
		c.add(key(2), start, end)
		c.remove(key(1), start)
		c.remove(key(3), start) // not there: nothing happens
		require.False(t, c.contains(key(1), start, start))
		require.True(t, c.contains(key(2), start, start))
		require.Equal(t, 2, c.len(), "kept, as expired, so the ring and the map hold the same keys")

		c.add(key(1), start, end)
		require.True(t, c.contains(key(1), start, start), "revived in place")
		c.add(key(3), start, end) // evicts the oldest insertion, key 1
		require.False(t, c.contains(key(1), start, start))
		require.True(t, c.contains(key(2), start, start))
		require.True(t, c.contains(key(3), start, start))
		require.Equal(t, 2, c.len())
	})

	t.Run("WindowScoped", func(t *testing.T) {
		t.Parallel()

		c := newDenyCache(10)
		c.add(key(1), start, end)
		require.True(t, c.contains(key(1), start, end.Add(-time.Nanosecond)))
		require.False(t, c.contains(key(1), start, end), "expired at window end")
		require.False(t, c.contains(key(1), end, end), "other window")
		require.False(t, c.contains(key(2), start, start), "other key")
	})
}
