package api

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"unicode/utf8"

	"github.com/gin-gonic/gin"

	"github.com/postguard/postguard/api/abuse"
)

// MinLimitsTokenLen is the shortest Config.LimitsToken accepted (LIMITS_API_TOKEN): as for
// APP_SECRET, 32 bytes, so that guessing it is hopeless.
const MinLimitsTokenLen = 32

// limitsRealm names the limits API in WWW-Authenticate.
const limitsRealm = "postguard limits"

// maxLimitsKeyLen bounds the key of a limits request, in bytes: an account id or an API key's id
// fits many times over, and the key is hashed, never stored.
const maxLimitsKeyLen = 256

// limitsRequest is the body of the /v1/limits routes: the subject's value of each scope, each
// optional as the action's rules need.
type limitsRequest struct {
	IP    string `json:"ip"`
	Email string `json:"email"`
	Key   string `json:"key"`
}

// limitsAnswer is the 200 answer of a spend or a peek the limiter admitted: the rule with the
// fewest requests left, as its RateLimit headers say too.
type limitsAnswer struct {
	Allowed           bool   `json:"allowed"`
	Policy            string `json:"policy"`
	Limit             int64  `json:"limit"`
	Remaining         int64  `json:"remaining"`
	ResetAfterSeconds int64  `json:"reset_after_seconds"`
}

var (
	errLimitsUnauthorized = newError(http.StatusUnauthorized, "A valid bearer token (LIMITS_API_TOKEN) is required.")
	errUnknownAction      = newError(http.StatusNotFound, "No custom rate-limit action of that name is configured (RATE_LIMIT_<ACTION>_<SCOPE>).")
	errPeekValue          = badRequest("The peek parameter must be true or false.", nil)
)

// mountLimits adds the limits API under group (/v1): POST /limits/{action} spends (or, with
// ?peek=true, only checks) one request of a custom action for the subject in the body, DELETE
// clears the subject's counters of the action's current windows. Every route wants the bearer
// token first, so nobody without it learns which actions exist.
func (s *server) mountLimits(group *gin.RouterGroup, token string) {
	limits := group.Group("/limits", s.handle(bearerAuth(token, limitsRealm, errLimitsUnauthorized)))
	limits.POST("/:action", s.handle(s.limitsSpend))
	limits.DELETE("/:action", s.handle(s.limitsClear))
}

// limitsSpend is POST /v1/limits/{action}: it spends one request of the action for the subject
// (or, with ?peek=true, checks without spending) and answers as the auth routes do: 200 with the
// decision and the RateLimit headers, or 429 with Retry-After. Every rule of the action needs its
// value in the body (422 naming each one missing).
func (s *server) limitsSpend(c *gin.Context) error {
	action, err := s.limitsAction(c)
	if err != nil {
		return err
	}
	peek := false
	switch c.Query("peek") {
	case "", "false":
	case "true":
		peek = true
	default:
		return errPeekValue
	}
	subject, given, err := decodeLimitsSubject(c)
	if err != nil {
		return err
	}
	var missing []fieldError
	for _, scope := range s.limiter.Scopes(action) {
		if !given[scope] {
			missing = append(missing, fieldError{Pointer: "#/" + string(scope), Detail: fmt.Sprintf("The action's %s rule needs %s.", scope, scopeValueName(scope))})
		}
	}
	if len(missing) > 0 {
		return validationError(missing)
	}

	ctx := c.Request.Context()
	decide := s.limiter.Allow
	if peek {
		decide = s.limiter.Peek
	}
	decision, err := decide(ctx, action, subject)
	if err != nil {
		return fmt.Errorf("error checking rate limit: %w", err)
	}
	decision.SetHeaders(c.Writer.Header())
	if !decision.Allowed {
		return tooManyRequests(decision)
	}
	return writeJSON(c, http.StatusOK, limitsAnswer{
		Allowed:           true,
		Policy:            decision.Rule.PolicyName(),
		Limit:             decision.Rule.Limit,
		Remaining:         decision.Remaining,
		ResetAfterSeconds: decision.RetryAfterSeconds(),
	})
}

