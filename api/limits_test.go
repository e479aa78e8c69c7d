package api

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/db/sqlite"
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
		ctx := t.Context()
		path := filepath.Join(t.TempDir(), "busy.db")
		engine, err := sqlite.NewEngine(ctx, path, &sqlite.Config{Logger: dbtest.Logger(t), BusyTimeout: 50 * time.Millisecond})
		require.NoError(t, err)
		store, _, err := riverstore.New(engine, riversqlite.New(engine.DB()), &riverstore.Config{Logger: dbtest.Logger(t)})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, store.Close()) })
		require.NoError(t, store.Migrate(ctx))
		bundle, _ := limitsBundle(t, store)

		other, err := sql.Open("sqlite", path)
		require.NoError(t, err)
		t.Cleanup(func() { other.Close() })
		holder, err := other.Conn(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { holder.Close() })
		_, err = holder.ExecContext(ctx, "BEGIN IMMEDIATE")
		require.NoError(t, err)

		requireOutage(t, bundle, spend(t, bundle, alice))
		requireOutage(t, bundle, clear(t, bundle, alice))

		_, err = holder.ExecContext(ctx, "ROLLBACK")
		require.NoError(t, err)
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
