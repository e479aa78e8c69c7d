package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/postguard/postguard/cmd/internal/service"
	"github.com/postguard/postguard/cmd/internal/telemetry"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/jobs/mail/resendfake"
)

// The values a traced flow uses, none of which any span may hold (TestServe_Traces).
const (
	traceEmail       = "Ada.Lovelace+Tr@Lovelace-Trace.Example"
	tracePassword    = "correct horse battery trace"
	traceNewPassword = "a brand new staple password"
	traceClientIP    = "203.0.113.77" // the client, as the trusted proxy forwards it
	traceForgedIP    = "198.51.100.23"
	traceQuery       = "ref=campaign-q7"
	traceAdminToken  = "an-admin-token-of-at-least-32-bytes-for-traces"
	traceAPIKey      = "re_trace_test_key"
	traceSecret      = "trace-test-secret-0123456789abcdef"
	// traceClientParent is a W3C traceparent the client sends: a link of the request's span,
	// never its parent.
	traceClientParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
)

// tracedServer is postguard's whole service built as `serve` builds it, with tracing on into an
// in-memory exporter, serving on a test listener, its River client working.
type tracedServer struct {
	URL   string
	spans *tracetest.InMemoryExporter
	jobs  interface {
		JobList(ctx context.Context, params *river.JobListParams) (*river.JobListResult, error)
		JobRetry(ctx context.Context, id int64) (*rivertype.JobRow, error)
	}
	logs *syncBuffer
}

func startTracedServer(t *testing.T, databaseURL string, fake *resendfake.Server) *tracedServer {
	t.Helper()

	cfg, err := loadConfig(envFunc(map[string]string{
		"DATABASE_URL":            databaseURL,
		"APP_SECRET":              traceSecret,
		"MAILER":                  "resend",
		"RESEND_API_KEY":          traceAPIKey,
		"RESEND_FROM_EMAIL":       "postguard@example.com",
		"RESEND_BASE_URL":         fake.URL(),
		"RESEND_MAX_RPS":          "0",
		"RESEND_WEBHOOK_SECRET":   fake.WebhookSecret(),
		"ADMIN_TOKEN":             traceAdminToken,
		"TRUSTED_PROXIES":         "127.0.0.1",
		"JOB_FETCH_COOLDOWN":      "10ms",
		"JOB_FETCH_POLL_INTERVAL": "50ms",
	}))
	require.NoError(t, err)
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))

	exporter := tracetest.NewInMemoryExporter()
	tel, err := telemetry.New(t.Context(), &telemetry.Opts{Exporter: exporter, Logger: logger})
	require.NoError(t, err)
	svc, err := service.New(t.Context(), cfg, logger, service.RoleServe, &service.Opts{Telemetry: tel})
	require.NoError(t, err)
	server := httptest.NewServer(svc.Handler)
	require.NoError(t, svc.Store.Jobs().Start(context.WithoutCancel(t.Context())))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		server.Close()
		require.NoError(t, svc.Store.Jobs().Stop(ctx))
		require.NoError(t, svc.Close())
		require.NoError(t, tel.Shutdown(ctx))
	})
	return &tracedServer{URL: server.URL, spans: exporter, jobs: svc.Store.Jobs(), logs: logs}
}

