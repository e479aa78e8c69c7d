package telemetry

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/riverqueue/rivercontrib/otelriver"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/api/abuse/abuseotel"
	"github.com/postguard/postguard/db/sqlite"
	"github.com/postguard/postguard/jobs/mail"
)

// scopeName is the instrumentation scope of the spans this package starts itself (the SQLite
// statements, the provider calls).
const scopeName = "github.com/postguard/postguard/cmd/internal/telemetry"

// Attributes of the provider calls' spans. None carries the message: no recipient, subject,
// body, token or header.
const (
	// AttrProvider is the provider's name in MAILER (resend, smtp, log).
	AttrProvider = attribute.Key("postguard.email.provider")
	// AttrKind is the mail's job kind (welcome_email...).
	AttrKind = attribute.Key("postguard.email.kind")
	// AttrProviderID is the provider's id of the mail it accepted (Resend's email id, the SMTP
	// Message-ID, a hash of the idempotency key).
	AttrProviderID = attribute.Key("postguard.email.provider_id")
)

// PgxTracer is otelpgx's tracer for postgres.Config.Tracer: a span per statement while a span is
// recording (a request's, a job's: River's background polls make none), named by sqlc's name of
// the statement ("UserInsert", River's "JobInsertFastMany"), with the statement's SQL and never
// its arguments, and no connection details (the server's address, the user). nil when tracing
// is off.
func (t *Telemetry) PgxTracer() pgx.QueryTracer {
	if !t.Enabled() {
		return nil
	}
	return otelpgx.NewTracer(
		otelpgx.WithTracerProvider(t.provider),
		otelpgx.WithMeterProvider(noop.NewMeterProvider()),
		otelpgx.WithSpanNameFunc(QueryName),
		otelpgx.WithDisableConnectionDetailsInAttributes(),
		otelpgx.WithDisableAcquireTracer(),
	)
}

// SQLiteTracer is sqlite.Config.Tracer: the same spans as PgxTracer's for the embedded engine's
// statements. nil when tracing is off.
func (t *Telemetry) SQLiteTracer() sqlite.QueryTracer {
	if !t.Enabled() {
		return nil
	}
	return &sqliteTracer{tracer: t.provider.Tracer(scopeName)}
}

// LimiterTracer is abuse.LimiterConfig.Tracer: a span per round trip of the limiter. nil when
// tracing is off.
func (t *Telemetry) LimiterTracer() abuse.Tracer {
	if !t.Enabled() {
		return nil
	}
	return abuseotel.NewTracer(t.provider)
}

// RiverMiddleware is what River's config gets, before its own middleware: otelriver's, a span
// per insert (a child of the inserting request's span, whose W3C traceparent it writes into each
// job's metadata) and per attempt ("river.work/welcome_email"), and, around it, the attempt's
// parent taken back from that metadata, so that every attempt of a job, its retries included,
// is in the trace of the request that inserted it. nil when tracing is off.
func (t *Telemetry) RiverMiddleware() []rivertype.Middleware {
	if !t.Enabled() {
		return nil
	}
	return []rivertype.Middleware{
		&jobTraceParent{},
		otelriver.NewMiddleware(&otelriver.MiddlewareConfig{
			EnableTracePropagation:      true,
			EnableWorkSpanJobKindSuffix: true,
			MeterProvider:               noop.NewMeterProvider(),
			TracerProvider:              t.provider,
		}),
	}
}

// HTTPClient is the HTTP client of the Resend sender (mail.ResendConfig.HTTPClient): otelhttp's
// transport, a client span per request ("HTTP POST", with the URL, which holds no message data,
// and the status). It sends no trace context to the provider. nil when tracing is off.
func (t *Telemetry) HTTPClient() *http.Client {
	if !t.Enabled() {
		return nil
	}
	return &http.Client{Transport: otelhttp.NewTransport(http.DefaultTransport,
		otelhttp.WithTracerProvider(t.provider),
		otelhttp.WithMeterProvider(noop.NewMeterProvider()),
		otelhttp.WithPropagators(propagation.NewCompositeTextMapPropagator()),
	)}
}

// Sender is sender with a span around each send ("mail.send smtp"): the provider call of an
// attempt, with the provider's name, the job's kind, the id the provider gave the mail and, on
// a failure, its class (error.type: the provider's error name, or the SMTP step and reply
// code), never the message. sender itself when tracing is off.
func (t *Telemetry) Sender(provider string, sender mail.Sender) mail.Sender {
	if !t.Enabled() {
		return sender
	}
	return &tracedSender{provider: provider, sender: sender, tracer: t.provider.Tracer(scopeName)}
}

