package api

import (
	"fmt"
	"net/http"
	"net/netip"
	"slices"
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
// optional as the action's rules need, and the trusted-device token the client carries, if any.
type limitsRequest struct {
	IP     string `json:"ip"`
	Email  string `json:"email"`
	Key    string `json:"key"`
	Device string `json:"device"`
}

// limitsDeviceRequest is the body of the devices routes: the key (account) whose devices they
// issue or revoke.
type limitsDeviceRequest struct {
	Key string `json:"key"`
}

// limitsDeviceAnswer is the 201 answer of a device issued: the token, for the host to give the
// client (a cookie) and send back as "device" with its later requests.
type limitsDeviceAnswer struct {
	Device string `json:"device"`
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
// clears the subject's counters of the action's current windows, POST …/refund gives one request
// back to them, and …/devices issues (POST) and revokes (DELETE) a key's trusted devices. Every
// route wants the bearer token first, so nobody without it learns which actions exist.
func (s *server) mountLimits(group *gin.RouterGroup, token string) {
	limits := group.Group("/limits", s.handle(bearerAuth(token, limitsRealm, errLimitsUnauthorized)))
	limits.POST("/:action", s.handle(s.limitsSpend))
	limits.DELETE("/:action", s.handle(s.limitsClear))
	limits.POST("/:action/refund", s.handle(s.limitsRefund))
	limits.POST("/:action/devices", s.handle(s.limitsIssueDevice))
	limits.DELETE("/:action/devices", s.handle(s.limitsRevokeDevices))
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
// the IP's failures counted; with its device, the device's bucket is cleared instead of the
// account's), and answers 204. At least one of the action's values is needed.
func (s *server) limitsClear(c *gin.Context) error {
	action, subject, err := s.namedLimitsSubject(c, "clear")
	if err != nil {
		return err
	}
	if err := s.limiter.Clear(c.Request.Context(), action, subject); err != nil {
		return fmt.Errorf("error clearing rate limit: %w", err)
	}
	c.Status(http.StatusNoContent)
	return nil
}

// limitsRefund is POST /v1/limits/{action}/refund: it gives one request back to the subject's
// current windows of the action, for the values the body names, never below zero, and answers
// 204. A login that succeeded refunds its IP. At least one of the action's values is needed.
func (s *server) limitsRefund(c *gin.Context) error {
	action, subject, err := s.namedLimitsSubject(c, "refund")
	if err != nil {
		return err
	}
	if err := s.limiter.Refund(c.Request.Context(), action, subject); err != nil {
		return fmt.Errorf("error refunding rate limit: %w", err)
	}
	c.Status(http.StatusNoContent)
	return nil
}

// namedLimitsSubject reads the action and the body of a clear or a refund (doing says which):
// the body must name at least one of the action's values (a 422 that lists them, otherwise).
func (s *server) namedLimitsSubject(c *gin.Context, doing string) (abuse.Action, abuse.Subject, error) {
	action, err := s.limitsAction(c)
	if err != nil {
		return "", abuse.Subject{}, err
	}
	subject, given, err := decodeLimitsSubject(c)
	if err != nil {
		return "", abuse.Subject{}, err
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
		detail := fmt.Sprintf("Name the counters to %s: give at least one of %s.", doing, strings.Join(fields, ", "))
		var fieldErrs []fieldError
		for _, field := range fields {
			fieldErrs = append(fieldErrs, fieldError{Pointer: "#/" + field, Detail: detail})
		}
		return "", abuse.Subject{}, &Error{Status: http.StatusUnprocessableEntity, Title: http.StatusText(http.StatusUnprocessableEntity), Detail: detail, Extra: map[string]any{"errors": fieldErrs}}
	}
	return action, subject, nil
}

// limitsIssueDevice is POST /v1/limits/{action}/devices: it issues a trusted-device token for the
// key in the body, and answers 201 with it. A host issues one after a right password and gives it
// to the client (a cookie), whose later requests carry it as "device".
func (s *server) limitsIssueDevice(c *gin.Context) error {
	action, key, err := s.limitsDeviceKey(c)
	if err != nil {
		return err
	}
	device, err := s.limiter.IssueDevice(c.Request.Context(), action, key)
	if err != nil {
		return fmt.Errorf("error issuing device: %w", err)
	}
	return writeJSON(c, http.StatusCreated, limitsDeviceAnswer{Device: device})
}

// limitsRevokeDevices is DELETE /v1/limits/{action}/devices: it revokes every device of the key in
// the body, in every process at once, and answers 204. A host revokes them after a password
// change, say.
func (s *server) limitsRevokeDevices(c *gin.Context) error {
	action, key, err := s.limitsDeviceKey(c)
	if err != nil {
		return err
	}
	if err := s.limiter.RevokeDevices(c.Request.Context(), action, key); err != nil {
		return fmt.Errorf("error revoking devices: %w", err)
	}
	c.Status(http.StatusNoContent)
	return nil
}

// limitsDeviceKey reads the action and the key of a devices request: an action with a key rule
// (a device counts in nothing else), and a key like the spend's.
func (s *server) limitsDeviceKey(c *gin.Context) (abuse.Action, string, error) {
	action, err := s.limitsAction(c)
	if err != nil {
		return "", "", err
	}
	if _, err := bodyKindOf(c, false); err != nil {
		return "", "", err
	}
	var req limitsDeviceRequest
	if err := decodeJSON(c, &req); err != nil {
		return "", "", err
	}
	switch {
	case !slices.Contains(s.limiter.Scopes(action), abuse.ScopeKey):
		return "", "", validationError([]fieldError{{Pointer: "#/key", Detail: "The action has no key rule (RATE_LIMIT_<ACTION>_KEY), which a device counts in."}})
	case req.Key == "" || !utf8.ValidString(req.Key) || len(req.Key) > maxLimitsKeyLen:
		return "", "", validationError([]fieldError{{Pointer: "#/key", Detail: fmt.Sprintf("Key must be UTF-8 text of 1 to %d bytes.", maxLimitsKeyLen)}})
	}
	return action, req.Key, nil
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
// is not UTF-8 or too long, are each a 422. The device is the one value never refused.
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
	// The device is not checked here: a token that is malformed, forged, expired or revoked is no
	// token, answered exactly as a request without one (the limiter counts what it was).
	subject.Device = req.Device
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
