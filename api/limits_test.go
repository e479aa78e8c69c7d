package api

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/internal/bursttest"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
)

// limitsToken is LIMITS_API_TOKEN in tests.
const limitsToken = "limits-token-of-the-tests-0123456789"

// loginRules are generousRules plus a host app's login action: 10 per IP per 15 minutes (a
// password spray), 3 per key (an account's failed logins).
func loginRules() *abuse.Rules {
	rules := generousRules().
		With(abuse.Rule{Action: "login", Scope: abuse.ScopeIP, Limit: 10, Window: 15 * time.Minute}).
		With(abuse.Rule{Action: "login", Scope: abuse.ScopeKey, Limit: 3, Window: 15 * time.Minute}).
		With(abuse.Rule{Action: "newsletter", Scope: abuse.ScopeEmail, Limit: 2, Window: 15 * time.Minute})
	return &rules
}

// limitsBundle is a router with the limits API on store, its clock stubbed at a window start.
func limitsBundle(t *testing.T, store riverstore.Store) (*testBundle, *stubNow) {
	t.Helper()
	clock := &stubNow{now: time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)}
	return setup(t, store, &setupOpts{
		rules:      loginRules(),
		limiterNow: clock.Now,
		configFunc: func(config *Config) { config.LimitsToken = limitsToken },
	}), clock
}

// stubNow is a settable clock.
type stubNow struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stubNow) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stubNow) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// limitsRequestOf is a request of method to path with body (a string, or a value marshalled to
// JSON) and the limits token.
func limitsRequestOf(t testing.TB, method, path string, body any) *http.Request {
	t.Helper()
	req := jsonRequest(t, path, body)
	req.Method = method
	req.Header.Set("Authorization", "Bearer "+limitsToken)
	return req
}

// decodeLimitsDecision checks rec is an admitted decision and returns it.
func decodeLimitsDecision(t testing.TB, rec *httptest.ResponseRecorder) limitsAnswer {
	t.Helper()
	require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body.String())
	var answer limitsAnswer
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &answer))
	require.True(t, answer.Allowed)
	require.Equal(t, fmt.Sprintf(`"%s";q=%d;w=900`, answer.Policy, answer.Limit), rec.Header().Get("RateLimit-Policy"))
	require.Equal(t, fmt.Sprintf(`"%s";r=%d;t=%d`, answer.Policy, answer.Remaining, answer.ResetAfterSeconds), rec.Header().Get("RateLimit"))
	require.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
	return answer
}

// counterTexts reads every rate_limit_counters row of store, each rendered as text (the key's
// bytes included).
func counterTexts(t *testing.T, store *dbtest.Store) []string {
	t.Helper()
	var texts []string
	if store.Postgres != nil {
		rows, err := store.Postgres.Pool().Query(t.Context(), `
			SELECT concat_ws('|', encode(key_hash, 'escape'), encode(key_hash, 'hex'), window_start, window_end, count, limit_count)
			FROM rate_limit_counters`)
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var text string
			require.NoError(t, rows.Scan(&text))
			texts = append(texts, text)
		}
		require.NoError(t, rows.Err())
		return texts
	}
	rows, err := store.SQLite.DB().QueryContext(t.Context(), `
		SELECT CAST(key_hash AS TEXT) || '|' || hex(key_hash) || '|' || window_start || '|' || window_end || '|' || count || '|' || limit_count
		FROM rate_limit_counters`)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var text string
		require.NoError(t, rows.Scan(&text))
		texts = append(texts, text)
	}
	require.NoError(t, rows.Err())
	return texts
}

