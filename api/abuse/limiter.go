package abuse

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
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
// when nothing was counted), for Peek; RateLimitCounterRefund gives one request back to each of
// several windows (never below zero), for Refund; RateLimitCounterDeleteMany deletes windows'
// counters (none is fine), for Clear. Each of those four checks a request's trusted device in its
// one round trip, counting the device's window in the device's own bucket while it stands.
// RateLimitDeviceRevocationGet and RateLimitDeviceRevocationUpsert read and move an account's
// revocation time, for IssueDevice and RevokeDevices.
type Consumer interface {
	RateLimitCounterConsumeChain(ctx context.Context, params *db.RateLimitCounterChainParams) (*db.RateLimitCounterChainResult, error)
	RateLimitCounterGetMany(ctx context.Context, params *db.RateLimitCounterWindowsParams) (*db.RateLimitCounterGetManyResult, error)
	RateLimitCounterRefund(ctx context.Context, params *db.RateLimitCounterWindowsParams) (trusted bool, err error)
	RateLimitCounterDeleteMany(ctx context.Context, params *db.RateLimitCounterWindowsParams) (trusted bool, err error)
	RateLimitDeviceRevocationGet(ctx context.Context, keyHash []byte) (time.Time, error)
	RateLimitDeviceRevocationUpsert(ctx context.Context, keyHash []byte) error
}

// Subject is who a request counts against: its value for each scope. IP is the client's address
// (IPResolver finds it; IPv6 counts per /64, see BucketKey), Email a normalised address, Key an
// opaque key the caller names (an account id, say; at most what fits a request, it is hashed like
// the others).
//
// Allow and Peek check an action's IP rule always (the zero IP counts in one shared bucket,
// "invalid", as an unparsable peer does), and its email and key rules when Email and Key are not
// empty. Refund and Clear touch only the scopes the subject names: a valid IP, a non-empty Email
// or Key.
//
// Device is a trusted-device token the client carries (Limiter.IssueDevice, for the action and
// Key). While it stands, the action's key rule counts in the device's own bucket instead of the
// account's shared one, for Allow, Peek, Refund and Clear alike; every other rule is the same.
// A token that is malformed, forged, another key's or action's, expired or revoked is no token:
// the request counts exactly as it would without one.
type Subject struct {
	IP     netip.Addr
	Email  string
	Key    string
	Device string
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

	// DeviceTokenTTL is how long a trusted-device token stands after IssueDevice made it
	// (DEVICE_TOKEN_TTL); 0 means DefaultDeviceTokenTTL. Expiry is judged by the current TTL, so
	// shortening it shortens the tokens already issued.
	DeviceTokenTTL time.Duration

	// Metrics, when set, counts each rule's decisions of Allow (refusals answered by the cache
	// count as refused; Peek counts nothing), and what the trusted-device tokens requests carried
	// turned out to be. nil counts none. abuseprom.Register counts them in Prometheus, as
	// postguard_rate_limit_decisions_total{action,scope,outcome} and
	// postguard_rate_limit_device_tokens_total{action,outcome}.
	Metrics Metrics

	// Tracer, when set, is told of each call that may go to the store (a span per call:
	// abuseotel.NewTracer). nil traces none, at no cost.
	Tracer Tracer
}

// Metrics counts a Limiter's decisions, in whichever metrics system the caller uses. NewLimiter
// asks for every counter it will count on once, so that each series may exist, at zero, before
// its first request; the Limiter then counts on them.
type Metrics interface {
	// Counters returns the counters of the allowed and the refused requests of action's rule of
	// scope.
	Counters(action Action, scope Scope) (allowed, refused Counter)
	// DeviceCounter returns the counter of the trusted-device tokens that requests of action
	// carried and that turned out to be outcome: "trusted", "revoked", "expired", "forged" or
	// "malformed" (DeviceOutcomes). It is asked for the actions that have a key rule.
	DeviceCounter(action Action, outcome string) Counter
}

// DeviceOutcomes are the outcomes of a trusted-device token, Metrics.DeviceCounter's.
func DeviceOutcomes() []string {
	outcomes := make([]string, len(deviceOutcomes))
	for i, outcome := range deviceOutcomes {
		outcomes[i] = string(outcome)
	}
	return outcomes
}

// Counter is one count that only goes up; a prometheus.Counter is one.
type Counter interface {
	Inc()
}