// do sends a request from the client behind the trusted proxy (a forged X-Forwarded-For entry
// first), and returns the status and body.
func (s *tracedServer) do(t *testing.T, method, path, contentType, body string, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, s.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	for name, values := range header {
		req.Header[name] = values
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("X-Forwarded-For", traceForgedIP+", "+traceClientIP)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(answer)
}

// waitSpans waits until the exporter holds a span that ok accepts, and returns every span.
func (s *tracedServer) waitSpans(t *testing.T, what string, ok func(tracetest.SpanStub) bool) tracetest.SpanStubs {
	t.Helper()
	var spans tracetest.SpanStubs
	require.Eventually(t, func() bool {
		spans = s.spans.GetSpans()
		return slices.ContainsFunc(spans, ok)
	}, 30*time.Second, 20*time.Millisecond, "no span %s; logs:\n%s", what, s.logs)
	return spans
}

// jobOf waits for a job of kind ("" for any) to be in one of states, and returns it.
func (s *tracedServer) jobOf(t *testing.T, kind string, states ...rivertype.JobState) *rivertype.JobRow {
	t.Helper()
	var job *rivertype.JobRow
	require.Eventually(t, func() bool {
		params := river.NewJobListParams().States(states...)
		if kind != "" {
			params = params.Kinds(kind)
		}
		result, err := s.jobs.JobList(t.Context(), params)
		if err != nil || len(result.Jobs) == 0 {
			return false
		}
		job = result.Jobs[0]
		return true
	}, 30*time.Second, 20*time.Millisecond, "no %s job in %v; logs:\n%s", kind, states, s.logs)
	return job
}

// linkTokenOf is the token of the link to path in the delivery whose key starts with kind.
func linkTokenOf(t *testing.T, fake *resendfake.Server, kind, path string) string {
	t.Helper()
	link := regexp.MustCompile(regexp.QuoteMeta(path) + `\?token=([^\s"<>&]+)`)
	var token string
	require.Eventually(t, func() bool {
		for _, delivery := range fake.Deliveries() {
			if strings.HasPrefix(delivery.IdempotencyKey, kind+":") {
				if m := link.FindStringSubmatch(delivery.Text); m != nil {
					token = m[1]
					return true
				}
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond, "no %s mail with a link to %s", kind, path)
	return token
}

// attrsOf are a span's attributes, as text.
func attrsOf(span tracetest.SpanStub) map[string]string {
	attrs := map[string]string{}
	for _, kv := range span.Attributes {
		attrs[string(kv.Key)] = kv.Value.String()
	}
	return attrs
}

// TestServe_Traces follows a registration through postguard's whole wiring with tracing on, on
// both engines: its trace holds the request's span, the limiter's, the job inserts, every
// attempt of its welcome and verification jobs (the one whose first send failed, retried,
// included) and their provider calls, and the statements; the webhook event that reports the
// verification mail's fate links to that trace, and the admin API names it. Then the rest of the
// flows (verify, forgot, reset, unsubscribe) run, and no span holds any value they used.
func TestServe_Traces(t *testing.T) {
	t.Parallel()

	for name, databaseURL := range map[string]func(t *testing.T) string{
		"SQLite":   func(t *testing.T) string { return "sqlite://" + filepath.Join(t.TempDir(), "postguard.db") },
		"Postgres": func(t *testing.T) string { return dbtest.PostgresURL(t) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()

			fake := resendfake.New(t, &resendfake.Config{APIKey: traceAPIKey})
			fake.Enqueue(resendfake.Response{Status: http.StatusInternalServerError}) // the first send fails
			server := startTracedServer(t, databaseURL(t), fake)

			status, body := server.do(t, http.MethodPost, "/v1/auth/register?"+traceQuery, "application/json",
				fmt.Sprintf(`{"email":%q,"password":%q,"name":"Ada"}`, traceEmail, tracePassword),
				http.Header{"Traceparent": {traceClientParent}})
			require.Equal(t, http.StatusCreated, status, body)
			var registered struct{ ID int64 }
			require.NoError(t, json.Unmarshal([]byte(body), &registered))

			// Whichever job sent first got the 500 and waits for its retry (a minute away):
			// brought forward as an operator would, and sent.
			failed := server.jobOf(t, "", rivertype.JobStateRetryable)
			_, err := server.jobs.JobRetry(t.Context(), failed.ID)
			require.NoError(t, err)
			server.jobOf(t, "welcome_email", rivertype.JobStateCompleted)
			server.jobOf(t, "verification_email", rivertype.JobStateCompleted)
			spans := server.waitSpans(t, "of the retry", func(s tracetest.SpanStub) bool {
				return s.Name == "river.work/"+failed.Kind && attrsOf(s)["attempt"] == "2"
			})

			requireRegistrationTrace(t, spans, failed.Kind, name == "Postgres")
			registration := spanNamed(t, spans, "POST /v1/auth/register").SpanContext.TraceID()

			// The verification mail's delivery event: the webhook's span links to the
			// registration's trace (the event may outrun the worker's record of the acceptance,
			// and is sent again then, as Resend would).
			var verification resendfake.Delivery
			for _, delivery := range fake.Deliveries() {
				if strings.HasPrefix(delivery.IdempotencyKey, "verification_email:") {
					verification = delivery
				}
			}
			require.NotEmpty(t, verification.ID)
			require.Eventually(t, func() bool {
				status, err := fake.SendWebhook(t.Context(), server.URL+"/v1/webhooks/resend", fake.Event(verification, resendfake.EventDelivered, nil))
				if err != nil || status != http.StatusNoContent {
					return false
				}
				return slices.ContainsFunc(server.spans.GetSpans(), func(s tracetest.SpanStub) bool {
					return s.Name == "resend.webhook email.delivered" && attrsOf(s)["postguard.webhook.outcome"] == "applied"
				})
			}, 30*time.Second, 50*time.Millisecond)
			spans = server.spans.GetSpans()
			event := spanWhere(t, spans, func(s tracetest.SpanStub) bool {
				return s.Name == "resend.webhook email.delivered" && attrsOf(s)["postguard.webhook.outcome"] == "applied"
			})
			require.Len(t, event.Links, 1)
			require.Equal(t, registration, event.Links[0].SpanContext.TraceID(), "the event links to its mail's trace")
			require.NotEqual(t, registration, event.SpanContext.TraceID(), "the event has a trace of its own: Resend's request")
			require.Equal(t, "POST /v1/webhooks/resend", spanByID(t, spans, event.Parent.SpanID()).Name)

			// The admin API names each mail's trace.
			status, body = server.do(t, http.MethodGet, "/v1/admin/users/"+strconv.FormatInt(registered.ID, 10)+"/messages", "", "",
				http.Header{"Authorization": {"Bearer " + traceAdminToken}})
			require.Equal(t, http.StatusOK, status, body)
			var messages struct {
				Messages []struct {
					Kind    string  `json:"kind"`
					TraceID *string `json:"trace_id"`
				} `json:"messages"`
			}
			require.NoError(t, json.Unmarshal([]byte(body), &messages))
			require.Len(t, messages.Messages, 2)
			for _, message := range messages.Messages {
				require.NotNil(t, message.TraceID, message.Kind)
				require.Equal(t, registration.String(), *message.TraceID, message.Kind)
			}

			// The rest of the flows, through their pages and their JSON routes.
			verifyToken := linkTokenOf(t, fake, "verification_email", "/v1/auth/verify-email")
			unsubscribeToken := linkTokenOf(t, fake, "welcome_email", "/v1/unsubscribe")
			status, body = server.do(t, http.MethodGet, "/v1/auth/verify-email?token="+verifyToken, "", "", nil)
			require.Equal(t, http.StatusOK, status, body)
			status, body = server.do(t, http.MethodPost, "/v1/auth/verify-email", "application/x-www-form-urlencoded", "token="+verifyToken, nil)
			require.Equal(t, http.StatusOK, status, body)
			status, body = server.do(t, http.MethodGet, "/v1/unsubscribe?token="+unsubscribeToken, "", "", nil)
			require.Equal(t, http.StatusOK, status, body)
			status, body = server.do(t, http.MethodPost, "/v1/auth/forgot-password?"+traceQuery, "application/json", fmt.Sprintf(`{"email":%q}`, strings.ToUpper(traceEmail)), nil)
			require.Equal(t, http.StatusAccepted, status, body)
			resetToken := linkTokenOf(t, fake, "password_reset_email", "/v1/auth/reset-password")
			status, body = server.do(t, http.MethodGet, "/v1/auth/reset-password?token="+resetToken, "", "", nil)
			require.Equal(t, http.StatusOK, status, body)
			status, body = server.do(t, http.MethodPost, "/v1/auth/reset-password", "application/json",
				fmt.Sprintf(`{"token":%q,"password":%q}`, resetToken, traceNewPassword), nil)
			require.Equal(t, http.StatusNoContent, status, body)
			status, body = server.do(t, http.MethodPost, "/v1/auth/resend-verification", "application/json", fmt.Sprintf(`{"email":%q}`, traceEmail), nil)
			require.Equal(t, http.StatusAccepted, status, body)

			spans = server.waitSpans(t, "of the reset mail's attempt", func(s tracetest.SpanStub) bool {
				return s.Name == "river.work/password_reset_email"
			})
			for _, route := range []string{"GET /v1/auth/verify-email", "POST /v1/auth/verify-email", "GET /v1/unsubscribe",
				"POST /v1/auth/forgot-password", "GET /v1/auth/reset-password", "POST /v1/auth/reset-password"} {
				spanNamed(t, spans, route)
			}
			requireNoSecretInSpans(t, spans, map[string]string{
				"the address as typed":       traceEmail,
				"the address in lower case":  strings.ToLower(traceEmail),
				"the address percent-coded":  url.QueryEscape(traceEmail),
				"the address's local part":   "lovelace+tr",
				"the address's domain":       "lovelace-trace.example",
				"the password":               tracePassword,
				"the new password":           traceNewPassword,
				"the verification token":     verifyToken,
				"the reset token":            resetToken,
				"the unsubscribe token":      unsubscribeToken,
				"the client's IP":            traceClientIP,
				"the forwarded entry":        traceForgedIP,
				"a query string":             traceQuery,
				"a token's query":            "token=",
				"the admin token":            traceAdminToken,
				"the Resend API key":         traceAPIKey,
				"the webhook signing secret": strings.TrimPrefix(fake.WebhookSecret(), "whsec_"),
				"APP_SECRET":                 traceSecret,
			})
		})
	}
}

// requireRegistrationTrace checks the registration's trace: the request's span first (a root,
// linked to the client's traceparent), the limiter's span and the two inserts its children, and
// every attempt of the welcome and verification jobs in the same trace, children of their
// inserts, each with its provider call; retried (the kind whose first send failed) has two.
func requireRegistrationTrace(t *testing.T, spans tracetest.SpanStubs, retried string, postgres bool) {
	t.Helper()

	request := spanNamed(t, spans, "POST /v1/auth/register")
	traceID := request.SpanContext.TraceID()
	require.False(t, request.Parent.IsValid(), "the request's span is a root: the client chooses no parent")
	require.NotEqual(t, "0af7651916cd43dd8448eb211c80319c", traceID.String())
	require.Len(t, request.Links, 1)
	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", request.Links[0].SpanContext.TraceID().String())
	require.Equal(t, map[string]string{
		"http.request.method":       "POST",
		"http.route":                "/v1/auth/register",
		"http.response.status_code": "201",
	}, attrsOf(request))

	inTrace := func(s tracetest.SpanStub) bool { return s.SpanContext.TraceID() == traceID }
	childOf := func(parent tracetest.SpanStub) func(tracetest.SpanStub) bool {
		return func(s tracetest.SpanStub) bool { return inTrace(s) && s.Parent.SpanID() == parent.SpanContext.SpanID() }
	}
	limiter := spanWhere(t, spans, func(s tracetest.SpanStub) bool { return childOf(request)(s) && s.Name == "rate_limit allow" })
	require.Equal(t, "register", attrsOf(limiter)["postguard.rate_limit.action"])
	require.Equal(t, "true", attrsOf(limiter)["postguard.rate_limit.round_trip"])
	spanWhere(t, spans, func(s tracetest.SpanStub) bool { return childOf(request)(s) && s.Name == "UserInsert" })

	var inserts []tracetest.SpanStub
	for _, s := range spans {
		if childOf(request)(s) && s.Name == "river.insert_many" {
			inserts = append(inserts, s)
		}
	}
	require.Len(t, inserts, 2, "a welcome and a verification job")
	if postgres { // River's own statements, on the engine's traced pool
		spanWhere(t, spans, func(s tracetest.SpanStub) bool { return childOf(inserts[0])(s) && s.Name == "JobInsertFastMany" })
	}

	for _, kind := range []string{"welcome_email", "verification_email"} {
		var attempts []string
		for _, work := range spans {
			if work.Name != "river.work/"+kind {
				continue
			}
			require.True(t, inTrace(work), "%s attempt %s is in the registration's trace", kind, attrsOf(work)["attempt"])
			require.True(t, slices.ContainsFunc(inserts, func(insert tracetest.SpanStub) bool {
				return insert.SpanContext.SpanID() == work.Parent.SpanID()
			}), "%s's attempt is a child of its insert", kind)
			attempts = append(attempts, attrsOf(work)["attempt"])

			send := spanWhere(t, spans, func(s tracetest.SpanStub) bool { return childOf(work)(s) && s.Name == "mail.send resend" })
			require.Equal(t, kind, attrsOf(send)["postguard.email.kind"])
			post := spanWhere(t, spans, func(s tracetest.SpanStub) bool { return childOf(send)(s) && s.Name == "HTTP POST" })
			require.Equal(t, trace.SpanKindClient, post.SpanKind)
			if kind == retried && attrsOf(work)["attempt"] == "1" {
				require.Equal(t, "500", attrsOf(send)["error.type"])
				require.Equal(t, "500", attrsOf(post)["http.response.status_code"])
				require.Equal(t, "error", attrsOf(work)["status"])
			} else {
				require.NotEmpty(t, attrsOf(send)["postguard.email.provider_id"])
				require.Equal(t, "ok", attrsOf(work)["status"])
			}
			spanWhere(t, spans, func(s tracetest.SpanStub) bool { return childOf(work)(s) && s.Name == "EmailMessageGetByJob" })
		}
		slices.Sort(attempts)
		want := []string{"1"}
		if kind == retried {
			want = []string{"1", "2"}
		}
		require.Equal(t, want, attempts, kind)
	}
}

func spanWhere(t *testing.T, spans tracetest.SpanStubs, ok func(tracetest.SpanStub) bool) tracetest.SpanStub {
	t.Helper()
	i := slices.IndexFunc(spans, ok)
	require.GreaterOrEqual(t, i, 0, "no such span among %s", spanNames(spans))
	return spans[i]
}

func spanNamed(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	return spanWhere(t, spans, func(s tracetest.SpanStub) bool { return s.Name == name })
}

func spanByID(t *testing.T, spans tracetest.SpanStubs, id trace.SpanID) tracetest.SpanStub {
	t.Helper()
	return spanWhere(t, spans, func(s tracetest.SpanStub) bool { return s.SpanContext.SpanID() == id })
}

func spanNames(spans tracetest.SpanStubs) []string {
	names := make([]string, len(spans))
	for i, s := range spans {
		names[i] = s.Name
	}
	return names
}

// requireNoSecretInSpans scans every span whole (name, attributes, events and theirs, links and
// theirs, status, resource, scope), as JSON, for each of secrets (case-insensitively), and the
// request spans and the spans below them that are not provider calls for the TCP peer's address
// too (the provider's own address is the fake's, on the same loopback).
func requireNoSecretInSpans(t *testing.T, spans tracetest.SpanStubs, secrets map[string]string) {
	t.Helper()
	require.NotEmpty(t, spans)
	for _, span := range spans {
		encoded, err := json.Marshal(span)
		require.NoError(t, err)
		text := strings.ToLower(string(encoded))
		for what, secret := range secrets {
			require.NotContains(t, text, strings.ToLower(secret), "span %q holds %s", span.Name, what)
		}
		if span.InstrumentationScope.Name != "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp" {
			require.NotContains(t, text, "127.0.0.1", "span %q holds the client's TCP address", span.Name)
		}
	}
}

// TestService_TracingOff is tracing off through the wiring: with no tracing (nil, or nothing set)
// River's config gets no middleware but riverlog's, and the router none of tracing's; with it,
// River's gets tracing's two first.
func TestService_TracingOff(t *testing.T) {
	t.Parallel()

	build := func(t *testing.T, tel *telemetry.Telemetry) (middleware int, handlers []string) {
		t.Helper()
		cfg, err := loadConfig(envFunc(map[string]string{"DATABASE_URL": "sqlite://" + filepath.Join(t.TempDir(), "postguard.db"), "MAILER": "log"}))
		require.NoError(t, err)
		svc, err := service.New(t.Context(), cfg, slog.New(slog.DiscardHandler), service.RoleServe, &service.Opts{
			Telemetry:       tel,
			RiverConfigFunc: func(config *river.Config) { middleware = len(config.Middleware) },
		})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, svc.Close()) })
		engine, ok := svc.Handler.(*gin.Engine)
		require.True(t, ok)
		for _, handler := range engine.Handlers {
			handlers = append(handlers, runtime.FuncForPC(reflect.ValueOf(handler).Pointer()).Name())
		}
		return middleware, handlers
	}
	off, err := telemetry.New(t.Context(), &telemetry.Opts{Getenv: func(string) string { return "" }})
	require.NoError(t, err)
	for name, tel := range map[string]*telemetry.Telemetry{"Nil": nil, "NothingSet": off} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()

			middleware, handlers := build(t, tel)
			require.Equal(t, 1, middleware, "riverlog's alone")
			require.False(t, slices.ContainsFunc(handlers, func(h string) bool { return strings.Contains(h, "traceRequest") }), handlers)
		})
	}
	t.Run("On", func(t *testing.T) {
		t.Parallel()

		on, err := telemetry.New(t.Context(), &telemetry.Opts{Exporter: tracetest.NewInMemoryExporter()})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, on.Shutdown(context.Background())) })
		middleware, handlers := build(t, on)
		require.Equal(t, 3, middleware)
		require.Contains(t, handlers[0], "traceRequest")
	})
}
