package abuse

import (
	"bytes"
	"context"
	"encoding/base64"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/dbtest"
)

// counterRow is one row of rate_limit_counters, times in Unix microseconds, plus every column
// rendered as text for the no-raw-values check.
type counterRow struct {
	KeyHash     []byte
	WindowStart int64
	WindowEnd   int64
	Count       int64
	LimitCount  int64
	Text        string
}

// counterRows reads rate_limit_counters through the engine's own handle.
func counterRows(t *testing.T, store *dbtest.Store) []counterRow {
	t.Helper()

	var rows []counterRow
	switch {
	case store.Postgres != nil:
		pgRows, err := store.Postgres.Pool().Query(t.Context(), `
			SELECT key_hash,
			       (extract(epoch FROM window_start) * 1000000)::bigint,
			       (extract(epoch FROM window_end) * 1000000)::bigint,
			       count,
			       limit_count,
			       concat_ws('|', encode(key_hash, 'escape'), window_start, window_end, count, limit_count)
			FROM rate_limit_counters`)
		require.NoError(t, err)
		defer pgRows.Close()
		for pgRows.Next() {
			var r counterRow
			require.NoError(t, pgRows.Scan(&r.KeyHash, &r.WindowStart, &r.WindowEnd, &r.Count, &r.LimitCount, &r.Text))
			rows = append(rows, r)
		}
		require.NoError(t, pgRows.Err())
	default:
		sqlRows, err := store.SQLite.DB().QueryContext(t.Context(), `
			SELECT key_hash, window_start, window_end, count, limit_count,
			       CAST(key_hash AS TEXT) || '|' || window_start || '|' || window_end || '|' || count || '|' || limit_count
			FROM rate_limit_counters`)
		require.NoError(t, err)
		defer sqlRows.Close()
		for sqlRows.Next() {
			var r counterRow
			require.NoError(t, sqlRows.Scan(&r.KeyHash, &r.WindowStart, &r.WindowEnd, &r.Count, &r.LimitCount, &r.Text))
			rows = append(rows, r)
		}
		require.NoError(t, sqlRows.Err())
	}
	return rows
}

func findCounter(rows []counterRow, key keyHash) *counterRow {
	for i := range rows {
		if bytes.Equal(rows[i].KeyHash, key[:]) {
			return &rows[i]
		}
	}
	return nil
}

