package api

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/tokens"
)

func TestRouter_RequestID(t *testing.T) {
	t.Parallel()

	bundle := newSQLiteBundle(t, nil)

	t.Run("Generated", func(t *testing.T) {
		t.Parallel()
		rec := serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		id := rec.Header().Get(requestIDHeader)
		require.Len(t, id, 32)
		require.True(t, validRequestID(id))

		rec2 := serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		require.NotEqual(t, id, rec2.Header().Get(requestIDHeader))
	})

	t.Run("HonoursWellFormed", func(t *testing.T) {
		t.Parallel()
		for _, id := range []string{"abc", "req-1.2_3", strings.Repeat("a", 64)} {
			req := httptest.NewRequest(http.MethodGet, "/healthz", nil)
			req.Header.Set(requestIDHeader, id)
			rec := serve(t, bundle.router, req)
			require.Equal(t, id, rec.Header().Get(requestIDHeader))
		}
	})

	t.Run("ReplacesMalformed", func(t *testing.T) {
		t.Parallel()
		for _, id := range []string{strings.Repeat("a", 65), "a b", "x\"y", "id\nforged=1", "é"} {
			req := httptest.NewRequest(http.MethodGet, "/healthz", nil)
			req.Header.Set(requestIDHeader, id)
			rec := serve(t, bundle.router, req)
			got := rec.Header().Get(requestIDHeader)
			require.NotEqual(t, id, got)
			require.Len(t, got, 32)
		}
	})

	t.Run("NeverInBody", func(t *testing.T) {
		t.Parallel()
		req := jsonRequest(t, "/v1/auth/register", `{"email":`)
		req.Header.Set(requestIDHeader, "my-request-id-42")
		rec := serve(t, bundle.router, req)
		decodeProblem(t, rec, http.StatusBadRequest)
		require.Equal(t, "my-request-id-42", rec.Header().Get(requestIDHeader))
		require.NotContains(t, rec.Body.String(), "my-request-id-42")
	})
}

func TestRouter_NotFoundAndMethodNotAllowed(t *testing.T) {
	t.Parallel()

	bundle := newSQLiteBundle(t, nil)

	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		rec := serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/nope", nil))
		decodeProblem(t, rec, http.StatusNotFound)
	})

	t.Run("TrailingSlashIsNotRedirected", func(t *testing.T) {
		t.Parallel()
		req := formRequest("/v1/unsubscribe/?token=x", url.Values{"List-Unsubscribe": {"One-Click"}})
		rec := serve(t, bundle.router, req)
		decodeProblem(t, rec, http.StatusNotFound)
	})

	// Routes match the path as sent (TestRouter_RawPath): a doubled slash is not /healthz.
	t.Run("ExtraSlashesAreKept", func(t *testing.T) {
		t.Parallel()
		rec := serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "//healthz", nil))
		decodeProblem(t, rec, http.StatusNotFound)
	})

	t.Run("MethodNotAllowed", func(t *testing.T) {
		t.Parallel()
		rec := serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/v1/auth/register", nil))
		decodeProblem(t, rec, http.StatusMethodNotAllowed)
		require.Equal(t, "POST", rec.Header().Get("Allow"))
	})
}

func TestRouter_Recover(t *testing.T) {
	t.Parallel()

	bundle := newSQLiteBundle(t, nil)
	bundle.router.GET("/panic", func(*gin.Context) { panic("boom with a secret detail") })

	req := httptest.NewRequest(http.MethodGet, "/panic", nil)
	rec := httptest.NewRecorder()
	bundle.router.ServeHTTP(rec, req) // not in openapi.yaml: a test-only route
	problem := decodeProblem(t, rec, http.StatusInternalServerError)
	require.NotContains(t, problem["detail"], "boom")
	require.NotEmpty(t, rec.Header().Get(requestIDHeader))

	logs := bundle.logs.String()
	require.Contains(t, logs, `"msg":"panic serving request"`)
	require.Contains(t, logs, "boom with a secret detail")
	require.Contains(t, logs, `"status":500`) // the access log saw the 500
}

func TestRouter_InternalErrorIsGeneric(t *testing.T) {
	t.Parallel()

	bundle := newSQLiteBundle(t, nil)
	logs := &syncBuffer{}
	s := &server{logger: slog.New(slog.NewJSONHandler(logs, nil))}
	bundle.router.GET("/fail", s.handle(func(*gin.Context) error {
		return errors.New("pq: password authentication failed for user x")
	}))
	rec := httptest.NewRecorder()
	bundle.router.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/fail", nil)) // a test-only route
	problem := decodeProblem(t, rec, http.StatusInternalServerError)
	require.NotContains(t, problem["detail"], "password")
	require.Contains(t, logs.String(), `"level":"ERROR","msg":"internal error"`)
	require.Contains(t, logs.String(), "password authentication failed")
}