// Logger is logger with the trace_id and span_id of the span its context holds on every line
// logged with one (the *Context methods), so that a line leads to its trace and back. logger
// itself when tracing is off.
func (t *Telemetry) Logger(logger *slog.Logger) *slog.Logger {
	if !t.Enabled() {
		return logger
	}
	return slog.New(&traceHandler{Handler: logger.Handler()})
}

// QueryName is the span name of a statement: the name sqlc gave it ("-- name: UserInsert :one"
// first), else its first keyword ("SELECT"), as otelpgx names one.
func QueryName(sql string) string {
	if rest, ok := strings.CutPrefix(strings.TrimSpace(sql), "-- name: "); ok {
		if name, _, _ := strings.Cut(rest, " "); name != "" && !strings.ContainsAny(name, "\n\r\t") {
			return name
		}
	}
	return otelpgx.SQLOperationName(context.Background(), sql)
}

// sqliteTracer is sqlite.QueryTracer on OpenTelemetry.
type sqliteTracer struct {
	tracer trace.Tracer
}

func (t *sqliteTracer) TraceQueryStart(ctx context.Context, sql string) context.Context {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ctx // nothing traces this statement's caller: no span of its own either
	}
	name := QueryName(sql)
	ctx, _ = t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		semconv.DBSystemNameSQLite,
		semconv.DBQueryText(sql),
		semconv.DBOperationName(name),
	))
	return ctx
}

func (t *sqliteTracer) TraceQueryEnd(ctx context.Context, err error) {
	span := trace.SpanFromContext(ctx)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// jobTraceParent is the River worker middleware that makes an attempt a child of its job's
// insert: it reads the W3C traceparent (and tracestate) otelriver's insert middleware left in the
// job's metadata into the attempt's context as its remote parent, before otelriver starts the
// attempt's span. otelriver alone starts each attempt in a trace of its own, linked to the
// insert; here the attempts are in the insert's trace, and the link stays.
type jobTraceParent struct {
	river.MiddlewareDefaults
}

var _ rivertype.WorkerMiddleware = (*jobTraceParent)(nil)

func (*jobTraceParent) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	var meta struct {
		TraceParent string `json:"traceparent"`
		TraceState  string `json:"tracestate"`
	}
	if json.Unmarshal(job.Metadata, &meta) == nil && meta.TraceParent != "" {
		carrier := propagation.MapCarrier{"traceparent": meta.TraceParent}
		if meta.TraceState != "" {
			carrier["tracestate"] = meta.TraceState
		}
		ctx = propagation.TraceContext{}.Extract(ctx, carrier)
	}
	return doInner(ctx)
}

// tracedSender is a mail.Sender with a span around each send.
type tracedSender struct {
	provider string
	sender   mail.Sender
	tracer   trace.Tracer
}

func (s *tracedSender) Send(ctx context.Context, msg *mail.Message) (string, error) {
	ctx, span := s.tracer.Start(ctx, "mail.send "+s.provider, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(AttrProvider.String(s.provider), AttrKind.String(msg.Kind)))
	defer span.End()
	id, err := s.sender.Send(ctx, msg)
	if err != nil {
		span.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
		span.SetStatus(codes.Error, "")
		return id, err
	}
	span.SetAttributes(AttrProviderID.String(id))
	return id, nil
}

// errorType is a failed send's class, from what the sender made of the answer: the provider's
// HTTP status and error name ("422 validation_error"), the SMTP step and reply ("RCPT TO 550
// 5.1.1"), an invalid message, a cancelled or timed-out context, else "_OTHER". Never the
// provider's text, which may quote the recipient.
func errorType(err error) string {
	var providerErr *mail.ProviderError
	var smtpErr *mail.SMTPError
	switch {
	case errors.As(err, &providerErr):
		return strings.TrimSpace(strconv.Itoa(providerErr.StatusCode) + " " + providerErr.Name)
	case errors.As(err, &smtpErr):
		if smtpErr.Code == 0 {
			return string(smtpErr.Phase) + " no reply"
		}
		return strings.TrimSpace(string(smtpErr.Phase) + " " + strconv.Itoa(smtpErr.Code) + " " + smtpErr.EnhancedCode)
	case errors.Is(err, mail.ErrInvalidMessage):
		return "invalid_message"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return "_OTHER"
}

// traceHandler adds the trace_id and span_id of its context's span to each record.
type traceHandler struct {
	slog.Handler
}

func (h *traceHandler) Handle(ctx context.Context, record slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		record = record.Clone()
		record.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, record)
}

func (h *traceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &traceHandler{Handler: h.Handler.WithAttrs(attrs)}
}

func (h *traceHandler) WithGroup(name string) slog.Handler {
	return &traceHandler{Handler: h.Handler.WithGroup(name)}
}
