package abuse

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/tokens"
)

// DefaultDenyCacheSize is the number of refused (key, window) pairs a Limiter remembers when
// LimiterConfig.DenyCacheSize is 0.
const DefaultDenyCacheSize = 10_000

// Consumer is the counter store a Limiter counts in; db.Tables implement it.
// RateLimitCounterConsumeChain spends one request of each of a request's windows in order, in one
// round trip, each in one atomic statement and only while the ones before it admitted (a window
// at its limit refuses and counts nothing), and reads a user by email with them when asked;
// RateLimitCounterGetMany reads windows' counts in one round trip without spending any of them (0
// when nothing was counted), for Peek; RateLimitCounterDelete deletes a window's counter (none is fine), for Clear.
type Consumer interface {
	RateLimitCounterConsumeChain(ctx context.Context, params *db.RateLimitCounterChainParams) (*db.RateLimitCounterChainResult, error)
	RateLimitCounterGetMany(ctx context.Context, windows []db.RateLimitCounterGetParams) ([]int64, error)
	RateLimitCounterDelete(ctx context.Context, params *db.RateLimitCounterDeleteParams) error
}

// Subject is who a request counts against: its value for each scope. IP is the client's address
// (IPResolver finds it; IPv6 counts per /64, see BucketKey), Email a normalised address, Key an
// opaque key the caller names (an account id, say; at most what fits a request, it is hashed like
// the others).
//
// Allow and Peek check an action's IP rule always (the zero IP counts in one shared bucket,
// "invalid", as an unparsable peer does), and its email and key rules when Email and Key are not
// empty. Clear clears only the scopes the subject names: a valid IP, a non-empty Email or Key.
type Subject struct {
	IP    netip.Addr
	Email string
	Key   string
}

// value is the subject's value of scope for Allow and Peek, and whether its rule is checked.
func (s Subject) value(scope Scope) (string, bool) {
	switch scope {
	case ScopeIP:
		return BucketKey(s.IP), true
	case ScopeEmail:
		return s.Email, s.Email != ""
	case ScopeKey:
		return s.Key, s.Key != ""
	}
	return "", false
}

// clearValue is the subject's value of scope for Clear, and whether the subject names it.
func (s Subject) clearValue(scope Scope) (string, bool) {
	if scope == ScopeIP {
		return BucketKey(s.IP), s.IP.IsValid()
	}
	return s.value(scope)
}

// LimiterConfig holds a Limiter's optional settings. A nil *LimiterConfig takes every default.
type LimiterConfig struct {
	// NowFunc returns the current time; time.Now when nil. Tests stub it.
	NowFunc func() time.Time

	// DenyCacheSize bounds the in-process cache of refused (key, window) pairs of the built-in
	// actions, which answers a repeat refusal without the database (a refusal is final until its
	// window ends). 0 means DefaultDenyCacheSize; a negative value disables the cache. Refusals
	// of custom actions are never cached: Clear, in whichever process it runs, must be seen at
	// once by every process sharing the database, and a cached refusal elsewhere would outlive it.
	DenyCacheSize int

	// Metrics, when set, counts each rule's decisions of Allow (refusals answered by the cache
	// count as refused; Peek counts nothing). nil counts none. abuseprom.Register counts them in
	// Prometheus, as postguard_rate_limit_decisions_total{action,scope,outcome}.
	Metrics Metrics
}

// Metrics counts a Limiter's decisions, in whichever metrics system the caller uses. NewLimiter
// asks for the counters of each rule once, so that a rule's series may exist, at zero, before
// its first request; the Limiter then counts every decision of the rule on them.
type Metrics interface {
	// Counters returns the counters of the allowed and the refused requests of action's rule of
	// scope.
	Counters(action Action, scope Scope) (allowed, refused Counter)
}

