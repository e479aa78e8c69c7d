package abuse

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/postguard/postguard/db"
)

// DefaultDenyCacheSize is the number of refused (key, window) pairs a Limiter remembers when
// LimiterConfig.DenyCacheSize is 0.
const DefaultDenyCacheSize = 10_000

// Consumer is the counter store a Limiter counts in; db.Store implements it.
// RateLimitCounterConsume spends one request of a counter's window in one atomic statement (ok is
// false, and nothing counted, when the window is at its limit); RateLimitCounterGet reads a
// window's count without spending any of it (0 when nothing was counted), for Peek.
type Consumer interface {
	RateLimitCounterConsume(ctx context.Context, params *db.RateLimitCounterConsumeParams) (count int64, ok bool, err error)
	RateLimitCounterGet(ctx context.Context, params *db.RateLimitCounterGetParams) (int64, error)
}

// LimiterConfig holds a Limiter's optional settings. A nil *LimiterConfig takes every default.
type LimiterConfig struct {
	// NowFunc returns the current time; time.Now when nil. Tests stub it.
	NowFunc func() time.Time

	// DenyCacheSize bounds the in-process cache of refused (key, window) pairs, which answers a
	// repeat refusal without the database (a refusal is final until its window ends). 0 means
	// DefaultDenyCacheSize; a negative value disables the cache.
	DenyCacheSize int

	// Registerer, when set, receives postguard_rate_limit_decisions_total{action,scope,outcome}
	// (outcome "allowed" or "refused"; refusals answered by the cache count as refused). A
	// collector already registered under that name (a second Limiter) is reused.
	Registerer prometheus.Registerer
}

// Limiter enforces Rules with fixed-window counters in the database, shared by every process
// that uses the same database and secret. It is safe for concurrent use.
type Limiter struct {
	store   Consumer
	keys    *keyer
	now     func() time.Time
	denied  *denyCache // nil when disabled
	actions map[Action]actionRules
	rules   Rules
}

// actionRules are the rules of one action, each with its metric counters resolved up front.
type actionRules struct {
	ip, email *limiterRule
}

type limiterRule struct {
	Rule
	allowed, refused prometheus.Counter // nil without a Registerer
}

// NewLimiter returns a Limiter that counts through store, keys counters with secret (APP_SECRET)
// and enforces rules. It panics when store is nil, secret is empty or a rule is invalid
// (Rules.Validate): those are wiring mistakes, caught by the config loader before this runs.
func NewLimiter(store Consumer, secret []byte, rules Rules, config *LimiterConfig) *Limiter {
	if store == nil {
		panic("abuse.NewLimiter: nil store")
	}
	if len(secret) == 0 {
		panic("abuse.NewLimiter: empty secret (rate-limit keys would be unkeyed hashes of IPs and emails)")
	}
	if err := rules.Validate(); err != nil {
		panic("abuse.NewLimiter: " + err.Error())
	}
	if config == nil {
		config = &LimiterConfig{}
	}

	l := &Limiter{
		store:   store,
		keys:    newKeyer(secret),
		now:     config.NowFunc,
		actions: make(map[Action]actionRules),
		rules:   rules,
	}
	if l.now == nil {
		l.now = time.Now
	}
	switch {
	case config.DenyCacheSize == 0:
		l.denied = newDenyCache(DefaultDenyCacheSize)
	case config.DenyCacheSize > 0:
		l.denied = newDenyCache(config.DenyCacheSize)
	}

	var decisions *prometheus.CounterVec
	if config.Registerer != nil {
		decisions = registerDecisions(config.Registerer)
	}
	for _, rule := range rules.All() {
		lr := &limiterRule{Rule: rule}
		if decisions != nil {
			// Resolving the series now makes them exist at 0 before the first request, so
			// dashboards and rate() see every rule from the start.
			lr.allowed = decisions.WithLabelValues(string(rule.Action), string(rule.Scope), "allowed")
			lr.refused = decisions.WithLabelValues(string(rule.Action), string(rule.Scope), "refused")
		}
		ar := l.actions[rule.Action]
		switch rule.Scope {
		case ScopeIP:
			ar.ip = lr
		case ScopeEmail:
			ar.email = lr
		}
		l.actions[rule.Action] = ar
	}
	return l
}

