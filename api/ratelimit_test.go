package api

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
)

// registerIPRules limits register to limit per IP per 15 minutes, and nothing else tightly.
func registerIPRules(limit int64) *abuse.Rules {
	rules := generousRules().With(abuse.Rule{Action: abuse.ActionRegister, Scope: abuse.ScopeIP, Limit: limit, Window: 15 * time.Minute})
	return &rules
}

// requireRateLimited checks a 429 answer: the problem with retry_after_seconds, Retry-After, and
// the IETF draft's headers for policy.
func requireRateLimited(t testing.TB, rec *httptest.ResponseRecorder, policy string, limit int64) {
	t.Helper()
	problem := decodeProblem(t, rec, http.StatusTooManyRequests)
	retryAfter, err := strconv.ParseInt(rec.Header().Get("Retry-After"), 10, 64)
	require.NoError(t, err)
	require.GreaterOrEqual(t, retryAfter, int64(1))
	require.LessOrEqual(t, retryAfter, int64(15*60))
	require.EqualValues(t, retryAfter, problem["retry_after_seconds"])
	require.Equal(t, fmt.Sprintf(`"%s";q=%d;w=900`, policy, limit), rec.Header().Get("RateLimit-Policy"))
	require.Equal(t, fmt.Sprintf(`"%s";r=0;t=%d`, policy, retryAfter), rec.Header().Get("RateLimit"))
}

// burst sends n register requests for distinct emails from one IP at once, spreading them over
// routers, and returns the answers.
func burst(t *testing.T, routers []http.Handler, n int) []*httptest.ResponseRecorder {
	t.Helper()
	recs := make([]*httptest.ResponseRecorder, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			req := jsonRequest(t, "/v1/auth/register", map[string]string{"email": fmt.Sprintf("burst%d@example.com", i), "password": "correct horse battery"})
			req.RemoteAddr = "198.51.100.7:40000"
			<-start
			recs[i] = serve(t, routers[i%len(routers)], req)
		})
	}
	close(start)
	wg.Wait()
	return recs
}

func requireBurstOutcome(t *testing.T, recs []*httptest.ResponseRecorder, limit int64) {
	t.Helper()
	var created, limited int
	for _, rec := range recs {
		switch rec.Code {
		case http.StatusCreated:
			created++
		case http.StatusTooManyRequests:
			limited++
			requireRateLimited(t, rec, "register-ip", limit)
		default:
			t.Fatalf("unexpected answer %d: %s", rec.Code, rec.Body.String())
		}
	}
	require.Equal(t, int(limit), created)
	require.Equal(t, len(recs)-int(limit), limited)
}

func TestServer_RateLimitConcurrent(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		bundle := setup(t, newStore(t), &setupOpts{rules: registerIPRules(5)})

		recs := burst(t, []http.Handler{bundle.router}, 50)
		requireBurstOutcome(t, recs, 5)
		require.Equal(t, 5, jobCount(t, bundle.store, "welcome_email"))
	})
}

func TestServer_RateLimitConcurrentTwoRouters(t *testing.T) {
	t.Parallel()

	// Two API processes: two stores (pools) and two limiters on one PostgreSQL schema.
	databaseURL := dbtest.PostgresURL(t)
	var routers []http.Handler
	var first riverstore.Store
	for range 2 {
		store := dbtest.OpenPostgres(t, databaseURL)
		bundle := setup(t, store, &setupOpts{rules: registerIPRules(5)})
		routers = append(routers, bundle.router)
		if first == nil {
			first = store
		}
	}

	recs := burst(t, routers, 50)
	requireBurstOutcome(t, recs, 5)
	require.Equal(t, 5, jobCount(t, first, "welcome_email"))
}