func TestRouter_BodyLimit(t *testing.T) {
	t.Parallel()

	bundle := newSQLiteBundle(t, nil)
	big := `{"email":"a@example.com","password":"correct horse","name":"` + strings.Repeat("x", MaxBodyBytes) + `"}`

	t.Run("JSON", func(t *testing.T) {
		t.Parallel()
		for _, path := range []string{"/v1/auth/register", "/v1/auth/forgot-password", "/v1/auth/resend-verification", "/v1/auth/verify-email", "/v1/auth/reset-password"} {
			rec := serve(t, bundle.router, jsonRequest(t, path, big))
			decodeProblem(t, rec, http.StatusRequestEntityTooLarge)
		}
	})

	t.Run("ChunkedWithoutLength", func(t *testing.T) {
		t.Parallel()
		req := jsonRequest(t, "/v1/auth/register", big)
		req.ContentLength = -1
		rec := serve(t, bundle.router, req)
		decodeProblem(t, rec, http.StatusRequestEntityTooLarge)
	})

	t.Run("FormGetsAPage", func(t *testing.T) {
		t.Parallel()
		req := formRequest("/v1/auth/verify-email", url.Values{"token": {strings.Repeat("a", MaxBodyBytes)}})
		rec := serve(t, bundle.router, req)
		require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code)
		require.Equal(t, "text/html; charset=utf-8", rec.Header().Get("Content-Type"))
	})

	t.Run("Multipart", func(t *testing.T) {
		t.Parallel()
		req := multipartRequest(t, "/v1/unsubscribe?token="+tokens.Unsubscribe(testSecret, 1),
			url.Values{"List-Unsubscribe": {"One-Click"}, "padding": {strings.Repeat("a", MaxBodyBytes)}})
		rec := serve(t, bundle.router, req)
		require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code)
	})

	t.Run("JustUnderTheLimit", func(t *testing.T) {
		t.Parallel()
		// A body of exactly MaxBodyBytes is read (and refused for its content, not its size).
		body := `{"token":"` + strings.Repeat("a", MaxBodyBytes-len(`{"token":""}`)) + `"}`
		require.Len(t, body, MaxBodyBytes)
		rec := serve(t, bundle.router, jsonRequest(t, "/v1/auth/verify-email", body))
		decodeProblem(t, rec, http.StatusBadRequest)
	})
}

func TestRouter_AccessLog(t *testing.T) {
	t.Parallel()

	bundle := newSQLiteBundle(t, nil)
	const (
		token = "secretTokenValue1234567890abcdefghijklmnopq"
		email = "logged-person@example.com"
	)
	insertToken(t, bundle.store, token, insertUser(t, bundle.store, uniqueEmail("logged"), false).ID, db.TokenPurposeVerify, time.Now().Add(time.Hour))

	req := httptest.NewRequest(http.MethodGet, "/v1/auth/verify-email?token="+token, nil)
	req.Header.Set(requestIDHeader, "access-log-test")
	serve(t, bundle.router, req)
	serve(t, bundle.router, formRequest("/v1/auth/reset-password?token="+token, url.Values{"token": {token}, "password": {"hunter22hunter22"}}))
	serve(t, bundle.router, jsonRequest(t, "/v1/auth/register", map[string]string{"email": email, "password": "hunter22hunter22"}))
	serve(t, bundle.router, jsonRequest(t, "/v1/auth/forgot-password", map[string]string{"email": email}))
	serve(t, bundle.router, jsonRequest(t, "/v1/auth/register", map[string]string{"email": email, "password": "hunter22hunter22"})) // 409
	serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/v1/unsubscribe?token="+tokens.Unsubscribe(testSecret, 7), nil))

	logs := bundle.logs.String()
	require.NotContains(t, logs, token)
	require.NotContains(t, logs, "token=")
	require.NotContains(t, logs, tokens.Unsubscribe(testSecret, 7))
	require.NotContains(t, logs, email)
	require.NotContains(t, logs, "hunter22")
	require.NotContains(t, logs, "192.0.2.1") // httptest's peer: no IP in logs either

	var line map[string]any
	for l := range strings.SplitSeq(strings.TrimSpace(logs), "\n") {
		if strings.Contains(l, "access-log-test") {
			require.NoError(t, json.Unmarshal([]byte(l), &line))
		}
	}
	require.NotNil(t, line, "no access log line with the request id")
	require.Equal(t, "HTTP request", line["msg"])
	require.Equal(t, "GET", line["method"])
	require.Equal(t, "/v1/auth/verify-email", line["route"])
	require.EqualValues(t, http.StatusOK, line["status"])
	require.Contains(t, line, "duration")
	require.Positive(t, line["bytes"])
}

func TestRouter_Metrics(t *testing.T) {
	t.Parallel()

	bundle := newSQLiteBundle(t, nil)
	serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/no/such/route?token=abc", nil))
	serve(t, bundle.router, httptest.NewRequest("BREW", "/healthz", nil))

	// The metrics listener's router serves what the public router counted.
	metrics, err := MetricsRouter(&Config{Registerer: bundle.registry, Gatherer: bundle.registry, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	rec := serve(t, metrics, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	body := rec.Body.String()
	require.Contains(t, body, `postguard_http_requests_total{method="GET",route="/healthz",status="200"} 2`)
	require.Contains(t, body, `postguard_http_requests_total{method="GET",route="unmatched",status="404"} 1`)
	require.Contains(t, body, `postguard_http_requests_total{method="OTHER",route="unmatched",status="405"} 1`)
	require.Contains(t, body, `postguard_http_request_duration_seconds_count{method="GET",route="/healthz"} 2`)
	require.NotContains(t, body, "/no/such/route")
	require.NotContains(t, body, "BREW")

	// It serves nothing else; the public router has no /metrics.
	for _, path := range []string{"/healthz", "/v1/auth/register", "/openapi.yaml"} {
		decodeProblem(t, serve(t, metrics, httptest.NewRequest(http.MethodGet, path, nil)), http.StatusNotFound)
	}
	rec = serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	decodeProblem(t, rec, http.StatusNotFound)
	require.NotContains(t, rec.Body.String(), "postguard_")
}
