package abuse

import "context"

// Call names a Limiter call that goes to its store, as a Tracer is told of it.
type Call string

// The Limiter's calls a Tracer is told of.
const (
	CallAllow         Call = "allow"
	CallAllowUser     Call = "allow_user"
	CallPeek          Call = "peek"
	CallRefund        Call = "refund"
	CallClear         Call = "clear"
	CallIssueDevice   Call = "issue_device"
	CallRevokeDevices Call = "revoke_devices"
)

// Tracer is told of each Limiter call that may go to its store (Allow, AllowUser, Peek, Refund,
// Clear, IssueDevice, RevokeDevices), so that the caller's tracing can time its round trip:
// TraceStart as the call begins, with the call's context (the context it returns is the one the
// store is called with, and TraceEnd's), and TraceEnd as the call returns. abuseotel.NewTracer
// is OpenTelemetry's. The Limiter tells it nothing of the subject: no IP, address, key or token.
type Tracer interface {
	TraceStart(ctx context.Context, data TraceStartData) context.Context
	TraceEnd(ctx context.Context, data TraceEndData)
}

// TraceStartData is what a call is: which, and of which action ("" for an action the Limiter has
// no rule for, whose name is then the caller's input and nothing to record).
type TraceStartData struct {
	Call   Call
	Action Action
}

// TraceEndData is what a call found.
type TraceEndData struct {
	// RoundTrip says the call went to the store: not when the deny cache answered, nor when the
	// subject named no scope of the action's rules.
	RoundTrip bool
	// Decision is Allow's, AllowUser's and Peek's answer; nil for the other calls, and on error.
	Decision *Decision
	// Err is the call's error, if any.
	Err error
}

// traceStart tells the Tracer, if any, that call of action begins.
func (l *Limiter) traceStart(ctx context.Context, call Call, action Action) context.Context {
	if l.tracer == nil {
		return ctx
	}
	if _, known := l.actions[action]; !known {
		action = ""
	}
	return l.tracer.TraceStart(ctx, TraceStartData{Call: call, Action: action})
}

// traceEnd tells the Tracer, if any, what the call begun with ctx found.
func (l *Limiter) traceEnd(ctx context.Context, roundTrip bool, decision *Decision, err error) {
	if l.tracer == nil {
		return
	}
	l.tracer.TraceEnd(ctx, TraceEndData{RoundTrip: roundTrip, Decision: decision, Err: err})
}
