package abuse

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Action is a guarded auth action. Its value appears in rate-limit keys, metric labels and (in
// upper case) in the RATE_LIMIT_<ACTION>_<SCOPE> variables, so it never changes once deployed.
type Action string

const (
	ActionRegister           Action = "register"
	ActionForgotPassword     Action = "forgot_password"
	ActionResendVerification Action = "resend_verification"
	ActionResetPassword      Action = "reset_password"
	// ActionRiverUILogin counts failed basic-auth logins to River UI: the api package peeks at
	// it before checking credentials and spends it only when they are wrong.
	ActionRiverUILogin Action = "riverui_login"
)

// Scope is what a rule counts requests by.
type Scope string

const (
	// ScopeIP counts by client IP (IPv4 address, or IPv6 /64; see BucketKey).
	ScopeIP Scope = "ip"
	// ScopeEmail counts by normalised email address.
	ScopeEmail Scope = "email"
)

// Rule allows Limit requests of one action per Window, counted per Scope, in fixed windows
// aligned on the Unix epoch.
type Rule struct {
	Action Action
	Scope  Scope
	Limit  int64
	Window time.Duration
}

// EnvName is the environment variable that overrides the rule, e.g. RATE_LIMIT_REGISTER_IP.
func (r Rule) EnvName() string {
	return "RATE_LIMIT_" + strings.ToUpper(string(r.Action)) + "_" + strings.ToUpper(string(r.Scope))
}

// PolicyName names the rule in the RateLimit-Policy and RateLimit headers, e.g. "register-ip"
// or "forgot-password-email".
func (r Rule) PolicyName() string {
	return strings.ReplaceAll(string(r.Action), "_", "-") + "-" + strings.ReplaceAll(string(r.Scope), "_", "-")
}

// String renders the rule as in its variable, e.g. "register-ip 5/15m0s".
func (r Rule) String() string {
	return r.PolicyName() + " " + strconv.FormatInt(r.Limit, 10) + "/" + r.Window.String()
}

// Validate reports whether the rule can be enforced: an action of lower-case letters, digits and
// underscores (it is part of keys, metric labels and variable names), the scope ip or email, a
// limit of at least 1 and a window of whole seconds, at least one.
func (r Rule) Validate() error {
	if !validName(string(r.Action)) {
		return fmt.Errorf("invalid rate-limit action %q: want lower-case letters, digits and underscores", r.Action)
	}
	switch r.Scope {
	case ScopeIP, ScopeEmail:
	default:
		return fmt.Errorf("invalid rate-limit scope %q for action %s: want %q or %q", r.Scope, r.Action, ScopeIP, ScopeEmail)
	}
	if err := validateLimit(r.Limit, r.Window); err != nil {
		return fmt.Errorf("rate limit %s: %w", r.PolicyName(), err)
	}
	return nil
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

func validateLimit(limit int64, window time.Duration) error {
	if limit < 1 {
		return fmt.Errorf("limit %d must be at least 1", limit)
	}
	if window < time.Second {
		return fmt.Errorf("window %s must be at least 1s", window)
	}
	// Windows are whole seconds: the RateLimit-Policy header states them in seconds, and whole
	// seconds keep window_start exact in both engines' microsecond timestamps.
	if window%time.Second != 0 {
		return fmt.Errorf("window %s must be a whole number of seconds", window)
	}
	return nil
}

// ParseLimit parses a rule's value as in RATE_LIMIT_* variables: N/DURATION, where N is a
// positive integer and DURATION a Go duration of whole seconds, at least 1s ("5/15m", "3/1h",
// "100/90s").
func ParseLimit(s string) (limit int64, window time.Duration, err error) {
	const want = "want N/DURATION with N ≥ 1 and DURATION ≥ 1s in whole seconds, e.g. 5/15m or 3/1h"

	nStr, durStr, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, fmt.Errorf("invalid rate limit %q: missing '/': %s", s, want)
	}
	nStr, durStr = strings.TrimSpace(nStr), strings.TrimSpace(durStr)

	limit, err = strconv.ParseInt(nStr, 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("invalid rate limit %q: count %q is not an integer: %s", s, nStr, want)
	}
	window, err = time.ParseDuration(durStr)
	if err != nil {
		return 0, 0, fmt.Errorf("invalid rate limit %q: window %q is not a duration: %s", s, durStr, want)
	}
	if err := validateLimit(limit, window); err != nil {
		return 0, 0, fmt.Errorf("invalid rate limit %q: %w: %s", s, err, want)
	}
	return limit, window, nil
}

// Rules is the set of rules a Limiter enforces, at most one per action and scope. The zero value
// holds no rule; a Rules value is never changed in place (With returns a copy), so it is safe to
// share.
type Rules struct {
	rules []Rule // in All order
}

// DefaultRules returns the table of docs/api.md, Rate limits:
//
//	action               per IP     per email
//	register             5 / 15m    3 / 1h
//	forgot_password      5 / 15m    3 / 1h
//	resend_verification  6 / 15m    3 / 30m
//	reset_password       10 / 15m   —
//	riverui_login        10 / 15m   —   (failed River UI logins)
func DefaultRules() Rules {
	return Rules{rules: []Rule{
		{Action: ActionRegister, Scope: ScopeIP, Limit: 5, Window: 15 * time.Minute},
		{Action: ActionRegister, Scope: ScopeEmail, Limit: 3, Window: time.Hour},
		{Action: ActionForgotPassword, Scope: ScopeIP, Limit: 5, Window: 15 * time.Minute},
		{Action: ActionForgotPassword, Scope: ScopeEmail, Limit: 3, Window: time.Hour},
		{Action: ActionResendVerification, Scope: ScopeIP, Limit: 6, Window: 15 * time.Minute},
		{Action: ActionResendVerification, Scope: ScopeEmail, Limit: 3, Window: 30 * time.Minute},
		{Action: ActionResetPassword, Scope: ScopeIP, Limit: 10, Window: 15 * time.Minute},
		{Action: ActionRiverUILogin, Scope: ScopeIP, Limit: 10, Window: 15 * time.Minute},
	}}
}

// All returns a copy of the rules in a stable order: the order they were added, the table's
// order for DefaultRules.
func (r Rules) All() []Rule {
	return append([]Rule(nil), r.rules...)
}

// Get returns the rule of an action and scope; ok is false when there is none (that scope of the
// action is not limited).
func (r Rules) Get(action Action, scope Scope) (rule Rule, ok bool) {
	for _, rule := range r.rules {
		if rule.Action == action && rule.Scope == scope {
			return rule, true
		}
	}
	return Rule{}, false
}

// With returns a copy of r in which rule replaces the rule of the same action and scope, or is
// added after the others when there is none. It does not validate rule (see Rule.Validate).
func (r Rules) With(rule Rule) Rules {
	rules := make([]Rule, 0, len(r.rules)+1)
	replaced := false
	for _, existing := range r.rules {
		if existing.Action == rule.Action && existing.Scope == rule.Scope {
			existing, replaced = rule, true
		}
		rules = append(rules, existing)
	}
	if !replaced {
		rules = append(rules, rule)
	}
	return Rules{rules: rules}
}

// Validate checks every rule (see Rule.Validate).
func (r Rules) Validate() error {
	var errs []error
	for _, rule := range r.rules {
		if err := rule.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// WithEnv returns a copy of r in which every rule whose variable (Rule.EnvName) is set overrides
// the limit and window of that rule. lookupEnv is os.LookupEnv in production. An empty value
// keeps the rule; an invalid one is an error naming the variable.
func (r Rules) WithEnv(lookupEnv func(key string) (string, bool)) (Rules, error) {
	out := r
	for _, rule := range r.rules {
		value, ok := lookupEnv(rule.EnvName())
		if !ok || strings.TrimSpace(value) == "" {
			continue
		}
		limit, window, err := ParseLimit(value)
		if err != nil {
			return Rules{}, fmt.Errorf("%s: %w", rule.EnvName(), err)
		}
		rule.Limit, rule.Window = limit, window
		out = out.With(rule)
	}
	return out, nil
}