func TestLimiter_AllowStore(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		type testBundle struct {
			clock *stubClock
			store *dbtest.Store
			keys  *keyer
		}

		setup := func(t *testing.T, config *LimiterConfig) (*Limiter, *testBundle) {
			t.Helper()

			bundle := &testBundle{
				clock: &stubClock{now: windowBase.Add(90 * time.Second)},
				store: newStore(t),
				keys:  newKeyer(testSecret),
			}
			if config == nil {
				config = &LimiterConfig{}
			}
			config.NowFunc = bundle.clock.Now
			return mustLimiter(t, bundle.store, DefaultRules(), config), bundle
		}

		t.Run("ConcurrentOneIP", func(t *testing.T) {
			t.Parallel()

			for _, cacheSize := range []int{-1, 0} {
				l, bundle := setup(t, &LimiterConfig{DenyCacheSize: cacheSize})

				var (
					allowed, refused int
					mu               sync.Mutex
					wg               sync.WaitGroup
				)
				for range 50 {
					wg.Go(func() {
						d, err := l.Allow(context.Background(), ActionRegister, Subject{IP: clientIP})
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						defer mu.Unlock()
						if d.Allowed {
							allowed++
						} else {
							refused++
						}
					})
				}
				wg.Wait()
				require.Equal(t, 5, allowed, "deny cache size %d", cacheSize)
				require.Equal(t, 45, refused)

				rows := counterRows(t, bundle.store)
				require.Len(t, rows, 1)
				row := rows[0]
				require.Equal(t, int64(5), row.Count, "a refused request is never counted")
				require.Equal(t, int64(5), row.LimitCount)
				require.Equal(t, windowBase.UnixMicro(), row.WindowStart)
				require.Equal(t, windowBase.Add(15*time.Minute).UnixMicro(), row.WindowEnd)
			}
		})

		t.Run("ConcurrentOneKeyCustomAction", func(t *testing.T) {
			t.Parallel()

			// 50 concurrent spends of one account's key, each from another IP, limit 3.
			store := newStore(t)
			rules := Rules{}.
				With(Rule{Action: "login", Scope: ScopeIP, Limit: 100, Window: 15 * time.Minute}).
				With(Rule{Action: "login", Scope: ScopeKey, Limit: 3, Window: 15 * time.Minute})
			clock := &stubClock{now: windowBase.Add(90 * time.Second)}
			l := mustLimiter(t, store, rules, &LimiterConfig{NowFunc: clock.Now})

			var (
				allowed, refused int
				mu               sync.Mutex
				wg               sync.WaitGroup
			)
			start := make(chan struct{})
			for i := range 50 {
				wg.Go(func() {
					<-start
					d, err := l.Allow(context.Background(), "login", Subject{IP: netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), Key: "account-42"})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					defer mu.Unlock()
					if d.Allowed {
						allowed++
					} else {
						refused++
						require.Equal(t, ScopeKey, d.Rule.Scope)
					}
				})
			}
			close(start)
			wg.Wait()
			require.Equal(t, 3, allowed)
			require.Equal(t, 47, refused)

			keys := newKeyer(testSecret)
			row := findCounter(counterRows(t, store), keys.key("login", ScopeKey, "account-42"))
			require.NotNil(t, row)
			require.Equal(t, int64(3), row.Count, "a refused request is never counted")
			require.Equal(t, int64(3), row.LimitCount)
			require.Len(t, counterRows(t, store), 51, "50 IP counters and one key counter")
		})

		t.Run("ClearDeletesTheCurrentWindow", func(t *testing.T) {
			t.Parallel()

			store := newStore(t)
			clock := &stubClock{now: windowBase.Add(90 * time.Second)}
			l := mustLimiter(t, store, loginRules(), &LimiterConfig{NowFunc: clock.Now})
			// Another process on the same database: its view follows the clear at once.
			other := mustLimiter(t, store, loginRules(), &LimiterConfig{NowFunc: clock.Now})
			ctx := context.Background()
			subject := Subject{IP: clientIP, Key: "account-42"}

			for range 4 {
				_, err := l.Allow(ctx, "login", subject)
				require.NoError(t, err)
			}
			d, err := other.Peek(ctx, "login", subject)
			require.NoError(t, err)
			require.False(t, d.Allowed)

			// The previous window's counter is left for prune; only the current one goes.
			clock.Set(windowBase.Add(-time.Minute))
			_, err = l.Allow(ctx, "login", Subject{IP: clientIP2, Key: "account-42"})
			require.NoError(t, err)
			clock.Set(windowBase.Add(90 * time.Second))

			require.NoError(t, l.Clear(ctx, "login", Subject{Key: "account-42"}))
			d, err = other.Peek(ctx, "login", subject)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			key, _ := d.Of(ScopeKey)
			require.Equal(t, int64(3), key.Remaining)

			keys := newKeyer(testSecret)
			rows := counterRows(t, store)
			require.Len(t, rows, 3, "the IPs' counters, and the key's of the previous window")
			require.Equal(t, int64(4), findCounter(rows, keys.key("login", ScopeIP, "198.51.100.7")).Count)
			keyRow := findCounter(rows, keys.key("login", ScopeKey, "account-42"))
			require.NotNil(t, keyRow)
			require.Equal(t, windowBase.Add(-time.Hour).UnixMicro(), keyRow.WindowStart)

			require.NoError(t, l.Clear(ctx, "login", Subject{Key: "account-42"}), "clearing twice is fine")
		})

		t.Run("EmailRefusalSpendsIPAllowance", func(t *testing.T) {
			t.Parallel()

			l, bundle := setup(t, nil)
			ctx := context.Background()

			for i := range 3 {
				d, err := l.Allow(ctx, ActionRegister, Subject{IP: netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), Email: "alice@example.com"})
				require.NoError(t, err)
				require.True(t, d.Allowed)
			}
			d, err := l.Allow(ctx, ActionRegister, Subject{IP: clientIP, Email: "alice@example.com"})
			require.NoError(t, err)
			require.False(t, d.Allowed)
			require.Equal(t, ScopeEmail, d.Rule.Scope)
			require.Equal(t, time.Hour-90*time.Second, d.ResetAfter)

			rows := counterRows(t, bundle.store)
			ipRow := findCounter(rows, bundle.keys.key(ActionRegister, ScopeIP, "198.51.100.7"))
			require.NotNil(t, ipRow)
			require.Equal(t, int64(1), ipRow.Count, "the refused request spent its IP allowance")
			emailRow := findCounter(rows, bundle.keys.key(ActionRegister, ScopeEmail, "alice@example.com"))
			require.NotNil(t, emailRow)
			require.Equal(t, int64(3), emailRow.Count, "the email rule did not count its refusal")
			require.Equal(t, windowBase.Add(time.Hour).UnixMicro(), emailRow.WindowEnd)

			for _, row := range rows {
				require.LessOrEqual(t, row.Count, row.LimitCount)
			}
		})

		t.Run("AllowUserReadsTheUserWhenAdmitted", func(t *testing.T) {
			t.Parallel()

			l, bundle := setup(t, nil)
			ctx := context.Background()
			user, err := bundle.store.UserInsert(ctx, &db.UserInsertParams{Email: "ada@example.com", PasswordHash: "hash", Now: windowBase})
			require.NoError(t, err)

			// forgot-password: 3 per email per hour.
			for i := range 3 {
				d, found, err := l.AllowUser(ctx, ActionForgotPassword, Subject{IP: netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), Email: "ada@example.com"})
				require.NoError(t, err)
				require.True(t, d.Allowed)
				require.NotNil(t, found)
				require.Equal(t, user.ID, found.ID)
			}
			d, found, err := l.AllowUser(ctx, ActionForgotPassword, Subject{IP: clientIP, Email: "ada@example.com"})
			require.NoError(t, err)
			require.False(t, d.Allowed)
			require.Nil(t, found, "the user read although the email's rule refused")

			d, found, err = l.AllowUser(ctx, ActionForgotPassword, Subject{IP: clientIP, Email: "nobody@example.com"})
			require.NoError(t, err)
			require.True(t, d.Allowed)
			require.Nil(t, found)

			// Once the email's refusal is cached, the IP is still spent, and no user read.
			d, found, err = l.AllowUser(ctx, ActionForgotPassword, Subject{IP: clientIP, Email: "ada@example.com"})
			require.NoError(t, err)
			require.False(t, d.Allowed)
			require.Nil(t, found)
			ipRow := findCounter(counterRows(t, bundle.store), bundle.keys.key(ActionForgotPassword, ScopeIP, "198.51.100.7"))
			require.Equal(t, int64(3), ipRow.Count)
		})

		t.Run("DenyCacheAnswersWithoutStore", func(t *testing.T) {
			t.Parallel()

			store := newStore(t)
			counting := &countingConsumer{Consumer: store}
			clock := &stubClock{now: windowBase}
			l := mustLimiter(t, counting, DefaultRules(), &LimiterConfig{NowFunc: clock.Now})
			ctx := context.Background()

			for i := range 7 {
				d, err := l.Allow(ctx, ActionResendVerification, Subject{IP: clientIP})
				require.NoError(t, err)
				require.Equal(t, i < 6, d.Allowed)
			}
			require.Equal(t, int64(7), counting.calls.Load())

			for range 10 {
				d, err := l.Allow(ctx, ActionResendVerification, Subject{IP: clientIP})
				require.NoError(t, err)
				require.False(t, d.Allowed)
				require.Equal(t, 15*time.Minute, d.ResetAfter)
			}
			require.Equal(t, int64(7), counting.calls.Load(), "repeat refusals answered from the cache")

			// Next window: back to the database, and allowed.
			clock.Set(windowBase.Add(15 * time.Minute))
			d, err := l.Allow(ctx, ActionResendVerification, Subject{IP: clientIP})
			require.NoError(t, err)
			require.True(t, d.Allowed)
			require.Equal(t, int64(8), counting.calls.Load())
			require.Len(t, counterRows(t, store), 2, "one row per window")
		})

		t.Run("PeekSeesOtherProcesses", func(t *testing.T) {
			t.Parallel()

			// Two limiters on one store are two API processes: one spends, the other peeks.
			l, bundle := setup(t, nil)
			other := mustLimiter(t, bundle.store, DefaultRules(), &LimiterConfig{NowFunc: bundle.clock.Now})
			ctx := context.Background()

			for i := range 5 {
				d, err := other.Peek(ctx, ActionRegister, Subject{IP: clientIP})
				require.NoError(t, err)
				require.True(t, d.Allowed)
				require.Equal(t, int64(5-i), d.Remaining)
				_, err = l.Allow(ctx, ActionRegister, Subject{IP: clientIP})
				require.NoError(t, err)
			}
			d, err := other.Peek(ctx, ActionRegister, Subject{IP: clientIP})
			require.NoError(t, err)
			require.False(t, d.Allowed)
			require.Equal(t, int64(900-90), d.RetryAfterSeconds())

			rows := counterRows(t, bundle.store)
			require.Len(t, rows, 1, "peeks created no counter")
			require.Equal(t, int64(5), rows[0].Count)
		})

		t.Run("CountersHoldNoRawValues", func(t *testing.T) {
			t.Parallel()

			l, bundle := setup(t, nil)
			ctx := context.Background()

			ipv6 := netip.MustParseAddr("2001:db8:1:2::beef")
			_, err := l.Allow(ctx, ActionForgotPassword, Subject{IP: clientIP, Email: "alice@example.com"})
			require.NoError(t, err)
			_, err = l.Allow(ctx, ActionRegister, Subject{IP: ipv6, Email: "bob.smith@example.org"})
			require.NoError(t, err)

			custom := mustLimiter(t, bundle.store, loginRules(), &LimiterConfig{NowFunc: bundle.clock.Now})
			_, err = custom.Allow(ctx, "login", Subject{IP: clientIP, Email: "carol@example.net", Key: "account-secret-42"})
			require.NoError(t, err)

			rows := counterRows(t, bundle.store)
			require.Len(t, rows, 7)
			for _, row := range rows {
				require.Len(t, row.KeyHash, 32)
				for _, raw := range []string{"198.51.100.7", "alice", "example", "2001:db8", "bob.smith", "carol", "account-secret"} {
					require.NotContains(t, strings.ToLower(row.Text), raw)
					require.NotContains(t, string(row.KeyHash), raw)
				}
			}
			for _, key := range []keyHash{
				bundle.keys.key(ActionForgotPassword, ScopeIP, "198.51.100.7"),
				bundle.keys.key(ActionForgotPassword, ScopeEmail, "alice@example.com"),
				bundle.keys.key(ActionRegister, ScopeIP, "2001:db8:1:2::/64"),
				bundle.keys.key(ActionRegister, ScopeEmail, "bob.smith@example.org"),
				bundle.keys.key("login", ScopeKey, "account-secret-42"),
			} {
				require.NotNil(t, findCounter(rows, key), "rows are keyed by HMAC")
			}
		})
	})
}