func TestServer_ClientIP(t *testing.T) {
	t.Parallel()

	const limit = 3
	rules := generousRules().With(abuse.Rule{Action: abuse.ActionForgotPassword, Scope: abuse.ScopeIP, Limit: limit, Window: 15 * time.Minute})
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}

	// forgot sends a forgot-password request for a fresh email.
	forgot := func(t *testing.T, router http.Handler, remoteAddr string, header http.Header) *httptest.ResponseRecorder {
		t.Helper()
		req := jsonRequest(t, "/v1/auth/forgot-password", map[string]string{"email": uniqueEmail("ip")})
		req.RemoteAddr = remoteAddr
		for k, vs := range header {
			req.Header[k] = vs
		}
		return serve(t, router, req)
	}
	randomIP := func() string {
		return fmt.Sprintf("%d.%d.%d.%d", 1+rand.IntN(200), rand.IntN(256), rand.IntN(256), 1+rand.IntN(254))
	}

	t.Run("UntrustedPeerHeadersIgnored", func(t *testing.T) {
		t.Parallel()
		bundle := newSQLiteBundle(t, &setupOpts{rules: &rules, trusted: trusted})
		for i := range 2 * limit {
			rec := forgot(t, bundle.router, "203.0.113.5:5000", http.Header{
				"X-Forwarded-For": {randomIP() + ", " + randomIP()},
				"X-Real-Ip":       {randomIP()},
			})
			if i < limit {
				require.Equal(t, http.StatusAccepted, rec.Code, "request %d", i)
			} else {
				requireForgotLimited(t, rec)
			}
		}
	})

	t.Run("TrustedProxyForwardedForDecides", func(t *testing.T) {
		t.Parallel()
		bundle := newSQLiteBundle(t, &setupOpts{rules: &rules, trusted: trusted})
		// Distinct clients behind one proxy each get their own bucket...
		for i := range 2 * limit {
			rec := forgot(t, bundle.router, "10.0.0.1:5000", http.Header{"X-Forwarded-For": {fmt.Sprintf("198.51.100.%d, 10.0.0.2", i+1)}})
			require.Equal(t, http.StatusAccepted, rec.Code, "request %d", i)
		}
		// ...and one client behind it is limited, whatever it writes left of the proxy's entry.
		for i := range 2 * limit {
			rec := forgot(t, bundle.router, "10.0.0.1:5000", http.Header{"X-Forwarded-For": {randomIP() + ", 192.0.2.99"}})
			if i < limit {
				require.Equal(t, http.StatusAccepted, rec.Code, "request %d", i)
			} else {
				requireForgotLimited(t, rec)
			}
		}
	})

	// A proxy that sets X-Real-IP to the client's address and passes the client's own
	// X-Forwarded-For through (nginx with proxy_set_header X-Real-IP $remote_addr and no
	// X-Forwarded-For rewrite).
	nginx := func(clientXFF string) http.Header {
		return http.Header{"X-Real-Ip": {"203.0.113.50"}, "X-Forwarded-For": {clientXFF}}
	}

	t.Run("NginxDefaultHeaderLetsClientChoose", func(t *testing.T) {
		t.Parallel()
		bundle := newSQLiteBundle(t, &setupOpts{rules: &rules, trusted: trusted})
		// With X-Forwarded-For believed, the client writes the entry that wins: a fresh bucket
		// every time. This is why CLIENT_IP_HEADER exists.
		for i := range 2 * limit {
			rec := forgot(t, bundle.router, "10.0.0.1:5000", nginx(randomIP()))
			require.Equal(t, http.StatusAccepted, rec.Code, "request %d", i)
		}
	})

	t.Run("NginxRealIPHeader", func(t *testing.T) {
		t.Parallel()
		bundle := newSQLiteBundle(t, &setupOpts{rules: &rules, trusted: trusted, ipHeader: abuse.HeaderXRealIP})
		// CLIENT_IP_HEADER=X-Real-IP: the proxy's word, whatever the client put in XFF.
		for i := range 2 * limit {
			rec := forgot(t, bundle.router, "10.0.0.1:5000", nginx(randomIP()))
			if i < limit {
				require.Equal(t, http.StatusAccepted, rec.Code, "request %d", i)
			} else {
				requireForgotLimited(t, rec)
			}
		}
		// Another client behind the same proxy has its own bucket...
		rec := forgot(t, bundle.router, "10.0.0.1:5000", http.Header{"X-Real-Ip": {"203.0.113.51"}})
		require.Equal(t, http.StatusAccepted, rec.Code)
		// ...and X-Real-IP from a peer that is not a trusted proxy is not believed.
		for i := range 2 * limit {
			rec := forgot(t, bundle.router, "198.51.100.200:5000", http.Header{"X-Real-Ip": {randomIP()}})
			if i < limit {
				require.Equal(t, http.StatusAccepted, rec.Code, "request %d", i)
			} else {
				requireForgotLimited(t, rec)
			}
		}
	})

	t.Run("IPv6SlashSixtyFourSharesABucket", func(t *testing.T) {
		t.Parallel()
		bundle := newSQLiteBundle(t, &setupOpts{rules: &rules})
		for i := range 2 * limit {
			rec := forgot(t, bundle.router, fmt.Sprintf("[2001:db8:1:2:%x::%x]:443", rand.IntN(0xffff), i+1), nil)
			if i < limit {
				require.Equal(t, http.StatusAccepted, rec.Code, "request %d", i)
			} else {
				requireForgotLimited(t, rec)
			}
		}
		// The neighbouring /64 is another subscriber.
		rec := forgot(t, bundle.router, "[2001:db8:1:3::1]:443", nil)
		require.Equal(t, http.StatusAccepted, rec.Code)
	})
}