func TestServer_Limits(t *testing.T) {
	t.Parallel()

	spend := func(t *testing.T, bundle *testBundle, body any) *httptest.ResponseRecorder {
		t.Helper()
		return serve(t, bundle.router, limitsRequestOf(t, http.MethodPost, "/v1/limits/login", body))
	}
	peek := func(t *testing.T, bundle *testBundle, body any) *httptest.ResponseRecorder {
		t.Helper()
		return serve(t, bundle.router, limitsRequestOf(t, http.MethodPost, "/v1/limits/login?peek=true", body))
	}
	clear := func(t *testing.T, bundle *testBundle, body any) *httptest.ResponseRecorder {
		t.Helper()
		return serve(t, bundle.router, limitsRequestOf(t, http.MethodDelete, "/v1/limits/login", body))
	}
	alice := map[string]string{"ip": "198.51.100.7", "key": "account-42"}

	t.Run("NotMountedWithoutToken", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, dbtest.NewSQLite(t), &setupOpts{rules: loginRules()})
		for _, method := range []string{http.MethodPost, http.MethodDelete} {
			rec := serve(t, bundle.router, limitsRequestOf(t, method, "/v1/limits/login", alice))
			problem := decodeProblem(t, rec, http.StatusNotFound)
			require.Equal(t, "No route matches the request's path.", problem["detail"], "as any unknown route")
		}
		require.Zero(t, bundle.consumer.calls.Load()+bundle.consumer.peeks.Load())
	})

	t.Run("TokenRequired", func(t *testing.T) {
		t.Parallel()

		bundle, _ := limitsBundle(t, dbtest.NewSQLite(t))
		for name, header := range map[string]string{
			"None":        "",
			"WrongToken":  "Bearer " + strings.Repeat("x", len(limitsToken)),
			"Prefix":      "Bearer " + limitsToken[:len(limitsToken)-1],
			"Longer":      "Bearer " + limitsToken + "x",
			"BasicScheme": "Basic " + limitsToken,
			"NoScheme":    limitsToken,
			"EmptyBearer": "Bearer ",
		} {
			for _, path := range []string{"/v1/limits/login", "/v1/limits/no_such_action", "/v1/limits/register"} {
				req := limitsRequestOf(t, http.MethodPost, path, alice)
				req.Header.Set("Authorization", header)
				if header == "" {
					req.Header.Del("Authorization")
				}
				req.AddCookie(&http.Cookie{Name: "token", Value: limitsToken}) // never read
				rec := serve(t, bundle.router, req)
				decodeProblem(t, rec, http.StatusUnauthorized)
				want := `Bearer realm="postguard limits", error="invalid_token"`
				if _, presented := bearerToken(req); !presented {
					want = `Bearer realm="postguard limits"`
				}
				require.Equal(t, want, rec.Header().Get("WWW-Authenticate"), name)
				require.Empty(t, rec.Header().Get("Set-Cookie"))
				require.Empty(t, rec.Header().Get("RateLimit"), "nothing about the limits before the token")
			}
		}
		require.Zero(t, bundle.consumer.calls.Load()+bundle.consumer.peeks.Load(), "nothing counted or read")

		// The scheme is case-insensitive (RFC 9110).
		req := limitsRequestOf(t, http.MethodPost, "/v1/limits/login", alice)
		req.Header.Set("Authorization", "bearer "+limitsToken)
		decodeLimitsDecision(t, serve(t, bundle.router, req))
	})

	t.Run("UnknownAndBuiltInActions", func(t *testing.T) {
		t.Parallel()

		bundle, _ := limitsBundle(t, dbtest.NewSQLite(t))
		for _, action := range []string{"logout", "LOGIN", "register", "forgot_password", "riverui_login", "reset_password", "x-y", strings.Repeat("a", 33)} {
			for _, method := range []string{http.MethodPost, http.MethodDelete} {
				rec := serve(t, bundle.router, limitsRequestOf(t, method, "/v1/limits/"+action, map[string]string{"ip": "198.51.100.7", "email": "ada@example.com"}))
				problem := decodeProblem(t, rec, http.StatusNotFound)
				require.Contains(t, problem["detail"], "No custom rate-limit action", action)
			}
		}
		require.Zero(t, bundle.consumer.calls.Load()+bundle.consumer.peeks.Load())
	})

	t.Run("InvalidRequests", func(t *testing.T) {
		t.Parallel()

		bundle, _ := limitsBundle(t, dbtest.NewSQLite(t))
		for _, tt := range []struct {
			name     string
			method   string
			path     string
			body     string
			status   int
			pointers []string
		}{
			{"MissingKey", http.MethodPost, "/v1/limits/login", `{"ip":"198.51.100.7"}`, 422, []string{"#/key"}},
			{"MissingBoth", http.MethodPost, "/v1/limits/login", `{}`, 422, []string{"#/ip", "#/key"}},
			{"MissingEmail", http.MethodPost, "/v1/limits/newsletter", `{"ip":"198.51.100.7"}`, 422, []string{"#/email"}},
			{"BadIP", http.MethodPost, "/v1/limits/login", `{"ip":"198.51.100.999","key":"k"}`, 422, []string{"#/ip"}},
			{"BadIPWithPort", http.MethodPost, "/v1/limits/login", `{"ip":"198.51.100.7:80","key":"k"}`, 422, []string{"#/ip"}},
			{"BadIPUnused", http.MethodPost, "/v1/limits/newsletter", `{"ip":"nope","email":"ada@example.com"}`, 422, []string{"#/ip"}},
			{"BadEmail", http.MethodPost, "/v1/limits/newsletter", `{"email":"ada@[127.0.0.1]"}`, 422, []string{"#/email"}},
			{"KeyTooLong", http.MethodPost, "/v1/limits/login", `{"ip":"198.51.100.7","key":"` + strings.Repeat("k", 257) + `"}`, 422, []string{"#/key"}},
			{"ClearNothing", http.MethodDelete, "/v1/limits/login", `{}`, 422, []string{"#/ip", "#/key"}},
			{"ClearUnusedOnly", http.MethodDelete, "/v1/limits/login", `{"email":"ada@example.com"}`, 422, []string{"#/ip", "#/key"}},
			{"ClearBadIP", http.MethodDelete, "/v1/limits/login", `{"ip":"::ffff:zz","key":"k"}`, 422, []string{"#/ip"}},
			{"NotJSON", http.MethodPost, "/v1/limits/login", `ip=1.2.3.4`, 400, nil},
			{"UnknownField", http.MethodPost, "/v1/limits/login", `{"ip":"198.51.100.7","key":"k","account":"x"}`, 400, nil},
			{"Empty", http.MethodDelete, "/v1/limits/login", ``, 400, nil},
			{"PeekValue", http.MethodPost, "/v1/limits/login?peek=yes", `{"ip":"198.51.100.7","key":"k"}`, 400, nil},
		} {
			rec := serve(t, bundle.router, limitsRequestOf(t, tt.method, tt.path, tt.body))
			problem := decodeProblem(t, rec, tt.status)
			if tt.status != http.StatusUnprocessableEntity {
				continue
			}
			var pointers []string
			for _, e := range problem["errors"].([]any) {
				pointers = append(pointers, e.(map[string]any)["pointer"].(string))
			}
			require.Equal(t, tt.pointers, pointers, tt.name)
		}

		req := limitsRequestOf(t, http.MethodPost, "/v1/limits/login", alice)
		req.Header.Set("Content-Type", "text/plain")
		decodeProblem(t, serve(t, bundle.router, req), http.StatusUnsupportedMediaType)
		require.Zero(t, bundle.consumer.calls.Load()+bundle.consumer.peeks.Load(), "a bad request touches no counter")
	})

	t.Run("SpendPeekClear", func(t *testing.T) {
		t.Parallel()

		dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
			store := newStore(t)
			bundle, clock := limitsBundle(t, store)
			clock.Set(clock.Now().Add(5 * time.Minute))

			// A peek spends nothing, however often.
			for range 10 {
				answer := decodeLimitsDecision(t, peek(t, bundle, alice))
				require.Equal(t, limitsAnswer{Allowed: true, Policy: "login-key", Limit: 3, Remaining: 3, ResetAfterSeconds: 600}, answer)
			}
			require.Empty(t, counterTexts(t, store), "a peek wrote no counter")

			// Three failed logins spend the key's three.
			for want := int64(2); want >= 0; want-- {
				answer := decodeLimitsDecision(t, spend(t, bundle, alice))
				require.Equal(t, "login-key", answer.Policy)
				require.Equal(t, want, answer.Remaining)
			}
			// Then the key is refused: a spend, a peek, and from another IP.
			for _, rec := range []*httptest.ResponseRecorder{
				spend(t, bundle, alice),
				peek(t, bundle, alice),
				peek(t, bundle, map[string]string{"ip": "203.0.113.9", "key": "account-42"}),
			} {
				requireRateLimited(t, rec, "login-key", 3)
				require.EqualValues(t, 600, decodeProblem(t, rec, http.StatusTooManyRequests)["retry_after_seconds"])
			}
			// Another account from the same IP is fine; the IP has spent 4 of its 10.
			answer := decodeLimitsDecision(t, peek(t, bundle, map[string]string{"ip": "198.51.100.7", "key": "account-7"}))
			require.Equal(t, "login-key", answer.Policy)
			require.Equal(t, int64(3), answer.Remaining)

			// A login that succeeded clears the account's failures only.
			rec := clear(t, bundle, map[string]string{"key": "account-42"})
			require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
			require.Empty(t, rec.Body.String())
			answer = decodeLimitsDecision(t, spend(t, bundle, alice))
			require.Equal(t, int64(2), answer.Remaining, "the key's window started afresh")

			// The IP's failures still count: 5 of 10 spent, so 5 failures more from it reach the
			// IP's limit whatever the account.
			for i := range 5 {
				decodeLimitsDecision(t, spend(t, bundle, map[string]string{"ip": "198.51.100.7", "key": fmt.Sprintf("spray-%d", i)}))
			}
			requireRateLimited(t, spend(t, bundle, map[string]string{"ip": "198.51.100.7", "key": "spray-6"}), "login-ip", 10)

			// An operator unblocks the IP.
			rec = clear(t, bundle, map[string]string{"ip": "198.51.100.7"})
			require.Equal(t, http.StatusNoContent, rec.Code)
			decodeLimitsDecision(t, spend(t, bundle, map[string]string{"ip": "198.51.100.7", "key": "spray-6"}))

			// No counter holds a raw key, IP or address.
			texts := counterTexts(t, store)
			require.NotEmpty(t, texts)
			for _, text := range texts {
				for _, raw := range []string{"198.51.100.7", "account-42", "spray", "account"} {
					require.NotContains(t, text, raw)
				}
			}
		})
	})

	t.Run("EmailNormalised", func(t *testing.T) {
		t.Parallel()

		bundle, _ := limitsBundle(t, dbtest.NewSQLite(t))
		for _, email := range []string{"Ada@Bücher.de", "ada@xn--bcher-kva.de"} {
			decodeLimitsDecision(t, serve(t, bundle.router, limitsRequestOf(t, http.MethodPost, "/v1/limits/newsletter", map[string]string{"email": email})))
		}
		requireRateLimitedEmail := serve(t, bundle.router, limitsRequestOf(t, http.MethodPost, "/v1/limits/newsletter", map[string]string{"email": " ADA@bücher.de "}))
		require.Equal(t, http.StatusTooManyRequests, requireRateLimitedEmail.Code, "every spelling is one bucket")
		require.Equal(t, `"newsletter-email";q=2;w=900`, requireRateLimitedEmail.Header().Get("RateLimit-Policy"))
	})

	t.Run("ConcurrentSpendsExact", func(t *testing.T) {
		t.Parallel()

		dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
			bundle, _ := limitsBundle(t, newStore(t))

			recs := make([]*httptest.ResponseRecorder, 50)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range recs {
				req := limitsRequestOf(t, http.MethodPost, "/v1/limits/login", map[string]string{"ip": fmt.Sprintf("203.0.113.%d", i), "key": "account-42"})
				wg.Go(func() {
					<-start
					recs[i] = serve(t, bundle.router, req)
				})
			}
			close(start)
			wg.Wait()
			counts := map[int]int{}
			for _, rec := range recs {
				counts[rec.Code]++
				if rec.Code == http.StatusTooManyRequests {
					requireRateLimited(t, rec, "login-key", 3)
				}
			}
			require.Equal(t, map[int]int{http.StatusOK: 3, http.StatusTooManyRequests: 47}, counts)
		})
	})

	t.Run("Outage", func(t *testing.T) {
		t.Parallel()

		// Another connection holds SQLite's write lock past the busy timeout.
		busy := newBusySQLite(t)
		bundle, _ := limitsBundle(t, busy.store)
		busy.lock(t)
		requireOutage(t, bundle, spend(t, bundle, alice))
		requireOutage(t, bundle, clear(t, bundle, alice))

		busy.unlock(t)
		decodeLimitsDecision(t, spend(t, bundle, alice))
	})
}