// limitsClear is DELETE /v1/limits/{action}: it clears the subject's counters of the action's
// current windows, for the values the body names (a login that succeeded names the key and leaves
// the IP's failures counted), and answers 204. At least one of the action's values is needed.
func (s *server) limitsClear(c *gin.Context) error {
	action, err := s.limitsAction(c)
	if err != nil {
		return err
	}
	subject, given, err := decodeLimitsSubject(c)
	if err != nil {
		return err
	}
	scopes := s.limiter.Scopes(action)
	named := false
	for _, scope := range scopes {
		named = named || given[scope]
	}
	if !named {
		fields := make([]string, len(scopes))
		for i, scope := range scopes {
			fields[i] = string(scope)
		}
		detail := fmt.Sprintf("Name the counters to clear: give at least one of %s.", strings.Join(fields, ", "))
		var fieldErrs []fieldError
		for _, field := range fields {
			fieldErrs = append(fieldErrs, fieldError{Pointer: "#/" + field, Detail: detail})
		}
		return &Error{Status: http.StatusUnprocessableEntity, Title: http.StatusText(http.StatusUnprocessableEntity), Detail: detail, Extra: map[string]any{"errors": fieldErrs}}
	}
	if err := s.limiter.Clear(c.Request.Context(), action, subject); err != nil {
		return fmt.Errorf("error clearing rate limit: %w", err)
	}
	c.Status(http.StatusNoContent)
	return nil
}

// limitsAction is the request's {action}: a custom action with rules, else a 404 problem.
// Built-in actions are not served: their counters are postguard's own routes' (a peek at
// forgot_password's email rule would tell who asked about an address lately, the oracle the auth
// routes keep closed).
func (s *server) limitsAction(c *gin.Context) (abuse.Action, error) {
	action := abuse.Action(pathParam(c, "action"))
	if !abuse.ValidActionName(string(action)) || action.BuiltIn() || len(s.limiter.Scopes(action)) == 0 {
		return "", errUnknownAction
	}
	return action, nil
}

// decodeLimitsSubject reads and checks the body of a limits request (JSON only) into a subject,
// and says which scopes it gave a value of. Every value given must be well formed, whether the
// action uses it or not: an ip that does not parse, an email that is not one plain address (it
// is normalised as the auth routes do, so every spelling of a mailbox is one bucket), a key that
// is not UTF-8 or too long, are each a 422.
func decodeLimitsSubject(c *gin.Context) (abuse.Subject, map[abuse.Scope]bool, error) {
	if _, err := bodyKindOf(c, false); err != nil {
		return abuse.Subject{}, nil, err
	}
	var req limitsRequest
	if err := decodeJSON(c, &req); err != nil {
		return abuse.Subject{}, nil, err
	}

	var subject abuse.Subject
	given := map[abuse.Scope]bool{}
	var fieldErrs []fieldError
	if req.IP != "" {
		addr, err := netip.ParseAddr(strings.TrimSpace(req.IP))
		if err != nil {
			fieldErrs = append(fieldErrs, fieldError{Pointer: "#/ip", Detail: "IP must be an IPv4 or IPv6 address, like 198.51.100.7 or 2001:db8::1."})
		} else {
			subject.IP, given[abuse.ScopeIP] = addr.Unmap().WithZone(""), true
		}
	}
	if req.Email != "" {
		subject.Email = checkEmail(req.Email, &fieldErrs)
		given[abuse.ScopeEmail] = subject.Email != ""
	}
	if req.Key != "" {
		if !utf8.ValidString(req.Key) || len(req.Key) > maxLimitsKeyLen {
			fieldErrs = append(fieldErrs, fieldError{Pointer: "#/key", Detail: fmt.Sprintf("Key must be UTF-8 text of at most %d bytes.", maxLimitsKeyLen)})
		} else {
			subject.Key, given[abuse.ScopeKey] = req.Key, true
		}
	}
	if len(fieldErrs) > 0 {
		return abuse.Subject{}, nil, validationError(fieldErrs)
	}
	return subject, given, nil
}

// scopeValueName says what a scope's value is, for the problems.
func scopeValueName(scope abuse.Scope) string {
	switch scope {
	case abuse.ScopeIP:
		return "the client's ip"
	case abuse.ScopeEmail:
		return "an email"
	default:
		return "a key"
	}
}
