package api

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/dbtest"
)

const (
	riverUIUser     = "admin"
	riverUIPassword = "s3cret pass"
)

// riverUIStub stands in for River UI's handler and counts the requests that reach it.
type riverUIStub struct{ reached atomic.Int64 }

func (s *riverUIStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.reached.Add(1)
	w.Header().Set("Content-Type", "text/html")
	_, _ = io.WriteString(w, "river ui stub at "+r.URL.Path)
}

// withRiverUI mounts stub as River UI with the test credentials.
func withRiverUI(stub http.Handler) func(config *Config) {
	return func(config *Config) {
		config.RiverUI, config.RiverUIUsername, config.RiverUIPassword = stub, riverUIUser, riverUIPassword
	}
}

// riverUIRequest is a request to River UI with the right credentials, from peer.
func riverUIRequest(method, target, peer string, header http.Header) *http.Request {
	req := httptest.NewRequest(method, target, strings.NewReader(`{"ids":["1"]}`))
	req.RemoteAddr = peer
	req.SetBasicAuth(riverUIUser, riverUIPassword)
	for k, vs := range header {
		req.Header[k] = vs
	}
	return req
}

// requireNoFraming checks the answer forbids being framed.
func requireNoFraming(t testing.TB, rec *httptest.ResponseRecorder) {
	t.Helper()
	require.Equal(t, "DENY", rec.Header().Get("X-Frame-Options"))
	require.Contains(t, rec.Header().Get("Content-Security-Policy"), "frame-ancestors 'none'")
}

