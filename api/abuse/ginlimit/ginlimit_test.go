package ginlimit_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/api/abuse/ginlimit"
	"github.com/postguard/postguard/internal/bursttest"
	"github.com/postguard/postguard/internal/dbtest"
)

var testSecret = []byte("ginlimit test secret, 32 bytes or more")

// windowStart is aligned on 15 minutes.
var windowStart = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

type testBundle struct {
	guard   *ginlimit.Guard
	router  *gin.Engine
	handled atomic.Int64
	store   *dbtest.Store
}

// setup is a Gin app whose routes a Guard limits, on a real store, its limiter's clock five
// minutes into a window; routes is given the guard and a handler that counts its calls.
func setup(t *testing.T, newStore dbtest.NewStoreFunc, rules abuse.Rules, ips *abuse.IPResolver, routes func(b *testBundle, r *gin.Engine)) *testBundle {
	t.Helper()
	gin.SetMode(gin.ReleaseMode)
	b := &testBundle{store: newStore(t), router: gin.New()}
	limiter, err := abuse.NewLimiter(b.store, testSecret, rules, &abuse.LimiterConfig{NowFunc: func() time.Time { return windowStart.Add(5 * time.Minute) }})
	require.NoError(t, err)
	b.guard = ginlimit.New(limiter, &ginlimit.Config{IPResolver: ips, Logger: dbtest.Logger(t)})
	routes(b, b.router)
	return b
}

func (b *testBundle) ok(c *gin.Context) {
	b.handled.Add(1)
	c.String(http.StatusOK, "ok")
}

func request(b *testBundle, method, path, remoteAddr string, header http.Header) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, nil)
	req.RemoteAddr = remoteAddr
	for k, vs := range header {
		req.Header[k] = vs
	}
	rec := httptest.NewRecorder()
	b.router.ServeHTTP(rec, req)
	return rec
}

// requireRefused checks rec is the 429 problem of policy, as postguard's own routes answer it.
func requireRefused(t *testing.T, rec *httptest.ResponseRecorder, policy string) {
	t.Helper()
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
	require.Equal(t, "600", rec.Header().Get("Retry-After"))
	require.Equal(t, `"`+policy+`";r=0;t=600`, rec.Header().Get("RateLimit"))
	var problem map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &problem))
	require.Equal(t, map[string]any{
		"type":                "about:blank",
		"title":               "Too Many Requests",
		"status":              float64(429),
		"detail":              "Too many requests; retry in 600 seconds.",
		"retry_after_seconds": float64(600),
	}, problem)
}

func TestGuard_Limit(t *testing.T) {
	t.Parallel()

	rules := abuse.Rules{}.
		With(abuse.Rule{Action: "search", Scope: abuse.ScopeIP, Limit: 2, Window: 15 * time.Minute}).
		With(abuse.Rule{Action: "export", Scope: abuse.ScopeIP, Limit: 100, Window: 15 * time.Minute}).
		With(abuse.Rule{Action: "export", Scope: abuse.ScopeKey, Limit: 1, Window: 15 * time.Minute})
	trusted := abuse.NewIPResolver([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")})

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		routes := func(b *testBundle, r *gin.Engine) {
			r.GET("/search", b.guard.Limit("search", nil), b.ok)
			r.GET("/accounts/:id/export", b.guard.Limit("export", func(c *gin.Context) abuse.Subject {
				return abuse.Subject{Key: c.Param("id")}
			}), b.ok)
		}

		t.Run("PerIP", func(t *testing.T) {
			t.Parallel()

			b := setup(t, newStore, rules, nil, routes)
			for remaining := 1; remaining >= 0; remaining-- {
				rec := request(b, http.MethodGet, "/search", "198.51.100.7:40000", nil)
				require.Equal(t, http.StatusOK, rec.Code)
				require.Equal(t, `"search-ip";q=2;w=900`, rec.Header().Get("RateLimit-Policy"))
				require.Equal(t, `"search-ip";r=`+strconv.Itoa(remaining)+`;t=600`, rec.Header().Get("RateLimit"))
			}
			requireRefused(t, request(b, http.MethodGet, "/search", "198.51.100.7:40001", nil), "search-ip")
			require.Equal(t, int64(2), b.handled.Load(), "a refused request goes no further")

			require.Equal(t, http.StatusOK, request(b, http.MethodGet, "/search", "198.51.100.8:40000", nil).Code, "another IP")
		})

		t.Run("ClientIPFromTheResolverOnly", func(t *testing.T) {
			t.Parallel()

			b := setup(t, newStore, rules, trusted, routes)
			// An untrusted peer's X-Forwarded-For is not believed: it cannot pick a fresh bucket.
			for i, xff := range []string{"192.0.2.1", "192.0.2.2", "192.0.2.3"} {
				rec := request(b, http.MethodGet, "/search", "203.0.113.9:1234", http.Header{"X-Forwarded-For": {xff}})
				require.Equal(t, i < 2, rec.Code == http.StatusOK, "request %d", i)
			}
			// Through the trusted proxy, each forwarded client has a bucket of its own.
			for _, client := range []string{"198.51.100.1", "198.51.100.2", "198.51.100.1"} {
				rec := request(b, http.MethodGet, "/search", "10.0.0.1:1234", http.Header{"X-Forwarded-For": {client}})
				require.Equal(t, http.StatusOK, rec.Code, client)
			}
			requireRefused(t, request(b, http.MethodGet, "/search", "10.0.0.2:1234", http.Header{"X-Forwarded-For": {"198.51.100.1"}}), "search-ip")
		})

		t.Run("KeyFromTheRequest", func(t *testing.T) {
			t.Parallel()

			b := setup(t, newStore, rules, nil, routes)
			require.Equal(t, http.StatusOK, request(b, http.MethodGet, "/accounts/42/export", "198.51.100.7:1", nil).Code)
			requireRefused(t, request(b, http.MethodGet, "/accounts/42/export", "198.51.100.9:1", nil), "export-key")
			require.Equal(t, http.StatusOK, request(b, http.MethodGet, "/accounts/43/export", "198.51.100.7:1", nil).Code)
		})

		t.Run("DatabaseDownIsA503", func(t *testing.T) {
			t.Parallel()

			b := setup(t, newStore, rules, nil, routes)
			require.NoError(t, b.store.Close())
			rec := request(b, http.MethodGet, "/search", "198.51.100.7:1", nil)
			require.Equal(t, http.StatusServiceUnavailable, rec.Code)
			require.Equal(t, "5", rec.Header().Get("Retry-After"))
			require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
			require.Zero(t, b.handled.Load(), "fails closed")
		})
	})
}

