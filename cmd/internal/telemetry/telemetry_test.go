package telemetry_test

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/api/abuse/abuseotel"
	"github.com/postguard/postguard/cmd/internal/telemetry"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/jobs/mail"
)

func envOf(vars map[string]string) func(string) string {
	return func(name string) string { return vars[name] }
}

func TestParseEnv(t *testing.T) {
	t.Parallel()

	for name, tt := range map[string]struct {
		env      map[string]string
		exporter string
		errs     []string
	}{
		"NothingSet":             {env: nil, exporter: ""},
		"OtherVariablesAlone":    {env: map[string]string{"OTEL_SERVICE_NAME": "auth", "OTEL_TRACES_SAMPLER": "always_on"}, exporter: ""},
		"Console":                {env: map[string]string{"OTEL_TRACES_EXPORTER": "console"}, exporter: telemetry.ExporterConsole},
		"OTLP":                   {env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, exporter: telemetry.ExporterOTLP},
		"None":                   {env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, exporter: ""},
		"EndpointAloneIsOTLP":    {env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, exporter: telemetry.ExporterOTLP},
		"TracesEndpointAlone":    {env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://api.honeycomb.io/v1/traces"}, exporter: telemetry.ExporterOTLP},
		"SDKDisabled":            {env: map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "TRUE"}, exporter: ""},
		"GRPC":                   {env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, exporter: telemetry.ExporterOTLP},
		"RatioSampler":           {env: map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "ParentBased_TraceIDRatio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}, exporter: telemetry.ExporterConsole},
		"UnknownExporter":        {env: map[string]string{"OTEL_TRACES_EXPORTER": "jaeger"}, errs: []string{"invalid OTEL_TRACES_EXPORTER"}},
		"UnknownProtocol":        {env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, errs: []string{"invalid OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"}},
		"EndpointNotAURL":        {env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, errs: []string{"invalid OTEL_EXPORTER_OTLP_ENDPOINT"}},
		"UnknownSampler":         {env: map[string]string{"OTEL_TRACES_SAMPLER": "sometimes"}, errs: []string{"invalid OTEL_TRACES_SAMPLER"}},
		"RatioOutOfRange":        {env: map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"}, errs: []string{"invalid OTEL_TRACES_SAMPLER_ARG"}},
		"SDKDisabledNotABool":    {env: map[string]string{"OTEL_SDK_DISABLED": "yes"}, errs: []string{"invalid OTEL_SDK_DISABLED"}},
		"EveryBadOneNamedAtOnce": {env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin", "OTEL_EXPORTER_OTLP_PROTOCOL": "thrift", "OTEL_TRACES_SAMPLER": "x"}, errs: []string{"invalid OTEL_TRACES_EXPORTER", "invalid OTEL_EXPORTER_OTLP_PROTOCOL", "invalid OTEL_TRACES_SAMPLER"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()

			settings, err := telemetry.ParseEnv(envOf(tt.env))
			if len(tt.errs) > 0 {
				require.Error(t, err)
				for _, want := range tt.errs {
					require.ErrorContains(t, err, want)
				}
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.exporter, settings.Exporter)
		})
	}
}

// TestTelemetry_Off is what "off" means: nothing set, New builds no provider, and every part is
// handed nothing to install (or its own value back), so no exporter runs and no hot path does
// more than it does without tracing.
func TestTelemetry_Off(t *testing.T) {
	t.Parallel()

	for name, tel := range map[string]*telemetry.Telemetry{
		"NilTelemetry": nil,
		"NothingSet":   mustNew(t, &telemetry.Opts{Getenv: envOf(nil)}),
		"None":         mustNew(t, &telemetry.Opts{Getenv: envOf(map[string]string{"OTEL_TRACES_EXPORTER": "none"})}),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()

			require.False(t, tel.Enabled())
			require.Empty(t, tel.Exporter())
			require.Nil(t, tel.TracerProvider())
			require.Nil(t, tel.PgxTracer())
			require.Nil(t, tel.SQLiteTracer())
			require.Nil(t, tel.LimiterTracer())
			require.Nil(t, tel.RiverMiddleware())
			require.Nil(t, tel.HTTPClient())
			sender := mail.NewLogSender(slog.New(slog.DiscardHandler), nil)
			require.Same(t, sender, tel.Sender("log", sender))
			logger := slog.New(slog.DiscardHandler)
			require.Same(t, logger, tel.Logger(logger))
			require.NoError(t, tel.Shutdown(t.Context()))
		})
	}

	t.Run("On", func(t *testing.T) {
		t.Parallel()

		tel := mustNew(t, &telemetry.Opts{Exporter: tracetest.NewInMemoryExporter()})
		require.True(t, tel.Enabled())
		require.NotNil(t, tel.TracerProvider())
		require.NotNil(t, tel.PgxTracer())
		require.NotNil(t, tel.SQLiteTracer())
		require.NotNil(t, tel.LimiterTracer())
		require.Len(t, tel.RiverMiddleware(), 2)
		require.NotNil(t, tel.HTTPClient())
	})
}