func TestNew_LimitsToken(t *testing.T) {
	t.Parallel()

	store := dbtest.NewSQLite(t)
	config := &Config{
		Store:       store,
		Limiter:     newLimiter(t, store, abuse.DefaultRules(), nil),
		Secret:      testSecret,
		LimitsToken: strings.Repeat("t", MinLimitsTokenLen-1),
	}
	_, err := New(config)
	require.ErrorContains(t, err, "LimitsToken must be at least 32 bytes")

	config.LimitsToken = strings.Repeat("t", MinLimitsTokenLen)
	_, err = New(config)
	require.NoError(t, err)
}

// hostLogin is a host app's login over the limits API, as README teaches it: spend first (a 429
// checks no password), check the password (through check, then against right), and on a right
// one clear the account, refund the IP and issue a device. It returns the login's status and, on
// a success, the new device token.
func hostLogin(t testing.TB, router http.Handler, ip, key, password, right, device string, check func(string)) (int, string) {
	t.Helper()
	spend := serve(t, router, limitsRequestOf(t, http.MethodPost, "/v1/limits/login", map[string]string{"ip": ip, "key": key, "device": device}))
	switch spend.Code {
	case http.StatusOK:
	case http.StatusTooManyRequests:
		return http.StatusTooManyRequests, ""
	default:
		t.Errorf("spend answered %d: %s", spend.Code, spend.Body.String())
		return spend.Code, ""
	}
	if check != nil {
		check(password)
	}
	if password != right {
		return http.StatusUnauthorized, ""
	}
	for _, step := range []struct {
		method, path string
		body         map[string]string
		want         int
	}{
		{http.MethodDelete, "/v1/limits/login", map[string]string{"key": key, "device": device}, http.StatusNoContent},
		{http.MethodPost, "/v1/limits/login/refund", map[string]string{"ip": ip}, http.StatusNoContent},
		{http.MethodPost, "/v1/limits/login/devices", map[string]string{"key": key}, http.StatusCreated},
	} {
		rec := serve(t, router, limitsRequestOf(t, step.method, step.path, step.body))
		if rec.Code != step.want {
			t.Errorf("%s %s answered %d: %s", step.method, step.path, rec.Code, rec.Body.String())
			return rec.Code, ""
		}
		if step.want == http.StatusCreated {
			var answer limitsDeviceAnswer
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &answer))
			device = answer.Device
		}
	}
	return http.StatusOK, device
}

