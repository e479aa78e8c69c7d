package api

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/tokens"
)

// gatedHasher is a PasswordHasher that counts its callers and holds each one until gate is
// closed (or its request ends), then hashes for real.
type gatedHasher struct {
	calls   atomic.Int64
	entered chan struct{} // a value per caller, as it reaches the gate
	gate    chan struct{}
	inner   PasswordHasher
}

func newGatedHasher() *gatedHasher {
	return &gatedHasher{entered: make(chan struct{}, 1000), gate: make(chan struct{}), inner: newPasswordHasher(1)}
}

func (h *gatedHasher) Hash(ctx context.Context, password string) (string, error) {
	h.calls.Add(1)
	h.entered <- struct{}{}
	select {
	case <-h.gate:
		return h.inner.Hash(ctx, password)
	case <-ctx.Done():
		return "", fmt.Errorf("error waiting at the hasher's gate: %w", context.Cause(ctx))
	}
}

// resetRequest is a reset-password JSON request for token from ip.
func resetRequest(t testing.TB, token, ip string) *http.Request {
	t.Helper()
	req := jsonRequest(t, "/v1/auth/reset-password", map[string]string{"token": token, "password": "brand new password"})
	req.RemoteAddr = ip + ":5555"
	return req
}

func TestServer_ResetPasswordLooksTokenUpFirst(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		hasher := newGatedHasher()
		b := setup(t, newStore(t), &setupOpts{configFunc: func(config *Config) {
			config.PasswordHasher = hasher
			// Bounds a request that would wait at the gate (503), so that the test ends soon
			// if made-up tokens did reach the hasher.
			config.RequestTimeout = 3 * time.Second
		}})
		user := insertUser(t, b.store, uniqueEmail("gate"), false)
		genuine, used, expired, verify := tokens.New(), tokens.New(), tokens.New(), tokens.New()
		insertToken(t, b.store, genuine, user.ID, db.TokenPurposeReset, time.Now().Add(time.Hour))
		insertToken(t, b.store, used, user.ID, db.TokenPurposeReset, time.Now().Add(time.Hour))
		_, err := b.store.EmailTokenConsume(t.Context(), tokens.Hash(used), db.TokenPurposeReset, time.Now())
		require.NoError(t, err)
		insertToken(t, b.store, expired, user.ID, db.TokenPurposeReset, time.Now().Add(-time.Second))
		insertToken(t, b.store, verify, user.ID, db.TokenPurposeVerify, time.Now().Add(time.Hour))

		// A genuine reset reaches the hasher, and waits at its gate.
		genuineDone := make(chan *httptest.ResponseRecorder, 1)
		go func() { genuineDone <- serve(t, b.router, resetRequest(t, genuine, "192.0.2.1")) }()
		select {
		case <-hasher.entered:
		case rec := <-genuineDone:
			t.Fatalf("the genuine reset answered %d without hashing: %s", rec.Code, rec.Body.String())
		}

		// Meanwhile a flood of tokens that cannot be used (made up, used, expired, of another
		// purpose), JSON and form: every one is answered 400 without queueing at the hasher.
		unusable := []string{used, expired, verify}
		var n atomic.Int64
		codes := concurrently(t, 60, func() *http.Request {
			i := n.Add(1)
			token := tokens.New()
			if i%4 != 0 {
				token = unusable[i%4-1]
			}
			if i%2 == 0 {
				req := formRequest("/v1/auth/reset-password", url.Values{"token": {token}, "password": {"brand new password"}})
				req.RemoteAddr = "198.51.100.9:5555"
				return req
			}
			return resetRequest(t, token, "198.51.100.9")
		}, b.router)
		for i, code := range codes {
			require.Equal(t, http.StatusBadRequest, code, "request %d", i)
		}
		require.Equal(t, int64(1), hasher.calls.Load(), "an unusable token reached the password hasher")

		close(hasher.gate)
		rec := <-genuineDone
		require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
		ok, err := verifyPassword(getUser(t, b.store, user.ID).PasswordHash, "brand new password")
		require.NoError(t, err)
		require.True(t, ok)
	})
}

func TestServer_ResetPasswordRateLimited(t *testing.T) {
	t.Parallel()

	now := time.Now()
	rules := generousRules().With(abuse.Rule{Action: abuse.ActionResetPassword, Scope: abuse.ScopeIP, Limit: 10, Window: 15 * time.Minute})

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		b := setup(t, newStore(t), &setupOpts{rules: &rules, limiterNow: func() time.Time { return now }})
		user := insertUser(t, b.store, uniqueEmail("limit"), false)
		genuine := tokens.New()
		insertToken(t, b.store, genuine, user.ID, db.TokenPurposeReset, time.Now().Add(time.Hour))
		const ip = "203.0.113.7"

		// Malformed requests spend nothing.
		for _, body := range []string{`{"token":"` + genuine + `","password":"short"}`, `{"token":"not a token!","password":"brand new password"}`, `{"token":`} {
			req := jsonRequest(t, "/v1/auth/reset-password", body)
			req.RemoteAddr = ip + ":5555"
			require.Contains(t, []int{http.StatusBadRequest, http.StatusUnprocessableEntity}, serve(t, b.router, req).Code)
		}
		require.Zero(t, b.consumer.calls.Load())

		// Ten guesses from one IP are answered; the eleventh is refused, even with a good token.
		for i := range 10 {
			rec := serve(t, b.router, resetRequest(t, tokens.New(), ip))
			decodeProblem(t, rec, http.StatusBadRequest)
			require.Equal(t, `"reset-password-ip";q=10;w=900`, rec.Header().Get("RateLimit-Policy"))
			require.Contains(t, rec.Header().Get("RateLimit"), fmt.Sprintf(`"reset-password-ip";r=%d;`, 9-i))
		}
		rec := serve(t, b.router, resetRequest(t, genuine, ip))
		requireRateLimited(t, rec, "reset-password-ip", 10)
		require.Equal(t, user.PasswordHash, getUser(t, b.store, user.ID).PasswordHash)

		// The page's form gets the refusal as a page.
		req := formRequest("/v1/auth/reset-password", url.Values{"token": {genuine}, "password": {"brand new password"}})
		req.RemoteAddr = ip + ":5555"
		rec = serve(t, b.router, req)
		requireHTML(t, rec, http.StatusTooManyRequests, "Too many attempts")
		require.NotEmpty(t, rec.Header().Get("Retry-After"))

		// Another client is not held back.
		rec = serve(t, b.router, resetRequest(t, genuine, "203.0.113.8"))
		require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	})
}