// Counter is one count that only goes up; a prometheus.Counter is one.
type Counter interface {
	Inc()
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

// actionRules are the rules of one action in the order they are checked (scopeOrder), each with
// its metric counters resolved up front.
type actionRules []*limiterRule

type limiterRule struct {
	Rule
	allowed, refused Counter // nil without LimiterConfig.Metrics
	// cached says refusals of the rule go to the deny cache: built-in actions only (see
	// LimiterConfig.DenyCacheSize).
	cached bool
}

// NewLimiter returns a Limiter that counts through store, keys counters with secret (APP_SECRET,
// at least tokens.MinSecretLen bytes: a short key makes the counters' HMACs of IPs and emails
// guessable) and enforces rules. It returns an error for a nil store, a secret too short
// (wrapping tokens.ErrWeakSecret) or an invalid rule (Rules.Validate).
func NewLimiter(store Consumer, secret []byte, rules Rules, config *LimiterConfig) (*Limiter, error) {
	if store == nil {
		return nil, errors.New("abuse.NewLimiter: nil store")
	}
	if err := tokens.CheckSecret(secret); err != nil {
		return nil, fmt.Errorf("abuse.NewLimiter: %w", err)
	}
	if err := rules.Validate(); err != nil {
		return nil, fmt.Errorf("abuse.NewLimiter: %w", err)
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

	for _, scope := range scopeOrder {
		for _, rule := range rules.All() {
			if rule.Scope != scope {
				continue
			}
			lr := &limiterRule{Rule: rule, cached: rule.Action.BuiltIn()}
			if config.Metrics != nil {
				// Resolving the counters now lets them exist at 0 before the first request, so
				// dashboards and rate() see every rule from the start.
				lr.allowed, lr.refused = config.Metrics.Counters(rule.Action, rule.Scope)
			}
			l.actions[rule.Action] = append(l.actions[rule.Action], lr)
		}
	}
	return l, nil
}

// Rules returns the rules the Limiter enforces, so that a caller can check at start that the
// actions it will ask about have one.
func (l *Limiter) Rules() Rules { return l.rules }

// Scopes returns the scopes action has rules of, in the order they are checked (IP, email,
// key); none for an action without rules.
func (l *Limiter) Scopes(action Action) []Scope {
	var scopes []Scope
	for _, rule := range l.actions[action] {
		scopes = append(scopes, rule.Scope)
	}
	return scopes
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
// action has no rule of that scope or the rule was not checked (an earlier rule refused, or the
// subject gave no value of that scope). A route that must speak of one budget only, such as forgot-password, whose
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

// Allow spends one request of action for subject. The action's rules are checked in order, IP,
// then email, then key (see Subject for which apply), each spending only when the ones before it
// admitted; the first refusal answers. A rule never counts a request it refuses, but a request a
// later rule refuses has spent the earlier rules' allowance. All the checks of a request are one
// round trip to the database (each one atomic statement of it), and none when the in-process deny
// cache already knows the first rule's window is exhausted (a later rule's cached refusal still
// spends the rules before it). A scope the rules leave out is not limited; an action without any
// rule is an error. Allow returns an error only when the store fails (wrapped); the caller
// chooses whether to fail open or closed.
func (l *Limiter) Allow(ctx context.Context, action Action, subject Subject) (*Decision, error) {
	decision, _, err := l.allow(ctx, action, subject, false)
	return decision, err
}

// AllowUser is Allow, and, when every rule admitted, reads the user whose (normalised) email is
// subject.Email in the same round trip: nil when there is none, when a rule refused, or when
// subject.Email is empty. A route that acts on an account only when its email's budget admitted
// (forgot-password, resend-verification) then costs one round trip, not two.
func (l *Limiter) AllowUser(ctx context.Context, action Action, subject Subject) (*Decision, *db.User, error) {
	return l.allow(ctx, action, subject, subject.Email != "")
}

// chained is a rule of a request's chain, with its window and key.
type chained struct {
	rule *limiterRule
	win  window
	key  [32]byte
}

// chainOf returns the rules of action that apply to subject, in order, with their windows at now
// and keys, up to the first one the deny cache knows refused (cachedRefusal, then): chain[:n].
func (l *Limiter) chainOf(action Action, subject Subject, now time.Time) (chain [db.RateLimitChainMax]chained, n int, cachedRefusal *chained, err error) {
	rules, ok := l.actions[action]
	if !ok {
		return chain, 0, nil, fmt.Errorf("no rate-limit rule for action %q", action)
	}
	for _, rule := range rules {
		value, ok := subject.value(rule.Scope)
		if !ok {
			continue
		}
		c := chained{rule: rule, win: windowAt(now, rule.Window), key: l.keys.key(rule.Action, rule.Scope, value)}
		if denied := l.denyCacheOf(rule); denied != nil && denied.contains(c.key, c.win.start, now) {
			return chain, n, &c, nil
		}
		chain[n] = c
		n++
	}
	return chain, n, nil, nil
}

// allow is Allow, reading subject.Email's user with the checks when lookup is set.
func (l *Limiter) allow(ctx context.Context, action Action, subject Subject, lookup bool) (*Decision, *db.User, error) {
	now := l.now()
	chain, n, cachedRefusal, err := l.chainOf(action, subject, now)
	if err != nil {
		return nil, nil, err
	}

	var result *db.RateLimitCounterChainResult
	if n > 0 {
		params := &db.RateLimitCounterChainParams{Windows: make([]db.RateLimitCounterConsumeParams, n)}
		for i, c := range chain[:n] {
			params.Windows[i] = db.RateLimitCounterConsumeParams{
				KeyHash:     c.key[:],
				WindowStart: c.win.start,
				WindowEnd:   c.win.end,
				LimitCount:  c.rule.Limit,
			}
		}
		if lookup && cachedRefusal == nil {
			params.UserEmail = subject.Email
		}
		if result, err = l.store.RateLimitCounterConsumeChain(ctx, params); err != nil {
			return nil, nil, fmt.Errorf("error consuming rate limits of %s: %w", action, err)
		}
	}

	decision := l.decision(chain[:n], cachedRefusal, now, true, func(i int) (int64, bool) {
		if i >= len(result.Counts) { // the chain's refusal; the rules after it were not spent
			return 0, false
		}
		return max(chain[i].rule.Limit-result.Counts[i], 0), true
	})
	if !decision.Allowed || result == nil {
		return decision, nil, nil
	}
	return decision, result.User, nil
}

// decision answers a request from what its chain of rules found (chain, then cachedRefusal):
// left(i) is what chain[i]'s window has left and whether it admitted. The first refusal answers,
// its window going to the deny cache (built-in actions only); else the admitted rule with the
// fewest requests remaining, on a tie the one resetting later. counted puts each rule's outcome
// in the metrics (Allow's decisions, not Peek's).
func (l *Limiter) decision(chain []chained, cachedRefusal *chained, now time.Time, counted bool, left func(i int) (remaining int64, admitted bool)) *Decision {
	var answer *Decision
	var checked []*Decision
	for i, c := range chain {
		d := &Decision{Rule: c.rule.Rule, ResetAfter: c.win.end.Sub(now)}
		checked = append(checked, d)
		remaining, admitted := left(i)
		if !admitted {
			if denied := l.denyCacheOf(c.rule); denied != nil {
				denied.add(c.key, c.win.start, c.win.end)
			}
			if counted {
				observe(c.rule.refused)
			}
			d.checked = checked
			return d
		}
		if counted {
			observe(c.rule.allowed)
		}
		d.Allowed = true
		d.Remaining = remaining
		if answer == nil || d.Remaining < answer.Remaining ||
			(d.Remaining == answer.Remaining && d.ResetAfter > answer.ResetAfter) {
			answer = d
		}
	}
	if c := cachedRefusal; c != nil {
		if counted {
			observe(c.rule.refused)
		}
		d := &Decision{Rule: c.rule.Rule, ResetAfter: c.win.end.Sub(now)}
		d.checked = append(checked, d)
		return d
	}
	if answer == nil { // no rule applied: only email or key rules, and no such value
		answer = &Decision{Allowed: true}
	}
	answer.checked = checked
	return answer
}

// Peek answers what Allow would answer now for action and subject, and spends nothing: the
// rules' current windows are read, in one round trip (none for a window the deny cache knows is
// exhausted), and compared with the rules' limits in Allow's order, the first one at its limit
// answering. Remaining is what the window has left now, before any spending. Peek counts nothing,
// in the database or in the metrics. Pairing it with Allow limits failures only: peek before an
// attempt, refuse while the window is exhausted, and Allow (spend) when the attempt failed. Like
// Allow, Peek returns an error only when the store fails. A window of a built-in action found at
// its limit goes into the deny cache: nothing clears those, and counts only grow within a window,
// so it stays refused until it ends.
func (l *Limiter) Peek(ctx context.Context, action Action, subject Subject) (*Decision, error) {
	now := l.now()
	chain, n, cachedRefusal, err := l.chainOf(action, subject, now)
	if err != nil {
		return nil, err
	}
	var counts []int64
	if n > 0 {
		windows := make([]db.RateLimitCounterGetParams, n)
		for i, c := range chain[:n] {
			windows[i] = db.RateLimitCounterGetParams{KeyHash: c.key[:], WindowStart: c.win.start}
		}
		if counts, err = l.store.RateLimitCounterGetMany(ctx, windows); err != nil {
			return nil, fmt.Errorf("error reading rate limits of %s: %w", action, err)
		}
	}

	return l.decision(chain[:n], cachedRefusal, now, false, func(i int) (int64, bool) {
		return chain[i].rule.Limit - counts[i], counts[i] < chain[i].rule.Limit
	}), nil
}

// Clear deletes the subject's counters of action's current windows, for the scopes the subject
// names (a valid IP, a non-empty email or key; see Subject), and forgets this process's cached
// refusals of them: the subject starts those windows afresh. A login that succeeds clears the
// account's key and leaves its IP's failures counted, so a valid account of the attacker's own
// does not reset a password spray. An action without any rule is an error, as is a store
// failure. Refusals of built-in actions cached by other processes sharing the database stay
// until their window ends; custom actions' are never cached (LimiterConfig.DenyCacheSize).
func (l *Limiter) Clear(ctx context.Context, action Action, subject Subject) error {
	rules, ok := l.actions[action]
	if !ok {
		return fmt.Errorf("no rate-limit rule for action %q", action)
	}
	now := l.now()
	for _, rule := range rules {
		value, ok := subject.clearValue(rule.Scope)
		if !ok {
			continue
		}
		win := windowAt(now, rule.Window)
		key := l.keys.key(rule.Action, rule.Scope, value)
		if err := l.store.RateLimitCounterDelete(ctx, &db.RateLimitCounterDeleteParams{KeyHash: key[:], WindowStart: win.start}); err != nil {
			return fmt.Errorf("error clearing rate limit %s: %w", rule.PolicyName(), err)
		}
		if l.denied != nil {
			l.denied.remove(key, win.start)
		}
	}
	return nil
}

// denyCacheOf is the deny cache rule's refusals go to: nil when the cache is disabled, or for a
// rule of a custom action.
func (l *Limiter) denyCacheOf(rule *limiterRule) *denyCache {
	if !rule.cached {
		return nil
	}
	return l.denied
}

func observe(c Counter) {
	if c != nil {
		c.Inc()
	}
}