// Rules returns the rules the Limiter enforces, so that a caller can check at start that the
// actions it will ask about have one.
func (l *Limiter) Rules() Rules { return l.rules }

func registerDecisions(reg prometheus.Registerer) *prometheus.CounterVec {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "postguard_rate_limit_decisions_total",
		Help: "Rate-limit checks by action, scope and outcome (allowed or refused).",
	}, []string{"action", "scope", "outcome"})
	if err := reg.Register(vec); err != nil {
		var already prometheus.AlreadyRegisteredError
		if errors.As(err, &already) {
			if existing, ok := already.ExistingCollector.(*prometheus.CounterVec); ok {
				return existing
			}
		}
		panic("abuse.NewLimiter: error registering metrics: " + err.Error())
	}
	return vec
}

// Decision is the answer of Limiter.Allow: when refused, the rule that refused; when allowed,
// the checked rule with the fewest requests remaining (on a tie, the one resetting later).
type Decision struct {
	// Allowed is true when every rule let the request through.
	Allowed bool
	// Rule is the rule the decision is about. It is the zero Rule only when no rule applied.
	Rule Rule
	// Remaining is how many more requests Rule allows in its current window (0 when refused).
	Remaining int64
	// ResetAfter is the time until Rule's current window ends.
	ResetAfter time.Duration

	// checked holds what each rule checked for the request decided, in order; see Of.
	checked []*Decision
}

// Of returns what the action's rule of scope alone decided for the request, and false when the
// action has no rule of that scope or the rule was not checked (an earlier rule refused, or no
// email was given). A route that must speak of one budget only, such as forgot-password, whose
// headers describe the client's own IP rule and never an email's, writes Of(ScopeIP)'s headers
// whichever rule answered.
func (d *Decision) Of(scope Scope) (*Decision, bool) {
	for _, c := range d.checked {
		if c.Rule.Scope == scope {
			return c, true
		}
	}
	return nil, false
}

// RetryAfterSeconds is ResetAfter in whole seconds, rounded up and at least 1: the Retry-After
// of a refusal.
func (d *Decision) RetryAfterSeconds() int64 {
	return ceilSeconds(d.ResetAfter)
}

// SetHeaders writes the IETF draft's (draft-ietf-httpapi-ratelimit-headers) structured fields
// for Rule, e.g.
//
//	RateLimit-Policy: "register-ip";q=5;w=900
//	RateLimit: "register-ip";r=0;t=540
//
// and, when the request was refused, Retry-After in whole seconds (at least 1). It writes nothing
// when no rule applied.
func (d *Decision) SetHeaders(h http.Header) {
	if d.Rule.Limit <= 0 {
		return
	}
	name := strconv.Quote(d.Rule.PolicyName()) // [a-z0-9-]: a valid sf-string as Go quotes it
	h.Set("RateLimit-Policy", name+
		";q="+strconv.FormatInt(d.Rule.Limit, 10)+
		";w="+strconv.FormatInt(int64(d.Rule.Window/time.Second), 10))
	reset := strconv.FormatInt(d.RetryAfterSeconds(), 10)
	h.Set("RateLimit", name+";r="+strconv.FormatInt(d.Remaining, 10)+";t="+reset)
	if !d.Allowed {
		h.Set("Retry-After", reset)
	}
}

// Allow spends one request of action for a client IP and, unless email is "", an email address
// (already normalised by the caller). The IP rule is checked first, then the email rule; the
// first refusal answers. A rule never counts a request it refuses, but a request the email rule
// refuses has spent its IP allowance. Each check is one atomic database statement, unless the
// in-process deny cache already knows the window is exhausted. A scope the rules leave out is not
// limited; an action without any rule is an error. Allow returns an error only when the store
// fails (wrapped); the caller chooses whether to fail open or closed.
func (l *Limiter) Allow(ctx context.Context, action Action, ip netip.Addr, email string) (*Decision, error) {
	return l.decide(ctx, action, ip, email, l.check)
}