func requireForgotLimited(t testing.TB, rec *httptest.ResponseRecorder) {
	t.Helper()
	requireRateLimited(t, rec, "forgot-password-ip", 3)
}

// TestServer_RegisterHeadersTellNoEmailBudget: register's RateLimit headers describe the
// client's own IP rule only, as forgot-password's do. Three registrations of one address from
// three IPs told the third client `"register-email";r=0`: that the address was tried twice in
// the hour. The email rule's refusal stays a 429 (register says 409 for a taken address
// anyway), with its Retry-After.
func TestServer_RegisterHeadersTellNoEmailBudget(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		// The defaults: 5 per IP per 15 minutes, 3 per email per hour; a second into an hour,
		// so each window's end is known.
		rules := abuse.DefaultRules()
		now := time.Now().Truncate(time.Hour).Add(time.Second)
		bundle := setup(t, newStore(t), &setupOpts{rules: &rules, limiterNow: func() time.Time { return now }})

		email := uniqueEmail("budget")
		for i, want := range []int{http.StatusCreated, http.StatusConflict, http.StatusConflict, http.StatusTooManyRequests} {
			req := jsonRequest(t, "/v1/auth/register", map[string]string{"email": email, "password": "correct horse battery"})
			req.RemoteAddr = fmt.Sprintf("198.51.100.%d:40000", i+1)
			rec := serve(t, bundle.router, req)
			require.Equal(t, want, rec.Code, "registration %d: %s", i+1, rec.Body.String())

			// Each IP's first request: its own budget, 4 of 5 left, whatever the email's.
			require.Equal(t, `"register-ip";q=5;w=900`, rec.Header().Get("RateLimit-Policy"), "registration %d", i+1)
			require.Equal(t, `"register-ip";r=4;t=899`, rec.Header().Get("RateLimit"), "registration %d", i+1)
			for name, values := range rec.Header() {
				for _, value := range values {
					require.NotContains(t, value, "register-email", "%s of registration %d", name, i+1)
				}
			}
			if rec.Code == http.StatusTooManyRequests {
				problem := decodeProblem(t, rec, http.StatusTooManyRequests)
				require.Equal(t, "3599", rec.Header().Get("Retry-After"), "the email rule's window (1 h), not the IP's")
				require.EqualValues(t, 3599, problem["retry_after_seconds"])
			} else {
				require.Empty(t, rec.Header().Get("Retry-After"))
			}
		}
		require.InDelta(t, 1, decisions(t, bundle.registry, "register", "email", "refused"), 0)

		// The IP rule's own refusal: its headers, r=0, and its Retry-After.
		ipRules := generousRules().With(abuse.Rule{Action: abuse.ActionRegister, Scope: abuse.ScopeIP, Limit: 1, Window: 15 * time.Minute})
		bundle = setup(t, newStore(t), &setupOpts{rules: &ipRules})
		require.Equal(t, http.StatusCreated, serve(t, bundle.router, jsonRequest(t, "/v1/auth/register", map[string]string{"email": uniqueEmail("ip"), "password": "correct horse battery"})).Code)
		requireRateLimited(t, serve(t, bundle.router, jsonRequest(t, "/v1/auth/register", map[string]string{"email": uniqueEmail("ip"), "password": "correct horse battery"})), "register-ip", 1)
	})
}