// Limiter enforces Rules with fixed-window counters in the database, shared by every process
// that uses the same database and secret. It is safe for concurrent use.
type Limiter struct {
	store     Consumer
	keys      *keyer
	devices   *deviceSigner
	deviceTTL time.Duration
	now       func() time.Time
	denied    *denyCache // nil when disabled
	tracer    Tracer     // nil without LimiterConfig.Tracer
	actions   map[Action]actionRules
	rules     Rules
	// deviceCounters count the device tokens requests carried, by action and outcome; empty
	// without LimiterConfig.Metrics.
	deviceCounters map[Action]map[deviceOutcome]Counter
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
		store:     store,
		keys:      newKeyer(secret),
		devices:   newDeviceSigner(secret),
		deviceTTL: cmp.Or(config.DeviceTokenTTL, DefaultDeviceTokenTTL),
		now:       config.NowFunc,
		actions:   make(map[Action]actionRules),
		rules:     rules,
		tracer:    config.Tracer,

		deviceCounters: make(map[Action]map[deviceOutcome]Counter),
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
			if config.Metrics != nil && scope == ScopeKey {
				counters := make(map[deviceOutcome]Counter, len(deviceOutcomes))
				for _, outcome := range deviceOutcomes {
					counters[outcome] = config.Metrics.DeviceCounter(rule.Action, string(outcome))
				}
				l.deviceCounters[rule.Action] = counters
			}
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

// DeviceTokenTTL is how long a trusted-device token stands after IssueDevice: the Max-Age of a
// device cookie.
func (l *Limiter) DeviceTokenTTL() time.Duration { return l.deviceTTL }

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
	ctx = l.traceStart(ctx, CallAllow, action)
	decision, _, roundTrip, err := l.allow(ctx, action, subject, false)
	l.traceEnd(ctx, roundTrip, decision, err)
	return decision, err
}

