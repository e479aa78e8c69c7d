// Package abuseotel traces an abuse.Limiter's round trips to its store with OpenTelemetry, for an
// app that asks for it: abuse itself links no tracing library. postguard's server installs it
// when tracing is on.
package abuseotel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/db"
)

// ScopeName is the instrumentation scope of the spans.
const ScopeName = "github.com/postguard/postguard/api/abuse"

// Attributes of the spans. None names the subject: no IP, address, key or token, and no counter's
// key either (an HMAC of one).
const (
	// AttrAction is the rate-limit action ("register", "login"...); absent for an action the
	// Limiter has no rule for.
	AttrAction = attribute.Key("postguard.rate_limit.action")
	// AttrRoundTrip says the call went to the store (not when the deny cache answered).
	AttrRoundTrip = attribute.Key("postguard.rate_limit.round_trip")
	// AttrAllowed is Allow's and Peek's answer.
	AttrAllowed = attribute.Key("postguard.rate_limit.allowed")
	// AttrScope is the scope of the rule the answer is about: the refusing one, or the one with
	// the fewest requests left ("ip", "email", "key").
	AttrScope = attribute.Key("postguard.rate_limit.scope")
	// AttrErrorType is "unavailable" for a store that cannot serve (db.ErrUnavailable), else
	// "_OTHER", on a call that failed. The error's text is not recorded.
	AttrErrorType = attribute.Key("error.type")
)

// Tracer is an abuse.Tracer that starts one span per call, named "rate_limit <call>"
// ("rate_limit allow"), a child of the call's context's span.
type Tracer struct {
	tracer trace.Tracer
}

var _ abuse.Tracer = (*Tracer)(nil)

// NewTracer returns a Tracer on provider's tracer of ScopeName (abuse.LimiterConfig.Tracer).
func NewTracer(provider trace.TracerProvider) *Tracer {
	return &Tracer{tracer: provider.Tracer(ScopeName)}
}

// TraceStart implements abuse.Tracer.
func (t *Tracer) TraceStart(ctx context.Context, data abuse.TraceStartData) context.Context {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}
	if data.Action != "" {
		opts = append(opts, trace.WithAttributes(AttrAction.String(string(data.Action))))
	}
	ctx, _ = t.tracer.Start(ctx, "rate_limit "+string(data.Call), opts...)
	return ctx
}

// TraceEnd implements abuse.Tracer.
func (t *Tracer) TraceEnd(ctx context.Context, data abuse.TraceEndData) {
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(AttrRoundTrip.Bool(data.RoundTrip))
	if d := data.Decision; d != nil {
		span.SetAttributes(AttrAllowed.Bool(d.Allowed))
		if d.Rule.Scope != "" {
			span.SetAttributes(AttrScope.String(string(d.Rule.Scope)))
		}
	}
	if data.Err != nil {
		errorType := "_OTHER"
		if errors.Is(data.Err, db.ErrUnavailable) {
			errorType = "unavailable"
		}
		span.SetAttributes(AttrErrorType.String(errorType))
		span.SetStatus(codes.Error, "")
	}
	span.End()
}