// Peek answers what Allow would answer now for action, ip and email, and spends nothing: each
// rule's current window is read (one statement per rule, unless the deny cache knows the window
// is exhausted) and compared with the rule's limit, in Allow's order, the first one at its limit
// answering. Remaining is what the window has left now, before any spending. Peek counts nothing,
// in the database or in the metrics. Pairing it with Allow limits failures only: peek before an
// attempt, refuse while the window is exhausted, and Allow (spend) when the attempt failed. Like
// Allow, Peek returns an error only when the store fails.
func (l *Limiter) Peek(ctx context.Context, action Action, ip netip.Addr, email string) (*Decision, error) {
	return l.decide(ctx, action, ip, email, l.peek)
}

// decide runs check on each rule of action that applies, IP first, and answers as Allow says.
func (l *Limiter) decide(ctx context.Context, action Action, ip netip.Addr, email string,
	check func(ctx context.Context, rule *limiterRule, value string, now time.Time) (*Decision, error),
) (*Decision, error) {
	ar, ok := l.actions[action]
	if !ok {
		return nil, fmt.Errorf("no rate-limit rule for action %q", action)
	}
	now := l.now()

	var answer *Decision
	var checked []*Decision
	if ar.ip != nil {
		d, err := check(ctx, ar.ip, BucketKey(ip), now)
		if err != nil {
			return nil, err
		}
		checked = append(checked, d)
		if !d.Allowed {
			d.checked = checked
			return d, nil
		}
		answer = d
	}
	if ar.email != nil && email != "" {
		d, err := check(ctx, ar.email, email, now)
		if err != nil {
			return nil, err
		}
		checked = append(checked, d)
		if !d.Allowed {
			d.checked = checked
			return d, nil
		}
		if answer == nil || d.Remaining < answer.Remaining ||
			(d.Remaining == answer.Remaining && d.ResetAfter > answer.ResetAfter) {
			answer = d
		}
	}
	if answer == nil { // only an email rule, and no email
		answer = &Decision{Allowed: true}
	}
	answer.checked = checked
	return answer, nil
}

// check spends one request of rule for value.
func (l *Limiter) check(ctx context.Context, rule *limiterRule, value string, now time.Time) (*Decision, error) {
	win := windowAt(now, rule.Window)
	key := l.keys.key(rule.Action, rule.Scope, value)
	d := &Decision{Rule: rule.Rule, ResetAfter: win.end.Sub(now)}

	if l.denied != nil && l.denied.contains(key, win.start, now) {
		observe(rule.refused)
		return d, nil
	}

	count, ok, err := l.store.RateLimitCounterConsume(ctx, &db.RateLimitCounterConsumeParams{
		KeyHash:     key[:],
		WindowStart: win.start,
		WindowEnd:   win.end,
		LimitCount:  rule.Limit,
	})
	if err != nil {
		return nil, fmt.Errorf("error consuming rate limit %s: %w", rule.PolicyName(), err)
	}
	if !ok {
		if l.denied != nil {
			l.denied.add(key, win.start, win.end)
		}
		observe(rule.refused)
		return d, nil
	}
	observe(rule.allowed)
	d.Allowed = true
	d.Remaining = max(rule.Limit-count, 0)
	return d, nil
}

// peek reads rule's current window for value and decides as check would, spending nothing. A
// window found at its limit goes into the deny cache: counts only grow within a window, so it
// stays refused until it ends.
func (l *Limiter) peek(ctx context.Context, rule *limiterRule, value string, now time.Time) (*Decision, error) {
	win := windowAt(now, rule.Window)
	key := l.keys.key(rule.Action, rule.Scope, value)
	d := &Decision{Rule: rule.Rule, ResetAfter: win.end.Sub(now)}

	if l.denied != nil && l.denied.contains(key, win.start, now) {
		return d, nil
	}

	count, err := l.store.RateLimitCounterGet(ctx, &db.RateLimitCounterGetParams{
		KeyHash:     key[:],
		WindowStart: win.start,
	})
	if err != nil {
		return nil, fmt.Errorf("error reading rate limit %s: %w", rule.PolicyName(), err)
	}
	if count >= rule.Limit {
		if l.denied != nil {
			l.denied.add(key, win.start, win.end)
		}
		return d, nil
	}
	d.Allowed = true
	d.Remaining = rule.Limit - count
	return d, nil
}

func observe(c prometheus.Counter) {
	if c != nil {
		c.Inc()
	}
}
