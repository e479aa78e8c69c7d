package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/postgres"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/tokens"
)

// statementTracer records the SQL of every statement a pgx pool sends: what reaches the server,
// whichever code path sent it.
type statementTracer struct {
	mu  sync.Mutex
	sql []string
}

func (s *statementTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sql = append(s.sql, data.SQL)
	return ctx
}

func (*statementTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// take returns the statements sent since the last take and forgets them.
func (s *statementTracer) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	sql := s.sql
	s.sql = nil
	return sql
}

// firstLines are the statements' sqlc names (their first line, "-- name: X :one"), or their
// first 60 bytes when they have none.
func firstLines(sql []string) []string {
	lines := make([]string, len(sql))
	for i, s := range sql {
		line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
		lines[i] = line[:min(len(line), 60)]
	}
	return lines
}

// TestServer_RoundTrips counts, on the wire, the statements a rate-limited request sends to
// PostgreSQL: a forgot-password or resend-verification for an unknown email is one statement
// (both checks and the user lookup), and so are a spend, a peek, a refund and a clear of the
// limits API, with a trusted device or without; a known email adds only its transaction.
func TestServer_RoundTrips(t *testing.T) {
	t.Parallel()

	ctx := t.Context()
	tracer := &statementTracer{}
	poolConfig, err := pgxpool.ParseConfig(dbtest.PostgresURL(t))
	require.NoError(t, err)
	poolConfig.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, poolConfig)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// One pool for everything, so that every statement of the request is traced.
	engine, err := postgres.NewEngineFromPool(ctx, pool, &postgres.Config{RateLimitPool: pool})
	require.NoError(t, err)
	store, _, err := riverstore.New(engine, riverpgxv5.New(engine.Pool()), &riverstore.Config{Logger: dbtest.Logger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, store.Close()) })

	bundle := setup(t, store, &setupOpts{
		rules:      loginRules(),
		configFunc: func(config *Config) { config.LimitsToken = limitsToken },
	})

	known := uniqueEmail("known")
	register(t, bundle.router, known)
	tracer.take()

	for _, path := range []string{"/v1/auth/forgot-password", "/v1/auth/resend-verification"} {
		t.Run("UnknownEmail"+path, func(t *testing.T) {
			rec := serve(t, bundle.router, jsonRequest(t, path, map[string]string{"email": uniqueEmail("nobody")}))
			require.Equal(t, http.StatusAccepted, rec.Code)
			sql := tracer.take()
			require.Equal(t, []string{"-- name: RateLimitCounterConsumeChainUser :one"}, firstLines(sql),
				"both checks and the user lookup in one statement")
		})
		t.Run("KnownEmail"+path, func(t *testing.T) {
			rec := serve(t, bundle.router, jsonRequest(t, path, map[string]string{"email": known}))
			require.Equal(t, http.StatusAccepted, rec.Code)
			sql := firstLines(tracer.take())
			require.Equal(t, "-- name: RateLimitCounterConsumeChainUser :one", sql[0])
			require.Equal(t, "begin", strings.ToLower(sql[1]), "then the transaction of its job: %q", sql)
			for _, s := range sql[1:] {
				require.NotContains(t, s, "UserGetByEmail", "the user was read with the checks")
			}
		})
	}

	// The pages are in their user's language at no round trip more: a link's page reads the
	// locale with its token (one statement), and a form's answer with the statements its JSON
	// twin sends anyway.
	t.Run("Pages", func(t *testing.T) {
		user := insertUser(t, bundle.store, uniqueEmail("pages"), false)
		token := func(purpose db.TokenPurpose) string {
			raw := tokens.New()
			insertToken(t, bundle.store, raw, user.ID, purpose, time.Now().Add(time.Hour))
			tracer.take()
			return raw
		}
		unsubscribe := "/v1/unsubscribe?token=" + url.QueryEscape(tokens.Unsubscribe(testSecret, user.ID))

		for _, tt := range []struct {
			path string
			want string
		}{
			{"/v1/auth/verify-email?token=" + token(db.TokenPurposeVerify), "-- name: EmailTokenLookup :one"},
			{"/v1/auth/reset-password?token=" + token(db.TokenPurposeReset), "-- name: EmailTokenLookup :one"},
			{unsubscribe, "-- name: UserGetByID :one"},
		} {
			rec := serve(t, bundle.router, httptest.NewRequest(http.MethodGet, tt.path, nil))
			require.Equal(t, http.StatusOK, rec.Code, tt.path)
			require.Equal(t, []string{tt.want}, firstLines(tracer.take()), tt.path)
		}

		// sent is what one request sent, by sqlc name.
		sent := func(req *http.Request, status int) []string {
			rec := serve(t, bundle.router, req)
			require.Equal(t, status, rec.Code, rec.Body.String())
			return firstLines(tracer.take())
		}
		verify, verifyForm := token(db.TokenPurposeVerify), token(db.TokenPurposeVerify)
		require.Equal(t,
			sent(jsonRequest(t, "/v1/auth/verify-email", map[string]string{"token": verify}), http.StatusNoContent),
			sent(formRequest("/v1/auth/verify-email", url.Values{"token": {verifyForm}}), http.StatusOK))
		// (A reset spends the user's other reset tokens: each token is made just before its use.)
		resetJSON := sent(jsonRequest(t, "/v1/auth/reset-password", map[string]string{"token": token(db.TokenPurposeReset), "password": "a new password"}), http.StatusNoContent)
		resetForm := sent(formRequest("/v1/auth/reset-password", url.Values{"token": {token(db.TokenPurposeReset)}, "password": {"a new password"}}), http.StatusOK)
		require.Equal(t, resetJSON, resetForm)
		require.Equal(t, []string{"-- name: UserUnsubscribe :one"},
			sent(formRequest(unsubscribe, url.Values{"List-Unsubscribe": {"One-Click"}}), http.StatusOK))
		require.Equal(t, []string{"-- name: RateLimitCounterConsumeChainUser :one"},
			sent(formRequest("/v1/auth/forgot-password", url.Values{"email": {uniqueEmail("nobody")}}), http.StatusOK))
	})

	t.Run("LimitsSpend", func(t *testing.T) {
		req := limitsRequestOf(t, http.MethodPost, "/v1/limits/login", `{"ip":"203.0.113.9","key":"account-1"}`)
		rec := serve(t, bundle.router, req)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		require.Equal(t, []string{"-- name: RateLimitCounterConsumeChain :one"}, firstLines(tracer.take()),
			"the IP and key checks in one statement")

		req = limitsRequestOf(t, http.MethodPost, "/v1/limits/login?peek=true", `{"ip":"203.0.113.9","key":"account-1"}`)
		rec = serve(t, bundle.router, req)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		require.Equal(t, []string{"-- name: RateLimitCounterGetMany :many"}, firstLines(tracer.take()),
			"the IP and key peeks in one statement")

		req = limitsRequestOf(t, http.MethodPost, "/v1/limits/login/refund", `{"ip":"203.0.113.9","key":"account-1"}`)
		rec = serve(t, bundle.router, req)
		require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
		require.Equal(t, []string{"-- name: RateLimitCounterRefund :one"}, firstLines(tracer.take()),
			"the IP's and the key's refunds in one statement")

		req = limitsRequestOf(t, http.MethodDelete, "/v1/limits/login", `{"ip":"203.0.113.9","key":"account-1"}`)
		rec = serve(t, bundle.router, req)
		require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
		require.Equal(t, []string{"-- name: RateLimitCounterDeleteMany :one"}, firstLines(tracer.take()),
			"the IP's and the key's clears in one statement")
	})

	t.Run("LimitsDevice", func(t *testing.T) {
		req := limitsRequestOf(t, http.MethodPost, "/v1/limits/login/devices", `{"key":"account-2"}`)
		rec := serve(t, bundle.router, req)
		require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
		require.Equal(t, []string{"-- name: RateLimitDeviceRevocationGet :one"}, firstLines(tracer.take()))
		var answer limitsDeviceAnswer
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &answer))
		body := fmt.Sprintf(`{"ip":"203.0.113.9","key":"account-2","device":%q}`, answer.Device)

		for _, tt := range []struct {
			method, path string
			want         int
			statement    string
		}{
			{http.MethodPost, "/v1/limits/login", http.StatusOK, "-- name: RateLimitCounterConsumeChain :one"},
			{http.MethodPost, "/v1/limits/login?peek=true", http.StatusOK, "-- name: RateLimitCounterGetMany :many"},
			{http.MethodPost, "/v1/limits/login/refund", http.StatusNoContent, "-- name: RateLimitCounterRefund :one"},
			{http.MethodDelete, "/v1/limits/login", http.StatusNoContent, "-- name: RateLimitCounterDeleteMany :one"},
		} {
			rec := serve(t, bundle.router, limitsRequestOf(t, tt.method, tt.path, body))
			require.Equal(t, tt.want, rec.Code, rec.Body.String())
			require.Equal(t, []string{tt.statement}, firstLines(tracer.take()),
				"%s %s with a device: its check and the counters in one statement", tt.method, tt.path)
		}
		require.Equal(t, map[string]float64{"trusted": 4, "revoked": 0, "expired": 0, "forged": 0, "malformed": 0}, deviceTokens(t, bundle.registry, "login"))

		rec = serve(t, bundle.router, limitsRequestOf(t, http.MethodDelete, "/v1/limits/login/devices", `{"key":"account-2"}`))
		require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
		require.Equal(t, []string{"-- name: RateLimitDeviceRevocationUpsert :exec"}, firstLines(tracer.take()))
		rec = serve(t, bundle.router, limitsRequestOf(t, http.MethodPost, "/v1/limits/login", body))
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		require.Equal(t, []string{"-- name: RateLimitCounterConsumeChain :one"}, firstLines(tracer.take()), "a revoked device costs the same")
	})
}