func TestServer_RiverUICrossSite(t *testing.T) {
	t.Parallel()

	stub := &riverUIStub{}
	bundle := newSQLiteBundle(t, &setupOpts{
		trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		configFunc: func(config *Config) {
			withRiverUI(stub)(config)
			config.AppURL = "https://ops.example.com/base"
		},
	})

	// What <form enctype="text/plain" action="https://host/riverui/api/jobs/retry"> on another
	// site sends, the browser adding the basic-auth credentials it cached.
	browserForm := http.Header{
		"Content-Type":   {"text/plain"},
		"Origin":         {"https://evil.example"},
		"Sec-Fetch-Site": {"cross-site"},
		"Sec-Fetch-Mode": {"navigate"},
	}

	for _, tt := range []struct {
		name   string
		method string
		peer   string
		header http.Header
	}{
		{name: "BrowserFormFromAnotherSite", method: http.MethodPost, header: browserForm},
		{name: "SameSite", method: http.MethodPost, header: http.Header{"Sec-Fetch-Site": {"same-site"}}},
		{name: "UserTypedNone", method: http.MethodPost, header: http.Header{"Sec-Fetch-Site": {"none"}}},
		{name: "OriginOnly", method: http.MethodDelete, header: http.Header{"Origin": {"https://evil.example"}}},
		{name: "NullOrigin", method: http.MethodPost, header: http.Header{"Origin": {"null"}}},
		{name: "OtherPort", method: http.MethodPut, header: http.Header{"Origin": {"http://example.com:8081"}}},
		{name: "HTTPSOriginOnPlainHTTP", method: http.MethodPost, header: http.Header{"Origin": {"https://example.com"}}},
		{name: "ForwardedProtoFromUntrustedPeer", method: http.MethodPost, peer: "203.0.113.5:1234",
			header: http.Header{"Origin": {"https://example.com"}, "X-Forwarded-Proto": {"https"}}},
		{name: "SameOriginAndForeignOrigin", method: http.MethodPost,
			header: http.Header{"Sec-Fetch-Site": {"same-origin"}, "Origin": {"https://evil.example"}}},
		{name: "OPTIONS", method: http.MethodOptions, header: http.Header{"Origin": {"https://evil.example"}}},
	} {
		t.Run("Refuses"+tt.name, func(t *testing.T) {
			before := stub.reached.Load()
			peeksBefore, callsBefore := bundle.consumer.peeks.Load(), bundle.consumer.calls.Load()
			req := riverUIRequest(tt.method, "/riverui/api/jobs/retry", cmpOr(tt.peer, "192.0.2.1:1234"), tt.header)
			rec := serve(t, bundle.router, req)
			decodeProblem(t, rec, http.StatusForbidden)
			requireNoFraming(t, rec)
			require.Equal(t, before, stub.reached.Load(), "River UI saw the request")
			require.Equal(t, peeksBefore, bundle.consumer.peeks.Load(), "basic auth saw the request")
			require.Equal(t, callsBefore, bundle.consumer.calls.Load(), "basic auth saw the request")
		})
	}

	for _, tt := range []struct {
		name   string
		method string
		peer   string
		tls    bool
		host   string
		header http.Header
	}{
		{name: "SameOrigin", method: http.MethodPost, header: http.Header{"Content-Type": {"text/plain"}, "Origin": {"http://example.com"}, "Sec-Fetch-Site": {"same-origin"}}},
		{name: "OriginWithDefaultPort", method: http.MethodPost, header: http.Header{"Origin": {"http://EXAMPLE.com:80"}}},
		{name: "NotABrowser", method: http.MethodPost},
		{name: "GetFromAnotherSite", method: http.MethodGet, header: http.Header{"Origin": {"https://evil.example"}, "Sec-Fetch-Site": {"cross-site"}}},
		{name: "TLS", method: http.MethodPost, tls: true, host: "ops.internal:8443", header: http.Header{"Origin": {"https://ops.internal:8443"}, "Sec-Fetch-Site": {"same-origin"}}},
		{name: "TLSTerminatedByTrustedProxy", method: http.MethodPost, peer: "10.0.0.2:1234", host: "ops.internal",
			header: http.Header{"Origin": {"https://ops.internal"}, "X-Forwarded-Proto": {"https"}}},
		{name: "AppURLBehindHostRewrite", method: http.MethodPost, host: "upstream:8080", header: http.Header{"Origin": {"https://ops.example.com"}}},
	} {
		t.Run("Lets"+tt.name, func(t *testing.T) {
			before := stub.reached.Load()
			req := riverUIRequest(tt.method, "/riverui/api/jobs/retry", cmpOr(tt.peer, "192.0.2.1:1234"), tt.header)
			if tt.tls {
				req.TLS = &tls.ConnectionState{}
			}
			if tt.host != "" {
				req.Host = tt.host
			}
			rec := serve(t, bundle.router, req)
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			require.Equal(t, before+1, stub.reached.Load())
			requireNoFraming(t, rec)
		})
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func TestServer_NoFraming(t *testing.T) {
	t.Parallel()

	stub := &riverUIStub{}
	bundle := newSQLiteBundle(t, &setupOpts{configFunc: withRiverUI(stub)})

	// River UI's answers, whatever they are.
	ok := httptest.NewRequest(http.MethodGet, "/riverui/", nil)
	ok.SetBasicAuth(riverUIUser, riverUIPassword)
	for name, req := range map[string]*http.Request{
		"UI":           ok,
		"Unauthorized": httptest.NewRequest(http.MethodGet, "/riverui/", nil),
		"Redirect":     httptest.NewRequest(http.MethodGet, "/riverui", nil),
	} {
		rec := serve(t, bundle.router, req)
		require.NotEqual(t, http.StatusNotFound, rec.Code, name)
		requireNoFraming(t, rec)
	}

	// The service's own pages, error pages included.
	user := insertUser(t, bundle.store, uniqueEmail("frame"), false)
	token := "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	insertToken(t, bundle.store, token, user.ID, db.TokenPurposeVerify, time.Now().Add(time.Hour))
	for name, req := range map[string]*http.Request{
		"VerifyPage":        httptest.NewRequest(http.MethodGet, "/v1/auth/verify-email?token="+token, nil),
		"ResetPage":         httptest.NewRequest(http.MethodGet, "/v1/auth/reset-password?token="+token, nil),
		"BadLinkPage":       httptest.NewRequest(http.MethodGet, "/v1/auth/verify-email?token=%3C", nil),
		"FormErrorPage":     formRequest("/v1/auth/reset-password", url.Values{"token": {token}, "password": {"short"}}),
		"FormTokenError":    formRequest("/v1/auth/reset-password", url.Values{"token": {"nope"}, "password": {"brand new password"}}),
		"UnsubscribeError":  formRequest("/v1/unsubscribe?token=forged.x", url.Values{"List-Unsubscribe": {"One-Click"}}),
		"VerifiedPage":      formRequest("/v1/auth/verify-email", url.Values{"token": {token}}),
		"TooLargeFormError": formRequest("/v1/auth/verify-email", url.Values{"token": {strings.Repeat("a", MaxBodyBytes)}}),
	} {
		rec := serve(t, bundle.router, req)
		require.Equal(t, "text/html; charset=utf-8", rec.Header().Get("Content-Type"), name)
		requireNoFraming(t, rec)
	}
}

func TestServer_RiverUILoginLimit(t *testing.T) {
	t.Parallel()

	clock := time.Now()
	var offset atomic.Int64
	now := func() time.Time { return clock.Add(time.Duration(offset.Load())) }
	rules := generousRules().With(abuse.Rule{Action: abuse.ActionRiverUILogin, Scope: abuse.ScopeIP, Limit: 10, Window: 15 * time.Minute})

	get := func(t *testing.T, router http.Handler, peer, user, password string, auth bool) *httptest.ResponseRecorder {
		t.Helper()
		req := httptest.NewRequest(http.MethodGet, "/riverui/", nil)
		req.RemoteAddr = peer
		if auth {
			req.SetBasicAuth(user, password)
		}
		return serve(t, router, req)
	}

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		stub := &riverUIStub{}
		bundle := setup(t, newStore(t), &setupOpts{rules: &rules, limiterNow: now, configFunc: withRiverUI(stub)})
		const guesser, colleague = "198.51.100.20:4000", "198.51.100.21:4000"

		// Requests without credentials (a browser's first, before it prompts) are no guesses.
		for range 15 {
			require.Equal(t, http.StatusUnauthorized, get(t, bundle.router, guesser, "", "", false).Code)
		}
		// Ten wrong guesses are answered 401...
		for i := range 10 {
			rec := get(t, bundle.router, guesser, riverUIUser, "guess "+itoa(int64(i)), true)
			decodeProblem(t, rec, http.StatusUnauthorized)
		}
		// ...then every request from that IP is 429, the right password included: a 200 among
		// the refusals would tell the guesser the password.
		before := stub.reached.Load()
		for _, password := range []string{"guess 11", riverUIPassword} {
			rec := get(t, bundle.router, guesser, riverUIUser, password, true)
			problem := decodeProblem(t, rec, http.StatusTooManyRequests)
			require.NotEmpty(t, rec.Header().Get("Retry-After"))
			require.EqualValues(t, rec.Header().Get("Retry-After"), itoa(int64(problem["retry_after_seconds"].(float64))))
			require.Empty(t, rec.Header().Get("WWW-Authenticate"))
			requireNoFraming(t, rec)
		}
		require.Equal(t, before, stub.reached.Load())

		// Another IP is not locked out.
		require.Equal(t, http.StatusOK, get(t, bundle.router, colleague, riverUIUser, riverUIPassword, true).Code)

		// The window ends: the right password works again from the guesser's IP.
		offset.Store(int64(15 * time.Minute))
		require.Equal(t, http.StatusOK, get(t, bundle.router, guesser, riverUIUser, riverUIPassword, true).Code)
		offset.Store(0)
	})

	t.Run("ConcurrentGuesses", func(t *testing.T) {
		t.Parallel()

		// Fifty guesses at once from one IP: ten are compared with the password (401), the rest
		// refused unseen (429). Every compared wrong guess spends the counter once, so the
		// counter statements tell how many guesses were compared.
		bundle := setup(t, dbtest.NewPostgres(t), &setupOpts{rules: &rules, configFunc: withRiverUI(&riverUIStub{})})
		var n atomic.Int64
		codes := concurrently(t, 50, func() *http.Request {
			req := httptest.NewRequest(http.MethodGet, "/riverui/", nil)
			req.RemoteAddr = "198.51.100.40:4000"
			req.SetBasicAuth(riverUIUser, "guess "+itoa(n.Add(1)))
			return req
		}, bundle.router)
		counts := map[int]int{}
		for _, code := range codes {
			counts[code]++
		}
		require.Equal(t, map[int]int{http.StatusUnauthorized: 10, http.StatusTooManyRequests: 40}, counts)
		require.Equal(t, int64(10), bundle.consumer.calls.Load(), "guesses compared beyond the limit")
	})

	t.Run("AcrossProcesses", func(t *testing.T) {
		t.Parallel()

		// Two API processes on one PostgreSQL: five failures on each lock the IP out of both.
		databaseURL := dbtest.PostgresURL(t)
		var routers []http.Handler
		for range 2 {
			store := dbtest.OpenPostgres(t, databaseURL)
			routers = append(routers, setup(t, store, &setupOpts{rules: &rules, configFunc: withRiverUI(&riverUIStub{})}).router)
		}
		const guesser = "198.51.100.30:4000"
		for i := range 10 {
			decodeProblem(t, get(t, routers[i%2], guesser, riverUIUser, "guess", true), http.StatusUnauthorized)
		}
		for _, router := range routers {
			decodeProblem(t, get(t, router, guesser, riverUIUser, riverUIPassword, true), http.StatusTooManyRequests)
		}
	})
}