func mustNew(t *testing.T, opts *telemetry.Opts) *telemetry.Telemetry {
	t.Helper()
	tel, err := telemetry.New(t.Context(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, tel.Shutdown(context.Background())) })
	return tel
}

func TestQueryName(t *testing.T) {
	t.Parallel()

	for sql, want := range map[string]string{
		"-- name: UserInsert :one\n-- UserInsert creates a user.\nINSERT INTO users (email) VALUES ($1)": "UserInsert",
		"\n-- name: JobInsertFastMany :many\nINSERT INTO river_job":                                      "JobInsertFastMany",
		"SELECT 1":                             "SELECT",
		"-- a comment\nupdate users set x = 1": "UPDATE",
		"-- name: \nSELECT 1":                  "SELECT",
	} {
		require.Equal(t, want, telemetry.QueryName(sql), sql)
	}
}

// TestTelemetry_LimiterTracer is the limiter's span: one per call, in the caller's trace, naming
// the action and what the call found (a refusal the deny cache answered made no round trip), and
// never the subject; an action without rules, whose name is the caller's input, is not named.
func TestTelemetry_LimiterTracer(t *testing.T) {
	t.Parallel()

	exporter := tracetest.NewInMemoryExporter()
	tel := mustNew(t, &telemetry.Opts{Exporter: exporter})
	rules := abuse.Rules{}.
		With(abuse.Rule{Action: abuse.ActionRegister, Scope: abuse.ScopeIP, Limit: 1, Window: time.Hour}).
		With(abuse.Rule{Action: abuse.ActionRegister, Scope: abuse.ScopeEmail, Limit: 5, Window: time.Hour})
	limiter, err := abuse.NewLimiter(dbtest.NewSQLite(t), []byte(strings.Repeat("s", 32)), rules, &abuse.LimiterConfig{Tracer: tel.LimiterTracer()})
	require.NoError(t, err)

	ctx, parent := tel.TracerProvider().Tracer("test").Start(t.Context(), "parent")
	subject := abuse.Subject{IP: netip.MustParseAddr("203.0.113.7"), Email: "ada@example.com"}
	for range 2 { // admitted, then refused by the IP's limit of 1
		_, err := limiter.Allow(ctx, abuse.ActionRegister, subject)
		require.NoError(t, err)
	}
	_, err = limiter.Allow(ctx, abuse.ActionRegister, subject) // refused again, by the deny cache: no round trip
	require.NoError(t, err)
	require.NoError(t, limiter.Clear(ctx, abuse.ActionRegister, abuse.Subject{Email: "ada@example.com"}))
	_, err = limiter.Allow(ctx, "no-such-action", subject)
	require.Error(t, err)
	parent.End()

	stubs := exporter.GetSpans()
	require.Len(t, stubs, 6)
	type got struct {
		name  string
		attrs map[string]string
	}
	var calls []got
	for _, stub := range stubs[:5] {
		require.Equal(t, parent.SpanContext().TraceID(), stub.SpanContext.TraceID())
		require.Equal(t, parent.SpanContext().SpanID(), stub.Parent.SpanID())
		attrs := map[string]string{}
		for _, kv := range stub.Attributes {
			attrs[string(kv.Key)] = kv.Value.String()
		}
		calls = append(calls, got{name: stub.Name, attrs: attrs})
	}
	require.Equal(t, []got{
		{"rate_limit allow", map[string]string{string(abuseotel.AttrAction): "register", string(abuseotel.AttrRoundTrip): "true", string(abuseotel.AttrAllowed): "true", string(abuseotel.AttrScope): "ip"}},
		{"rate_limit allow", map[string]string{string(abuseotel.AttrAction): "register", string(abuseotel.AttrRoundTrip): "true", string(abuseotel.AttrAllowed): "false", string(abuseotel.AttrScope): "ip"}},
		{"rate_limit allow", map[string]string{string(abuseotel.AttrAction): "register", string(abuseotel.AttrRoundTrip): "false", string(abuseotel.AttrAllowed): "false", string(abuseotel.AttrScope): "ip"}},
		{"rate_limit clear", map[string]string{string(abuseotel.AttrAction): "register", string(abuseotel.AttrRoundTrip): "true"}},
		{"rate_limit allow", map[string]string{string(abuseotel.AttrRoundTrip): "false", string(abuseotel.AttrErrorType): "_OTHER"}},
	}, calls)
}