// AllowUser is Allow, and, when every rule admitted, reads the user whose (normalised) email is
// subject.Email in the same round trip: nil when there is none, when a rule refused, or when
// subject.Email is empty. A route that acts on an account only when its email's budget admitted
// (forgot-password, resend-verification) then costs one round trip, not two.
func (l *Limiter) AllowUser(ctx context.Context, action Action, subject Subject) (*Decision, *db.User, error) {
	ctx = l.traceStart(ctx, CallAllowUser, action)
	decision, user, roundTrip, err := l.allow(ctx, action, subject, subject.Email != "")
	l.traceEnd(ctx, roundTrip, decision, err)
	return decision, user, err
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

// allow is Allow, reading subject.Email's user with the checks when lookup is set; roundTrip says
// it went to the store.
func (l *Limiter) allow(ctx context.Context, action Action, subject Subject, lookup bool) (_ *Decision, _ *db.User, roundTrip bool, _ error) {
	now := l.now()
	chain, n, cachedRefusal, err := l.chainOf(action, subject, now)
	if err != nil {
		return nil, nil, false, err
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
		params.Device = l.deviceOf(action, subject, chain[:n], now)
		if result, err = l.store.RateLimitCounterConsumeChain(ctx, params); err != nil {
			return nil, nil, true, fmt.Errorf("error consuming rate limits of %s: %w", action, err)
		}
		l.countDevice(action, params.Device, result.DeviceTrusted)
	}

	decision := l.decision(chain[:n], cachedRefusal, now, true, func(i int) (int64, bool) {
		if i >= len(result.Counts) { // the chain's refusal; the rules after it were not spent
			return 0, false
		}
		return max(chain[i].rule.Limit-result.Counts[i], 0), true
	})
	if !decision.Allowed || result == nil {
		return decision, nil, n > 0, nil
	}
	return decision, result.User, true, nil
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
// in the database or in the decision metrics, and serves to show how many attempts are left: the
// login pattern spends first (Allow before checking a password), since a peek that admits says
// nothing of the requests running beside it. Like Allow, Peek returns an error only when the store
// fails. A window of a built-in action found at its limit goes into the deny cache: counts only
// grow within a window, and only Clear and Refund (which forget their own process's entries)
// bring one down sooner.
func (l *Limiter) Peek(ctx context.Context, action Action, subject Subject) (*Decision, error) {
	ctx = l.traceStart(ctx, CallPeek, action)
	decision, roundTrip, err := l.peek(ctx, action, subject)
	l.traceEnd(ctx, roundTrip, decision, err)
	return decision, err
}

// peek is Peek; roundTrip says it went to the store.
func (l *Limiter) peek(ctx context.Context, action Action, subject Subject) (_ *Decision, roundTrip bool, _ error) {
	now := l.now()
	chain, n, cachedRefusal, err := l.chainOf(action, subject, now)
	if err != nil {
		return nil, false, err
	}
	var counts []int64
	if n > 0 {
		params := &db.RateLimitCounterWindowsParams{Windows: windowsOf(chain[:n]), Device: l.deviceOf(action, subject, chain[:n], now)}
		result, err := l.store.RateLimitCounterGetMany(ctx, params)
		if err != nil {
			return nil, true, fmt.Errorf("error reading rate limits of %s: %w", action, err)
		}
		l.countDevice(action, params.Device, result.DeviceTrusted)
		counts = result.Counts
	}

	return l.decision(chain[:n], cachedRefusal, now, false, func(i int) (int64, bool) {
		return chain[i].rule.Limit - counts[i], counts[i] < chain[i].rule.Limit
	}), n > 0, nil
}

// Refund gives one request back to each of the subject's current windows of action, for the
// scopes the subject names (a valid IP, a non-empty email or key; see Subject), never below
// zero, in one round trip: a window at 0, or that never counted, is left alone, and windows
// before the current one keep their counts. The login pattern refunds the IP of a right password,
// so that a success costs the client nothing while its failures still count; the account's key
// is cleared instead. A trusted device's bucket takes the key rule's refund while it stands.
// Refund forgets this process's cached refusals of the windows it touched; other processes' stay
// until their window ends (built-in actions only: custom actions' refusals are never cached, so
// every process sees a refund at once). An action without any rule is an error, as is a store
// failure.
func (l *Limiter) Refund(ctx context.Context, action Action, subject Subject) error {
	ctx = l.traceStart(ctx, CallRefund, action)
	roundTrip, err := l.each(ctx, action, subject, "refunding", l.store.RateLimitCounterRefund)
	l.traceEnd(ctx, roundTrip, nil, err)
	return err
}

// Clear deletes the subject's counters of action's current windows, for the scopes the subject
// names (a valid IP, a non-empty email or key; see Subject), in one round trip, and forgets this
// process's cached refusals of them: the subject starts those windows afresh. A login that
// succeeds clears the account's key and refunds its IP (see Refund), so a valid account of the
// attacker's own does not reset a password spray. With a trusted device that stands, the
// device's own bucket is cleared instead of the account's: the owner's logins do not hand back
// the budget that unknown clients spent. An action without any rule is an error, as is a store
// failure. Refusals of built-in actions cached by other processes sharing the database stay
// until their window ends; custom actions' are never cached (LimiterConfig.DenyCacheSize).
func (l *Limiter) Clear(ctx context.Context, action Action, subject Subject) error {
	ctx = l.traceStart(ctx, CallClear, action)
	roundTrip, err := l.each(ctx, action, subject, "clearing", l.store.RateLimitCounterDeleteMany)
	l.traceEnd(ctx, roundTrip, nil, err)
	return err
}

// each runs a statement of Refund or Clear (doing says which) over the subject's named windows of
// action, then forgets this process's cached refusals of them; roundTrip says it went to the
// store.
func (l *Limiter) each(ctx context.Context, action Action, subject Subject, doing string, statement func(ctx context.Context, params *db.RateLimitCounterWindowsParams) (bool, error)) (roundTrip bool, _ error) {
	rules, ok := l.actions[action]
	if !ok {
		return false, fmt.Errorf("no rate-limit rule for action %q", action)
	}
	now := l.now()
	var named []chained
	for _, rule := range rules {
		if value, ok := subject.clearValue(rule.Scope); ok {
			named = append(named, chained{rule: rule, win: windowAt(now, rule.Window), key: l.keys.key(rule.Action, rule.Scope, value)})
		}
	}
	if len(named) == 0 {
		return false, nil
	}
	params := &db.RateLimitCounterWindowsParams{Windows: windowsOf(named), Device: l.deviceOf(action, subject, named, now)}
	trusted, err := statement(ctx, params)
	if err != nil {
		return true, fmt.Errorf("error %s rate limits of %s: %w", doing, action, err)
	}
	l.countDevice(action, params.Device, trusted)
	for _, c := range named {
		if denied := l.denyCacheOf(c.rule); denied != nil {
			denied.remove(c.key, c.win.start)
		}
	}
	return true, nil
}

// windowsOf are the windows of chain, as the store takes them.
func windowsOf(chain []chained) []db.RateLimitCounterGetParams {
	windows := make([]db.RateLimitCounterGetParams, len(chain))
	for i, c := range chain {
		windows[i] = db.RateLimitCounterGetParams{KeyHash: c.key[:], WindowStart: c.win.start, WindowEnd: c.win.end}
	}
	return windows
}

// IssueDevice returns a new trusted-device token for key of action, to give the client whose
// login just succeeded (a cookie: see package ginlimit). It stands for DeviceTokenTTL, until the
// key's devices are revoked (RevokeDevices), and only for that action and key. It costs one round
// trip, to read when the key's devices were last revoked. An action without a key rule (where a
// device would count nothing) or an empty key is an error, as is a store failure.
func (l *Limiter) IssueDevice(ctx context.Context, action Action, key string) (string, error) {
	if err := l.deviceAction(action, key); err != nil {
		return "", err
	}
	ctx = l.traceStart(ctx, CallIssueDevice, action)
	revocation := l.keys.revocationKey(action, key)
	since, err := l.store.RateLimitDeviceRevocationGet(ctx, revocation[:])
	if err != nil {
		err = fmt.Errorf("error issuing a device of %s: %w", action, err)
	}
	l.traceEnd(ctx, true, nil, err)
	if err != nil {
		return "", err
	}
	t := deviceToken{issuedAt: l.now(), since: since}
	_, _ = rand.Read(t.id[:]) // never fails (crypto/rand)
	return l.devices.sign(action, key, t), nil
}

// RevokeDevices revokes every trusted-device token of key for action issued so far, at once and
// in every process sharing the database (after a password change, say): they become no token.
// Tokens issued afterwards stand. The revocation is recorded on durable connections, so a crash
// does not undo it. The same errors as IssueDevice.
func (l *Limiter) RevokeDevices(ctx context.Context, action Action, key string) error {
	if err := l.deviceAction(action, key); err != nil {
		return err
	}
	ctx = l.traceStart(ctx, CallRevokeDevices, action)
	revocation := l.keys.revocationKey(action, key)
	err := l.store.RateLimitDeviceRevocationUpsert(ctx, revocation[:])
	if err != nil {
		err = fmt.Errorf("error revoking devices of %s: %w", action, err)
	}
	l.traceEnd(ctx, true, nil, err)
	return err
}

// deviceAction checks that action's devices of key can count something.
func (l *Limiter) deviceAction(action Action, key string) error {
	if !slices.Contains(l.Scopes(action), ScopeKey) {
		return fmt.Errorf("rate-limit action %q has no key rule, which a device counts in", action)
	}
	if key == "" {
		return errors.New("a device needs the key it counts for")
	}
	return nil
}

// deviceOf returns the device of subject's token among windows (its key rule's window), or nil
// when it carries none, or one that is not authentic and unexpired for action and its key (that
// outcome counted): such a token is no token, and the request goes on as without one, with no
// early answer. Whether the device was revoked is the store's to say, in the windows' own round
// trip (countDevice counts it then).
func (l *Limiter) deviceOf(action Action, subject Subject, windows []chained, now time.Time) *db.RateLimitDeviceParams {
	if subject.Device == "" {
		return nil
	}
	t, outcome := l.devices.verify(action, subject.Key, subject.Device, now, l.deviceTTL)
	keyWindow := slices.IndexFunc(windows, func(c chained) bool { return c.rule.Scope == ScopeKey })
	if outcome == deviceTrusted && keyWindow < 0 { // a key rule left out of the request
		outcome = deviceForged
	}
	if outcome != deviceTrusted {
		l.countOutcome(action, outcome)
		return nil
	}
	bucket := l.keys.deviceKey(action, subject.Key, t.id)
	revocation := l.keys.revocationKey(action, subject.Key)
	return &db.RateLimitDeviceParams{Window: keyWindow, KeyHash: bucket[:], RevocationHash: revocation[:], Since: t.since}
}

// countDevice counts what the store found of device: trusted, or revoked. No device counts
// nothing (deviceOf counted a bad token).
func (l *Limiter) countDevice(action Action, device *db.RateLimitDeviceParams, trusted bool) {
	switch {
	case device == nil:
	case trusted:
		l.countOutcome(action, deviceTrusted)
	default:
		l.countOutcome(action, deviceRevoked)
	}
}

func (l *Limiter) countOutcome(action Action, outcome deviceOutcome) {
	observe(l.deviceCounters[action][outcome])
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