// loginRoutes is the login of a host app, as the package doc teaches it: spend first, then check
// the password (through check, then against right); on a right one clear the account, refund
// the IP and issue a device cookie.
func loginRoutes(right string, check func(password string)) func(b *testBundle, r *gin.Engine) {
	return func(b *testBundle, r *gin.Engine) {
		r.POST("/login/:account", func(c *gin.Context) {
			account := c.Param("account")
			subject := b.guard.Subject(c, abuse.Subject{Key: account, Device: b.guard.Device(c, "login")})
			if !b.guard.Spend(c, "login", subject) {
				return
			}
			password := c.GetHeader("X-Password")
			if check != nil {
				check(password)
			}
			if password != right {
				c.String(http.StatusUnauthorized, "wrong password")
				return
			}
			if b.guard.Clear(c, "login", abuse.Subject{Key: account, Device: subject.Device}) &&
				b.guard.Refund(c, "login", abuse.Subject{IP: subject.IP}) &&
				b.guard.IssueDevice(c, "login", account) {
				b.ok(c)
			}
		})
	}
}

func TestGuard_Login(t *testing.T) {
	t.Parallel()

	rules := abuse.Rules{}.
		With(abuse.Rule{Action: "login", Scope: abuse.ScopeIP, Limit: 5, Window: 15 * time.Minute}).
		With(abuse.Rule{Action: "login", Scope: abuse.ScopeKey, Limit: 2, Window: 15 * time.Minute})

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		login := func(b *testBundle, ip, account, password string, cookies ...*http.Cookie) *httptest.ResponseRecorder {
			req := httptest.NewRequest(http.MethodPost, "/login/"+account, nil)
			req.RemoteAddr = ip + ":1"
			req.Header.Set("X-Password", password)
			for _, cookie := range cookies {
				req.AddCookie(cookie)
			}
			rec := httptest.NewRecorder()
			b.router.ServeHTTP(rec, req)
			return rec
		}

		t.Run("FailuresCountSuccessesDoNot", func(t *testing.T) {
			t.Parallel()

			b := setup(t, newStore, rules, nil, loginRoutes("right", nil))
			require.Equal(t, http.StatusUnauthorized, login(b, "198.51.100.7", "ada", "wrong").Code)
			require.Equal(t, http.StatusOK, login(b, "198.51.100.7", "ada", "right").Code)
			require.Equal(t, http.StatusUnauthorized, login(b, "198.51.100.7", "ada", "wrong").Code, "the success cleared the account's failures")
			require.Equal(t, http.StatusUnauthorized, login(b, "198.51.100.7", "ada", "wrong").Code)
			requireRefused(t, login(b, "198.51.100.7", "ada", "right"), "login-key")
			// The IP has spent 4 of its 5 (the success was refunded, the refusal not counted):
			// one failure more on any account, and it is refused.
			require.Equal(t, http.StatusUnauthorized, login(b, "198.51.100.7", "bob", "wrong").Code)
			requireRefused(t, login(b, "198.51.100.7", "carol", "right"), "login-ip")

			// Successes cost an IP nothing: 5 in a row from a fresh one, 5 more, never refused.
			for i := range 10 {
				require.Equal(t, http.StatusOK, login(b, "198.51.100.8", "dave", "right").Code, "success %d", i)
			}
		})

		t.Run("BurstChecksAtMostTheLimit", func(t *testing.T) {
			t.Parallel()

			checker := bursttest.NewChecker()
			burst := bursttest.Burst{Attempts: 200, Right: 137, Limit: 2}
			b := setup(t, newStore, rules, nil, loginRoutes(bursttest.Password(burst.Right), checker.Check))
			result := checker.Run(t, burst, func(i int, password string) int {
				return login(b, fmt.Sprintf("203.0.%d.%d", i/250, i%250+1), "ada", password).Code
			})
			require.LessOrEqual(t, result.Checks, burst.Limit, "passwords checked")
			require.False(t, result.Found, "the right password was found")
			require.Equal(t, map[int]int{http.StatusUnauthorized: burst.Limit, http.StatusTooManyRequests: burst.Attempts - burst.Limit}, result.Counts())
		})

		t.Run("DeviceCookie", func(t *testing.T) {
			t.Parallel()

			b := setup(t, newStore, rules, nil, loginRoutes("right", nil))
			rec := login(b, "198.51.100.7", "ada", "right")
			require.Equal(t, http.StatusOK, rec.Code)
			cookies := rec.Result().Cookies()
			require.Len(t, cookies, 1)
			device := cookies[0]
			require.Equal(t, "__Host-postguard-device-login", device.Name)
			require.Equal(t, ginlimit.DeviceCookieName("login"), device.Name)
			require.NotEmpty(t, device.Value)
			require.True(t, device.Secure)
			require.True(t, device.HttpOnly)
			require.Equal(t, http.SameSiteLaxMode, device.SameSite)
			require.Equal(t, "/", device.Path)
			require.Empty(t, device.Domain, "a __Host- cookie names no domain")
			require.Equal(t, int(abuse.DefaultDeviceTokenTTL/time.Second), device.MaxAge)
			require.Contains(t, rec.Header().Get("Set-Cookie"), "; Secure")

			// Guessers lock the account: unknown clients are refused, the owner's browser is not.
			for i := range 2 {
				require.Equal(t, http.StatusUnauthorized, login(b, fmt.Sprintf("203.0.113.%d", i), "ada", "guess").Code)
			}
			none := login(b, "198.51.100.9", "ada", "right")
			requireRefused(t, none, "login-key")
			require.Equal(t, http.StatusOK, login(b, "198.51.100.7", "ada", "right", device).Code)

			// A cookie that does not stand is answered exactly as none.
			for name, value := range map[string]string{"Garbage": "not-a-token", "Empty": "", "Truncated": device.Value[:len(device.Value)-1]} {
				forged := login(b, "198.51.100.9", "ada", "right", &http.Cookie{Name: device.Name, Value: value})
				require.Equal(t, none.Code, forged.Code, name)
				require.Equal(t, none.Header(), forged.Header(), name)
				require.Equal(t, none.Body.String(), forged.Body.String(), name)
			}
		})

		t.Run("DatabaseDownIsA503", func(t *testing.T) {
			t.Parallel()

			b := setup(t, newStore, rules, nil, func(b *testBundle, r *gin.Engine) {
				r.POST("/refund", func(c *gin.Context) {
					if b.guard.Refund(c, "login", b.guard.Subject(c, abuse.Subject{})) {
						b.ok(c)
					}
				})
				r.POST("/device", func(c *gin.Context) {
					if b.guard.IssueDevice(c, "login", "ada") {
						b.ok(c)
					}
				})
				r.POST("/revoke", func(c *gin.Context) {
					if b.guard.RevokeDevices(c, "login", "ada") {
						b.ok(c)
					}
				})
			})
			for _, path := range []string{"/refund", "/device", "/revoke"} {
				require.Equal(t, http.StatusOK, request(b, http.MethodPost, path, "198.51.100.7:1", nil).Code, path)
			}
			require.NoError(t, b.store.Close())
			for _, path := range []string{"/refund", "/device", "/revoke"} {
				rec := request(b, http.MethodPost, path, "198.51.100.7:1", nil)
				require.Equal(t, http.StatusServiceUnavailable, rec.Code, path)
				require.Equal(t, "5", rec.Header().Get("Retry-After"))
				require.Empty(t, rec.Header().Get("Set-Cookie"), "no cookie without a token")
			}
			require.Equal(t, int64(3), b.handled.Load())
		})
	})
}