func TestLimiter_RefundStore(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		t.Run("GivesOneBackToTheCurrentWindowOnly", func(t *testing.T) {
			t.Parallel()

			store := newStore(t)
			counting := &countingConsumer{Consumer: store}
			clock := &stubClock{now: windowBase.Add(-time.Minute)}
			l := mustLimiter(t, counting, loginRules(), &LimiterConfig{NowFunc: clock.Now})
			ctx := context.Background()
			keys := newKeyer(testSecret)
			ip := keys.key("login", ScopeIP, "198.51.100.7")

			// Three in the window before, two in this one.
			for range 3 {
				_, err := l.Allow(ctx, "login", Subject{IP: clientIP, Key: "account-42"})
				require.NoError(t, err)
			}
			clock.Set(windowBase.Add(90 * time.Second))
			for range 2 {
				_, err := l.Allow(ctx, "login", Subject{IP: clientIP, Key: "account-42"})
				require.NoError(t, err)
			}

			calls := counting.calls.Load()
			require.NoError(t, l.Refund(ctx, "login", Subject{IP: clientIP}))
			require.Equal(t, calls+1, counting.calls.Load(), "one round trip")
			rows := counterRows(t, store)
			for _, row := range rows {
				if !bytes.Equal(row.KeyHash, ip[:]) {
					continue
				}
				switch row.WindowStart {
				case windowBase.UnixMicro():
					require.Equal(t, int64(1), row.Count, "the current window got one back")
				default:
					require.Equal(t, int64(3), row.Count, "an earlier window is untouched")
				}
			}
			key, _ := mustPeek(t, l, Subject{IP: clientIP, Key: "account-42"}).Of(ScopeKey)
			require.Equal(t, int64(1), key.Remaining, "the key was not named, so not refunded")

			// Never below zero.
			for range 3 {
				require.NoError(t, l.Refund(ctx, "login", Subject{IP: clientIP, Key: "account-42"}))
			}
			d := mustPeek(t, l, Subject{IP: clientIP, Key: "account-42"})
			ipDecision, _ := d.Of(ScopeIP)
			require.Equal(t, int64(10), ipDecision.Remaining)
			key, _ = d.Of(ScopeKey)
			require.Equal(t, int64(3), key.Remaining)
			for _, row := range counterRows(t, store) {
				require.GreaterOrEqual(t, row.Count, int64(0))
			}

			// Nothing named refunds nothing, and costs nothing.
			calls = counting.calls.Load()
			require.NoError(t, l.Refund(ctx, "login", Subject{}))
			require.Equal(t, calls, counting.calls.Load())
			require.ErrorContains(t, l.Refund(ctx, "logout", Subject{Key: "x"}), `no rate-limit rule for action "logout"`)
		})

		t.Run("DropsThisProcessCachedRefusal", func(t *testing.T) {
			t.Parallel()

			store := newStore(t)
			clock := &stubClock{now: windowBase}
			l := mustLimiter(t, store, DefaultRules(), &LimiterConfig{NowFunc: clock.Now})
			ctx := context.Background()
			for range 5 {
				_, err := l.Allow(ctx, ActionRegister, Subject{IP: clientIP})
				require.NoError(t, err)
			}
			d, err := l.Allow(ctx, ActionRegister, Subject{IP: clientIP})
			require.NoError(t, err)
			require.False(t, d.Allowed, "refused, and cached")

			require.NoError(t, l.Refund(ctx, ActionRegister, Subject{IP: clientIP}))
			d, err = l.Allow(ctx, ActionRegister, Subject{IP: clientIP})
			require.NoError(t, err)
			require.True(t, d.Allowed, "the refunded request is not refused from memory")
			require.Zero(t, d.Remaining)
		})
	})
}

