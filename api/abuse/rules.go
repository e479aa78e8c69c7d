package abuse

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Action is a guarded action: one of postguard's own auth actions (the constants below), or a
// custom action of a host app's (login above all), named by its RATE_LIMIT_<ACTION>_<SCOPE>
// variables. Its value is lower case, [a-z][a-z0-9_]{0,31}; it appears in rate-limit keys,
// metric labels, the /v1/limits/{action} route and (in upper case) in the variables, so it never
// changes once deployed.
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

// maxActionLen is the longest action name: a short name keeps variable names, metric labels
// and keys readable.
const maxActionLen = 32

// builtInScopes are the scopes each of postguard's own actions counts by: its routes have no
// other value to give (reset-password carries a token, not an address; no built-in route has a
// key).
var builtInScopes = map[Action][]Scope{ //nolint:gochecknoglobals // a constant table
	ActionRegister:           {ScopeIP, ScopeEmail},
	ActionForgotPassword:     {ScopeIP, ScopeEmail},
	ActionResendVerification: {ScopeIP, ScopeEmail},
	ActionResetPassword:      {ScopeIP},
	ActionRiverUILogin:       {ScopeIP},
}

// BuiltIn reports whether a is one of postguard's own actions, which its routes spend; the others
// are custom actions, spent through the limits API or the Go library.
func (a Action) BuiltIn() bool {
	_, ok := builtInScopes[a]
	return ok
}

// Scope is what a rule counts requests by.
type Scope string

const (
	// ScopeIP counts by client IP (IPv4 address, or IPv6 /64; see BucketKey).
	ScopeIP Scope = "ip"
	// ScopeEmail counts by normalised email address.
	ScopeEmail Scope = "email"
	// ScopeKey counts by an opaque key the caller names, such as an account id: custom actions
	// only.
	ScopeKey Scope = "key"
)

// scopeOrder is the order in which an action's rules are checked: IP, then email, then key. A
// request the IP rule refuses spends nothing of the others.
var scopeOrder = [...]Scope{ScopeIP, ScopeEmail, ScopeKey} //nolint:gochecknoglobals // a constant list

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

// Validate reports whether the rule can be enforced: an action matching [a-z][a-z0-9_]{0,31} (it
// is part of keys, metric labels, routes and variable names), the scope ip, email or key (a
// built-in action only the scopes its routes give: see BuiltIn), a limit of at least 1 and a
// window of whole seconds, at least one.
func (r Rule) Validate() error {
	if !ValidActionName(string(r.Action)) {
		return fmt.Errorf("invalid rate-limit action %q: want a letter then letters, digits or underscores, at most %d, in lower case", r.Action, maxActionLen)
	}
	switch r.Scope {
	case ScopeIP, ScopeEmail, ScopeKey:
	default:
		return fmt.Errorf("invalid rate-limit scope %q for action %s: want %q, %q or %q", r.Scope, r.Action, ScopeIP, ScopeEmail, ScopeKey)
	}
	if scopes, builtIn := builtInScopes[r.Action]; builtIn && !slices.Contains(scopes, r.Scope) {
		return fmt.Errorf("the built-in action %s counts by %s only, not by %s", r.Action, joinScopes(scopes), r.Scope)
	}
	if err := validateLimit(r.Limit, r.Window); err != nil {
		return fmt.Errorf("rate limit %s: %w", r.PolicyName(), err)
	}
	return nil
}

// ValidActionName reports whether s can name an action: [a-z][a-z0-9_]{0,31}, the lower-case
// form of a RATE_LIMIT_<ACTION>_<SCOPE> variable's ACTION and of /v1/limits/{action}.
func ValidActionName(s string) bool {
	if s == "" || len(s) > maxActionLen || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for _, c := range []byte(s) {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

func joinScopes(scopes []Scope) string {
	names := make([]string, len(scopes))
	for i, scope := range scopes {
		names[i] = string(scope)
	}
	return strings.Join(names, " and ")
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

// envPrefix starts every rule variable, RATE_LIMIT_<ACTION>_<SCOPE>.
const envPrefix = "RATE_LIMIT_"

// ParseRuleEnv parses one environment variable as a rule. ok is false, with no error, when name
// is not a RATE_LIMIT_ variable or value is empty (an empty value keeps the rule as it was). A
// RATE_LIMIT_ variable is RATE_LIMIT_<ACTION>_<SCOPE>, ACTION matching [A-Z][A-Z0-9_]{0,31} and
// SCOPE one of IP, EMAIL and KEY (split at the last underscore: RATE_LIMIT_LOGIN_KEY_IP is the
// IP rule of LOGIN_KEY), and its value N/DURATION (ParseLimit). Anything else is an error that
// names the variable. A built-in action takes only the scopes its routes give (Rule.Validate).
func ParseRuleEnv(name, value string) (rule Rule, ok bool, err error) {
	rest, isRule := strings.CutPrefix(name, envPrefix)
	if !isRule {
		return Rule{}, false, nil
	}
	const want = "want RATE_LIMIT_<ACTION>_<SCOPE>, ACTION of A-Z, 0-9 and _ (starting with a letter, at most 32) and SCOPE one of IP, EMAIL, KEY"
	i := strings.LastIndexByte(rest, '_')
	if i < 0 {
		return Rule{}, false, fmt.Errorf("%s: not a rule variable: %s", name, want)
	}
	action, scope := rest[:i], rest[i+1:]
	switch scope {
	case "IP", "EMAIL", "KEY":
	default:
		return Rule{}, false, fmt.Errorf("%s: unknown scope %q: %s", name, scope, want)
	}
	if action != strings.ToUpper(action) || !ValidActionName(strings.ToLower(action)) {
		return Rule{}, false, fmt.Errorf("%s: invalid action %q: %s", name, action, want)
	}
	if strings.TrimSpace(value) == "" {
		return Rule{}, false, nil
	}
	limit, window, err := ParseLimit(value)
	if err != nil {
		return Rule{}, false, fmt.Errorf("%s: %w", name, err)
	}
	rule = Rule{Action: Action(strings.ToLower(action)), Scope: Scope(strings.ToLower(scope)), Limit: limit, Window: window}
	if err := rule.Validate(); err != nil {
		return Rule{}, false, fmt.Errorf("%s: %w", name, err)
	}
	return rule, true, nil
}

// WithEnviron returns a copy of r with the rules of every RATE_LIMIT_<ACTION>_<SCOPE> variable
// in environ (os.Environ's "KEY=value" form) applied: one for an existing rule overrides its
// limit and window, one for a new action and scope adds a rule (a custom action). The error
// joins one error per bad variable, each naming it (see ParseRuleEnv).
func (r Rules) WithEnviron(environ []string) (Rules, error) {
	out := r
	var errs []error
	environ = slices.Clone(environ)
	slices.Sort(environ) // new rules in a stable order, whatever the environment's
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		rule, ok, err := ParseRuleEnv(name, value)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok {
			out = out.With(rule)
		}
	}
	if len(errs) > 0 {
		return Rules{}, errors.Join(errs...)
	}
	return out, nil
}

// Actions returns the actions that have at least one rule, in All order.
func (r Rules) Actions() []Action {
	var actions []Action
	for _, rule := range r.rules {
		if !slices.Contains(actions, rule.Action) {
			actions = append(actions, rule.Action)
		}
	}
	return actions
}