// requireSameAnswer checks two answers are the same: status, body and every header but the
// request id, which is fresh in every answer.
func requireSameAnswer(t *testing.T, want, got *httptest.ResponseRecorder, msgAndArgs ...any) {
	t.Helper()
	require.Equal(t, want.Code, got.Code, msgAndArgs...)
	require.Equal(t, want.Body.String(), got.Body.String(), msgAndArgs...)
	wantHeader, gotHeader := want.Header().Clone(), got.Header().Clone()
	require.NotEmpty(t, gotHeader.Get(requestIDHeader))
	wantHeader.Del(requestIDHeader)
	gotHeader.Del(requestIDHeader)
	require.Equal(t, wantHeader, gotHeader, msgAndArgs...)
}

func TestServer_LimitsLogin(t *testing.T) {
	t.Parallel()

	spend := func(t *testing.T, bundle *testBundle, body any) *httptest.ResponseRecorder {
		t.Helper()
		return serve(t, bundle.router, limitsRequestOf(t, http.MethodPost, "/v1/limits/login", body))
	}

	t.Run("BurstChecksAtMostTheLimit", func(t *testing.T) {
		t.Parallel()

		dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
			bundle, _ := limitsBundle(t, newStore(t))
			checker := bursttest.NewChecker()
			burst := bursttest.Burst{Attempts: 200, Right: 137, Limit: 3}
			result := checker.Run(t, burst, func(i int, password string) int {
				status, _ := hostLogin(t, bundle.router, fmt.Sprintf("203.0.%d.%d", i/250, i%250+1), "account-42", password, bursttest.Password(burst.Right), "", checker.Check)
				return status
			})
			require.LessOrEqual(t, result.Checks, burst.Limit, "passwords checked")
			require.False(t, result.Found, "the right password was found")
			require.Equal(t, map[int]int{http.StatusUnauthorized: burst.Limit, http.StatusTooManyRequests: burst.Attempts - burst.Limit}, result.Counts())
		})
	})

	t.Run("ASuccessRefundsTheIP", func(t *testing.T) {
		t.Parallel()

		dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
			bundle, _ := limitsBundle(t, newStore(t))
			// The IP rule allows 10: 25 successes from one IP are never refused.
			for i := range 25 {
				status, _ := hostLogin(t, bundle.router, "198.51.100.7", "account-42", "right", "right", "", nil)
				require.Equal(t, http.StatusOK, status, "success %d", i)
			}
			// 10 failures are (one account each, under the key's limit).
			for i := range 10 {
				status, _ := hostLogin(t, bundle.router, "198.51.100.7", fmt.Sprintf("account-%d", i), "wrong", "right", "", nil)
				require.Equal(t, http.StatusUnauthorized, status, "failure %d", i)
			}
			requireRateLimited(t, spend(t, bundle, map[string]string{"ip": "198.51.100.7", "key": "account-99"}), "login-ip", 10)
		})
	})

	t.Run("RefundIsTheCurrentWindowsAndNeverBelowZero", func(t *testing.T) {
		t.Parallel()

		dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
			store := newStore(t)
			bundle, clock := limitsBundle(t, store)
			refund := func(body any) *httptest.ResponseRecorder {
				return serve(t, bundle.router, limitsRequestOf(t, http.MethodPost, "/v1/limits/login/refund", body))
			}
			alice := map[string]string{"ip": "198.51.100.7", "key": "account-42"}

			// Two in the window before, three in this one.
			clock.Set(clock.Now().Add(-time.Minute))
			for range 2 {
				decodeLimitsDecision(t, spend(t, bundle, alice))
			}
			clock.Set(clock.Now().Add(2 * time.Minute))
			for range 3 {
				decodeLimitsDecision(t, spend(t, bundle, alice))
			}
			rec := refund(map[string]string{"key": "account-42"})
			require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
			require.Empty(t, rec.Body.String())
			answer := decodeLimitsDecision(t, serve(t, bundle.router, limitsRequestOf(t, http.MethodPost, "/v1/limits/login?peek=true", alice)))
			require.Equal(t, limitsAnswer{Allowed: true, Policy: "login-key", Limit: 3, Remaining: 1, ResetAfterSeconds: 840}, answer)

			for range 5 {
				require.Equal(t, http.StatusNoContent, refund(alice).Code)
			}
			answer = decodeLimitsDecision(t, serve(t, bundle.router, limitsRequestOf(t, http.MethodPost, "/v1/limits/login?peek=true", alice)))
			require.Equal(t, int64(3), answer.Remaining, "never below zero")
			for _, text := range counterTexts(t, store) {
				require.NotContains(t, text, "|-", "no negative count")
			}
			clock.Set(clock.Now().Add(-2 * time.Minute))
			answer = decodeLimitsDecision(t, serve(t, bundle.router, limitsRequestOf(t, http.MethodPost, "/v1/limits/login?peek=true", alice)))
			require.Equal(t, int64(1), answer.Remaining, "the window before kept its two")
		})
	})

	t.Run("TrustedDevices", func(t *testing.T) {
		t.Parallel()

		dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
			bundle, clock := limitsBundle(t, newStore(t))
			status, device := hostLogin(t, bundle.router, "198.51.100.7", "account-42", "right", "right", "", nil)
			require.Equal(t, http.StatusOK, status)
			require.NotEmpty(t, device)
			_, spare := hostLogin(t, bundle.router, "198.51.100.7", "account-42", "right", "right", "", nil) // the owner's other browser

			// 100 failures for the account from 50 IPs: the account is locked for unknown clients.
			for i := range 100 {
				status, _ := hostLogin(t, bundle.router, fmt.Sprintf("203.0.113.%d", i%50), "account-42", fmt.Sprintf("guess-%d", i), "right", "", nil)
				require.Equal(t, i < 3, status == http.StatusUnauthorized, "attempt %d: %d", i, status)
			}
			none := spend(t, bundle, map[string]string{"ip": "198.51.100.8", "key": "account-42"})
			requireRateLimited(t, none, "login-key", 3)
			status, _ = hostLogin(t, bundle.router, "198.51.100.9", "account-42", "right", "right", "", nil)
			require.Equal(t, http.StatusTooManyRequests, status, "an untrusted client is refused, right password or not")

			// The owner's device logs in at once, and gets a fresh device.
			status, device = hostLogin(t, bundle.router, "198.51.100.7", "account-42", "right", "right", device, nil)
			require.Equal(t, http.StatusOK, status)

			// A device locks itself after 3 failures of its own.
			for i := range 3 {
				status, _ := hostLogin(t, bundle.router, "198.51.100.7", "account-42", "wrong", "right", device, nil)
				require.Equal(t, http.StatusUnauthorized, status, "failure %d", i)
			}
			status, _ = hostLogin(t, bundle.router, "198.51.100.7", "account-42", "right", "right", device, nil)
			require.Equal(t, http.StatusTooManyRequests, status)

			// Every token that does not stand is answered exactly as none: a spend and a peek.
			_, otherAccount := hostLogin(t, bundle.router, "198.51.100.10", "account-7", "right", "right", "", nil)
			raw, err := base64.RawURLEncoding.DecodeString(spare) // a device that stands, and has room
			require.NoError(t, err)
			raw[len(raw)-1] ^= 1
			bad := map[string]string{
				"Malformed":    "not-a-token",
				"Forged":       base64.RawURLEncoding.EncodeToString(raw),
				"OtherAccount": otherAccount,
			}
			requireAsNone := func(name, token string) {
				t.Helper()
				for _, path := range []string{"/v1/limits/login", "/v1/limits/login?peek=true"} {
					want := serve(t, bundle.router, limitsRequestOf(t, http.MethodPost, path, map[string]string{"ip": "198.51.100.8", "key": "account-42"}))
					got := serve(t, bundle.router, limitsRequestOf(t, http.MethodPost, path, map[string]string{"ip": "198.51.100.8", "key": "account-42", "device": token}))
					requireSameAnswer(t, want, got, name+" "+path)
				}
			}
			for name, token := range bad {
				requireAsNone(name, token)
			}

			// Revoked: the owner's other browser stands until the account's devices are revoked.
			answer := decodeLimitsDecision(t, serve(t, bundle.router, limitsRequestOf(t, http.MethodPost, "/v1/limits/login?peek=true", map[string]string{"ip": "198.51.100.8", "key": "account-42", "device": spare})))
			require.Equal(t, int64(3), answer.Remaining)
			rec := serve(t, bundle.router, limitsRequestOf(t, http.MethodDelete, "/v1/limits/login/devices", map[string]string{"key": "account-42"}))
			require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
			requireAsNone("Revoked", spare)
			_, fresh := hostLogin(t, bundle.router, "198.51.100.11", "account-7", "right", "right", "", nil)
			decodeLimitsDecision(t, spend(t, bundle, map[string]string{"ip": "198.51.100.8", "key": "account-7", "device": fresh}))

			// Expired: the clock passes DEVICE_TOKEN_TTL; lock the account again in that window.
			clock.Set(clock.Now().Add(abuse.DefaultDeviceTokenTTL))
			for i := range 3 {
				status, _ := hostLogin(t, bundle.router, fmt.Sprintf("203.0.113.%d", i), "account-7", "guess", "right", "", nil)
				require.Equal(t, http.StatusUnauthorized, status)
			}
			for _, path := range []string{"/v1/limits/login", "/v1/limits/login?peek=true"} {
				want := serve(t, bundle.router, limitsRequestOf(t, http.MethodPost, path, map[string]string{"ip": "198.51.100.8", "key": "account-7"}))
				got := serve(t, bundle.router, limitsRequestOf(t, http.MethodPost, path, map[string]string{"ip": "198.51.100.8", "key": "account-7", "device": fresh}))
				requireSameAnswer(t, want, got, "Expired "+path)
			}

			require.Equal(t, map[string]float64{"trusted": 2 + 3 + 1 + 1 + 1, "revoked": 2, "expired": 2, "forged": 4, "malformed": 2}, deviceTokens(t, bundle.registry, "login"))
		})
	})

	t.Run("DevicesInvalidRequests", func(t *testing.T) {
		t.Parallel()

		bundle, _ := limitsBundle(t, dbtest.NewSQLite(t))
		for _, tt := range []struct {
			name   string
			method string
			path   string
			body   string
			status int
		}{
			{"IssueNoKey", http.MethodPost, "/v1/limits/login/devices", `{}`, 422},
			{"IssueEmptyKey", http.MethodPost, "/v1/limits/login/devices", `{"key":""}`, 422},
			{"IssueKeyTooLong", http.MethodPost, "/v1/limits/login/devices", `{"key":"` + strings.Repeat("k", 257) + `"}`, 422},
			{"IssueNoKeyRule", http.MethodPost, "/v1/limits/newsletter/devices", `{"key":"k"}`, 422},
			{"RevokeNoKeyRule", http.MethodDelete, "/v1/limits/newsletter/devices", `{"key":"k"}`, 422},
			{"IssueUnknownField", http.MethodPost, "/v1/limits/login/devices", `{"key":"k","ip":"198.51.100.7"}`, 400},
			{"IssueNotJSON", http.MethodPost, "/v1/limits/login/devices", `key=k`, 400},
			{"IssueUnknownAction", http.MethodPost, "/v1/limits/logout/devices", `{"key":"k"}`, 404},
			{"IssueBuiltInAction", http.MethodPost, "/v1/limits/register/devices", `{"key":"k"}`, 404},
			{"RefundNothing", http.MethodPost, "/v1/limits/login/refund", `{}`, 422},
			{"RefundUnusedOnly", http.MethodPost, "/v1/limits/login/refund", `{"email":"ada@example.com"}`, 422},
			{"RefundBadIP", http.MethodPost, "/v1/limits/login/refund", `{"ip":"nope"}`, 422},
			{"RefundBuiltInAction", http.MethodPost, "/v1/limits/register/refund", `{"ip":"198.51.100.7"}`, 404},
			{"DeviceNotAString", http.MethodPost, "/v1/limits/login", `{"ip":"198.51.100.7","key":"k","device":5}`, 400},
		} {
			rec := serve(t, bundle.router, limitsRequestOf(t, tt.method, tt.path, tt.body))
			decodeProblem(t, rec, tt.status)
		}
		require.Zero(t, bundle.consumer.calls.Load()+bundle.consumer.peeks.Load(), "a bad request touches no counter")

		// A device of any shape is no device, never a 4xx.
		for _, device := range []string{"x", strings.Repeat("A", 87), strings.Repeat("é", 1000)} {
			decodeLimitsDecision(t, serve(t, bundle.router, limitsRequestOf(t, http.MethodPost, "/v1/limits/login", map[string]string{"ip": "198.51.100.7", "key": "k", "device": device})))
		}

		// Without the token: 401, as every limits route.
		for _, path := range []string{"/v1/limits/login/refund", "/v1/limits/login/devices"} {
			req := limitsRequestOf(t, http.MethodPost, path, `{"key":"k"}`)
			req.Header.Del("Authorization")
			decodeProblem(t, serve(t, bundle.router, req), http.StatusUnauthorized)
		}
	})

	t.Run("Outage", func(t *testing.T) {
		t.Parallel()

		busy := newBusySQLite(t)
		bundle, _ := limitsBundle(t, busy.store)
		busy.lock(t)
		requireOutage(t, bundle, serve(t, bundle.router, limitsRequestOf(t, http.MethodPost, "/v1/limits/login/refund", map[string]string{"ip": "198.51.100.7"})))
		requireOutage(t, bundle, serve(t, bundle.router, limitsRequestOf(t, http.MethodDelete, "/v1/limits/login/devices", map[string]string{"key": "k"})))
	})
}

// deviceTokens reads postguard_rate_limit_device_tokens_total of action, by outcome.
func deviceTokens(t *testing.T, registry *prometheus.Registry, action string) map[string]float64 {
	t.Helper()
	families, err := registry.Gather()
	require.NoError(t, err)
	outcomes := map[string]float64{}
	for _, family := range families {
		if family.GetName() != "postguard_rate_limit_device_tokens_total" {
			continue
		}
		for _, metric := range family.GetMetric() {
			labels := map[string]string{}
			for _, pair := range metric.GetLabel() {
				labels[pair.GetName()] = pair.GetValue()
			}
			if labels["action"] == action {
				outcomes[labels["outcome"]] = metric.GetCounter().GetValue()
			}
		}
	}
	return outcomes
}