// mustPeek peeks at login for subject.
func mustPeek(t *testing.T, l *Limiter, subject Subject) *Decision {
	t.Helper()
	d, err := l.Peek(context.Background(), "login", subject)
	require.NoError(t, err)
	return d
}

func TestLimiter_DevicesStore(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		const ttl = 24 * time.Hour
		type testBundle struct {
			clock   *stubClock
			store   *dbtest.Store
			metrics *testMetrics
		}
		setup := func(t *testing.T) (*Limiter, *testBundle) {
			t.Helper()
			bundle := &testBundle{clock: &stubClock{now: windowBase.Add(90 * time.Second)}, store: newStore(t), metrics: newTestMetrics()}
			return mustLimiter(t, bundle.store, loginRules(), &LimiterConfig{NowFunc: bundle.clock.Now, DeviceTokenTTL: ttl, Metrics: bundle.metrics}), bundle
		}
		ctx := context.Background()
		owner := Subject{IP: clientIP, Key: "account-42"}
		// lock spends the account's 3 from other IPs.
		lock := func(t *testing.T, l *Limiter) {
			t.Helper()
			for i := range 3 {
				d, err := l.Allow(ctx, "login", Subject{IP: netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), Key: "account-42"})
				require.NoError(t, err)
				require.True(t, d.Allowed)
			}
		}

		t.Run("ATrustedDeviceCountsInItsOwnBucket", func(t *testing.T) {
			t.Parallel()

			l, bundle := setup(t)
			device, err := l.IssueDevice(ctx, "login", "account-42")
			require.NoError(t, err)
			lock(t, l)

			d, err := l.Allow(ctx, "login", owner)
			require.NoError(t, err)
			require.False(t, d.Allowed, "an untrusted client is refused")

			withDevice := Subject{IP: clientIP, Key: "account-42", Device: device}
			for want := int64(2); want >= 0; want-- {
				d := mustPeek(t, l, withDevice)
				require.True(t, d.Allowed)
				d, err = l.Allow(ctx, "login", withDevice)
				require.NoError(t, err)
				require.True(t, d.Allowed, "the owner's device logs in")
				key, _ := d.Of(ScopeKey)
				require.Equal(t, want, key.Remaining)
			}
			d, err = l.Allow(ctx, "login", withDevice)
			require.NoError(t, err)
			require.False(t, d.Allowed, "the device locks itself")
			require.Equal(t, ScopeKey, d.Rule.Scope)

			// The device's own clear: the account's bucket stays locked for unknown clients.
			require.NoError(t, l.Clear(ctx, "login", Subject{Key: "account-42", Device: device}))
			require.True(t, mustPeek(t, l, withDevice).Allowed)
			require.False(t, mustPeek(t, l, owner).Allowed)

			// The IP rule applies to devices too: 1 + 4 spent of its 10 by this IP, 5 more (the
			// device cleared between) reach its limit.
			for i := range 5 {
				if i == 3 {
					require.NoError(t, l.Clear(ctx, "login", Subject{Key: "account-42", Device: device}))
				}
				d, err := l.Allow(ctx, "login", withDevice)
				require.NoError(t, err)
				require.True(t, d.Allowed)
			}
			d, err = l.Allow(ctx, "login", withDevice)
			require.NoError(t, err)
			require.False(t, d.Allowed)
			require.Equal(t, ScopeIP, d.Rule.Scope)

			keys := newKeyer(testSecret)
			rows := counterRows(t, bundle.store)
			require.Equal(t, int64(3), findCounter(rows, keys.key("login", ScopeKey, "account-42")).Count)
			require.Len(t, rows, 3+1+1+1, "three attackers' IPs, the owner's IP, the account, the device")
			requireDeviceOutcomes(t, bundle.metrics, map[deviceOutcome]float64{deviceTrusted: 3*2 + 1 + 1 + 1 + 5 + 1 + 1})
		})

		t.Run("BadTokensAreNoToken", func(t *testing.T) {
			t.Parallel()

			l, bundle := setup(t)
			good, err := l.IssueDevice(ctx, "login", "account-42")
			require.NoError(t, err)
			otherAccount, err := l.IssueDevice(ctx, "login", "account-7")
			require.NoError(t, err)
			otherAction := mustLimiter(t, bundle.store, loginRules().With(Rule{Action: "signin", Scope: ScopeKey, Limit: 3, Window: time.Hour}), &LimiterConfig{NowFunc: bundle.clock.Now})
			signin, err := otherAction.IssueDevice(ctx, "signin", "account-42")
			require.NoError(t, err)
			otherSecret, err := NewLimiter(bundle.store, []byte("another secret, 32 bytes or more!"), loginRules(), &LimiterConfig{NowFunc: bundle.clock.Now})
			require.NoError(t, err)
			foreign, err := otherSecret.IssueDevice(ctx, "login", "account-42")
			require.NoError(t, err)
			lock(t, l)

			bad := map[string]string{
				"Malformed":    "not a token",
				"Forged":       alterMAC(t, good),
				"OtherAccount": otherAccount,
				"OtherAction":  signin,
				"OtherSecret":  foreign,
			}
			// Each answers as no token: a peek in the same state, a spend from a fresh IP beside a
			// spend without a token from another fresh IP.
			none := mustPeek(t, l, owner)
			require.False(t, none.Allowed)
			ip := byte(0)
			fresh := func() netip.Addr { ip++; return netip.AddrFrom4([4]byte{192, 0, 2, ip}) }
			requireAsNone := func(name, token string) {
				t.Helper()
				require.Equal(t, mustPeek(t, l, owner), mustPeek(t, l, Subject{IP: clientIP, Key: "account-42", Device: token}), name)
				want, err := l.Allow(ctx, "login", Subject{IP: fresh(), Key: "account-42"})
				require.NoError(t, err)
				got, err := l.Allow(ctx, "login", Subject{IP: fresh(), Key: "account-42", Device: token})
				require.NoError(t, err)
				require.Equal(t, want, got, name)
			}
			for name, token := range bad {
				requireAsNone(name, token)
			}

			// Revoked, in another process: at once.
			other := mustLimiter(t, bundle.store, loginRules(), &LimiterConfig{NowFunc: bundle.clock.Now})
			require.True(t, mustPeek(t, l, Subject{IP: clientIP, Key: "account-42", Device: good}).Allowed)
			require.NoError(t, other.RevokeDevices(ctx, "login", "account-42"))
			requireAsNone("Revoked", good)
			issuedAfter, err := l.IssueDevice(ctx, "login", "account-42")
			require.NoError(t, err)
			require.True(t, mustPeek(t, l, Subject{IP: clientIP, Key: "account-42", Device: issuedAfter}).Allowed, "a device issued after the revocation stands")

			// Expired: the clock passes the TTL. The next window starts afresh, so lock it again.
			bundle.clock.Set(bundle.clock.Now().Add(ttl))
			lock(t, l)
			requireAsNone("Expired", issuedAfter)

			// A bad token spends the account's bucket, as no token does.
			spender := Subject{IP: clientIP2, Key: "account-7", Device: bad["Forged"]}
			d, err := l.Allow(ctx, "login", spender)
			require.NoError(t, err)
			key, _ := d.Of(ScopeKey)
			require.Equal(t, int64(2), key.Remaining)
			key, _ = mustPeek(t, l, Subject{IP: clientIP2, Key: "account-7"}).Of(ScopeKey)
			require.Equal(t, int64(2), key.Remaining, "counted in the account's bucket")

			requireDeviceOutcomes(t, bundle.metrics, map[deviceOutcome]float64{
				deviceMalformed: 2, deviceForged: 2*4 + 1, deviceRevoked: 2, deviceTrusted: 2, deviceExpired: 2,
			})
		})

		t.Run("IssueAndRevokeNeedAKeyRule", func(t *testing.T) {
			t.Parallel()

			l, _ := setup(t)
			for _, action := range []Action{ActionRegister, "logout"} {
				_, err := l.IssueDevice(ctx, action, "account-42")
				require.ErrorContains(t, err, "has no key rule")
				require.ErrorContains(t, l.RevokeDevices(ctx, action, "account-42"), "has no key rule")
			}
			_, err := l.IssueDevice(ctx, "login", "")
			require.ErrorContains(t, err, "needs the key")
		})

		t.Run("RevocationsHoldNoRawKey", func(t *testing.T) {
			t.Parallel()

			l, bundle := setup(t)
			require.NoError(t, l.RevokeDevices(ctx, "login", "account-secret-42"))
			var text string
			if bundle.store.Postgres != nil {
				require.NoError(t, bundle.store.Postgres.Pool().QueryRow(ctx, `SELECT string_agg(encode(key_hash, 'escape'), '|') FROM rate_limit_device_revocations`).Scan(&text))
			} else {
				require.NoError(t, bundle.store.SQLite.DB().QueryRowContext(ctx, `SELECT group_concat(CAST(key_hash AS TEXT), '|') FROM rate_limit_device_revocations`).Scan(&text))
			}
			require.NotEmpty(t, text)
			require.NotContains(t, text, "account-secret")
		})
	})
}

// alterMAC returns token with a bit of its MAC flipped.
func alterMAC(t *testing.T, token string) string {
	t.Helper()
	raw, err := base64.RawURLEncoding.DecodeString(token)
	require.NoError(t, err)
	raw[len(raw)-1] ^= 1
	return base64.RawURLEncoding.EncodeToString(raw)
}

// requireDeviceOutcomes checks postguard_rate_limit_device_tokens_total of login: want's
// outcomes, 0 for the others.
func requireDeviceOutcomes(t *testing.T, metrics *testMetrics, want map[deviceOutcome]float64) {
	t.Helper()

	for _, outcome := range deviceOutcomes {
		require.InDelta(t, want[outcome], float64(metrics.count(t, "login", "device", string(outcome))), 0, "outcome %s", outcome)
	}
}
