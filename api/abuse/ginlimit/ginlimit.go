// Package ginlimit puts an abuse.Limiter in front of a Gin app's own routes: as middleware that
// spends one request of an action per request (Guard.Limit), or as plain calls inside a handler
// for a login. The client IP is the abuse.IPResolver's (never Gin's ClientIP, whose fallbacks
// differ), and a refusal is answered as postguard's own routes answer one: 429
// application/problem+json with Retry-After, retry_after_seconds and the IETF draft's
// RateLimit-Policy and RateLimit headers. The counters are the Limiter's, in the database, shared
// by every process of the app (and by postguard's limits API when both use the same database and
// secret).
//
// A login handler spends first, and refunds a success:
//
//  1. Guard.Spend before checking the password, with the account as the key and the device
//     cookie (Guard.Device) if the client has one. A refusal has answered 429: check nothing,
//     so at most the key rule's limit of passwords per account per window are ever checked,
//     however many guesses arrive at once.
//  2. On a wrong password, answer the failure: the attempt is counted already.
//  3. On a right one, Guard.Clear the account (its key, and the device), Guard.Refund the IP (a
//     success costs the client nothing), and Guard.IssueDevice, which sets the device cookie:
//     from then on that browser counts its failures in a bucket of its own, so guessers who lock
//     the account lock it for everyone but the owner's known devices.
//
// Guard.Peek spends nothing and serves to show how many attempts are left; it is not a step of the
// pattern (guesses that peek at once all pass before any spends). Guard.RevokeDevices forgets
// every device of an account, after a password change say.
package ginlimit

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/postguard/postguard/api/abuse"
)

// unavailableRetryAfter is the Retry-After, in seconds, of the 503 answered when the limiter's
// database fails: a moment, not a window.
const unavailableRetryAfter = 5

// Config holds a Guard's optional settings. A nil *Config takes every default.
type Config struct {
	// IPResolver finds a request's client IP; nil trusts no proxy (the TCP peer is the client).
	IPResolver *abuse.IPResolver
	// Logger receives the limiter's store errors (answered 503); slog.Default() when nil.
	Logger *slog.Logger
}

// Guard answers Gin requests with a Limiter's decisions. It is safe for concurrent use.
type Guard struct {
	limiter *abuse.Limiter
	ips     *abuse.IPResolver
	logger  *slog.Logger
}

// New returns a Guard over limiter.
func New(limiter *abuse.Limiter, config *Config) *Guard {
	if limiter == nil {
		panic("ginlimit.New: nil limiter")
	}
	if config == nil {
		config = &Config{}
	}
	return &Guard{limiter: limiter, ips: config.IPResolver, logger: cmp.Or(config.Logger, slog.Default())}
}

// Subject returns subject with the request's client IP in it: the subject of the request for
// the email and key the caller names.
func (g *Guard) Subject(c *gin.Context, subject abuse.Subject) abuse.Subject {
	subject.IP = g.ips.ClientIP(c.Request.RemoteAddr, c.Request.Header)
	return subject
}

// Limit is middleware that spends one request of action for each request, for the client IP and
// the email and key subjectFunc returns from the request (nil: the client IP alone). A refused
// request is answered 429 and goes no further; an admitted one carries the RateLimit headers of
// the rule with the fewest requests left.
func (g *Guard) Limit(action abuse.Action, subjectFunc func(c *gin.Context) abuse.Subject) gin.HandlerFunc {
	return func(c *gin.Context) {
		var subject abuse.Subject
		if subjectFunc != nil {
			subject = subjectFunc(c)
		}
		if !g.Spend(c, action, g.Subject(c, subject)) {
			return
		}
		c.Next()
	}
}

// Spend spends one request of action for subject (see Subject) and writes the decision's
// RateLimit headers. It returns true when the request may go on; false once it has answered:
// 429 when a rule refused, 503 when the limiter's database failed (fail closed).
func (g *Guard) Spend(c *gin.Context, action abuse.Action, subject abuse.Subject) bool {
	return g.answer(c, action, "spend", func() (*abuse.Decision, error) {
		return g.limiter.Allow(c.Request.Context(), action, subject)
	})
}

// Peek checks action's rules for subject without spending anything, and answers as Spend does:
// true while every rule has requests left, false once it answered 429 (or 503). Its RateLimit
// headers say how many attempts are left. It guards nothing by itself: requests that peek at once
// all pass before any of them spends, so a login spends first (see the package doc).
func (g *Guard) Peek(c *gin.Context, action abuse.Action, subject abuse.Subject) bool {
	return g.answer(c, action, "peek", func() (*abuse.Decision, error) {
		return g.limiter.Peek(c.Request.Context(), action, subject)
	})
}

// Clear starts subject's current windows of action afresh, for the scopes subject names (see
// abuse.Limiter.Clear): a login that succeeded clears the account's key (with the request's
// device, the device's own bucket instead), and leaves its IP's failures counted. It returns
// false once it has answered 503, when the database failed.
func (g *Guard) Clear(c *gin.Context, action abuse.Action, subject abuse.Subject) bool {
	return g.do(c, action, "clear", func(ctx context.Context) error { return g.limiter.Clear(ctx, action, subject) })
}

// Refund gives one request back to subject's current windows of action, for the scopes subject
// names (see abuse.Limiter.Refund): a login that succeeded refunds its IP, so that successes cost
// a client nothing while its failures still count. It returns false once it has answered 503.
func (g *Guard) Refund(c *gin.Context, action abuse.Action, subject abuse.Subject) bool {
	return g.do(c, action, "refund", func(ctx context.Context) error { return g.limiter.Refund(ctx, action, subject) })
}

// DeviceCookiePrefix starts the name of a trusted-device cookie; the action follows
// (DeviceCookieName). The __Host- prefix makes browsers keep the cookie only when it is Secure,
// for the whole host (Path=/) and no other (no Domain), so no subdomain can set or read it.
const DeviceCookiePrefix = "__Host-postguard-device-"

// DeviceCookieName is the name of action's trusted-device cookie, e.g.
// "__Host-postguard-device-login".
func DeviceCookieName(action abuse.Action) string { return DeviceCookiePrefix + string(action) }

// Device returns the request's trusted-device token of action, from its cookie: "" when it has
// none. Put it in the subject's Device; whatever the cookie holds, a token that does not stand is
// counted as no token.
func (g *Guard) Device(c *gin.Context, action abuse.Action) string {
	cookie, err := c.Request.Cookie(DeviceCookieName(action))
	if err != nil {
		return ""
	}
	return cookie.Value
}

// IssueDevice issues a trusted-device token for key (the account whose login just succeeded) and
// sets it as action's device cookie: __Host- prefixed, Secure, HttpOnly (no script reads it),
// SameSite=Lax (no other site's request carries it), Path=/, for the limiter's DeviceTokenTTL.
// A login that succeeds issues a new one each time, so the cookie's life starts afresh. It
// returns false once it has answered 503 (the database failed; no cookie is set).
func (g *Guard) IssueDevice(c *gin.Context, action abuse.Action, key string) bool {
	var token string
	ok := g.do(c, action, "issue device", func(ctx context.Context) (err error) {
		token, err = g.limiter.IssueDevice(ctx, action, key)
		return err
	})
	if !ok {
		return false
	}
	http.SetCookie(c.Writer, &http.Cookie{
		Name:     DeviceCookieName(action),
		Value:    token,
		Path:     "/",
		MaxAge:   int(g.limiter.DeviceTokenTTL() / time.Second),
		Secure:   true,
		HttpOnly: true,
		SameSite: http.SameSiteLaxMode,
	})
	return true
}

// RevokeDevices revokes every trusted device of key for action, in every process (see
// abuse.Limiter.RevokeDevices): after a password change, say. It returns false once it has
// answered 503.
func (g *Guard) RevokeDevices(c *gin.Context, action abuse.Action, key string) bool {
	return g.do(c, action, "revoke devices", func(ctx context.Context) error { return g.limiter.RevokeDevices(ctx, action, key) })
}

// do runs op, and answers 503 when it fails.
func (g *Guard) do(c *gin.Context, action abuse.Action, op string, fn func(ctx context.Context) error) bool {
	if err := fn(c.Request.Context()); err != nil {
		g.unavailable(c, action, op, err)
		return false
	}
	return true
}

// answer writes the decide's answer: its headers, and the 429 of a refusal or the 503 of an error.
func (g *Guard) answer(c *gin.Context, action abuse.Action, op string, decide func() (*abuse.Decision, error)) bool {
	decision, err := decide()
	if err != nil {
		g.unavailable(c, action, op, err)
		return false
	}
	decision.SetHeaders(c.Writer.Header())
	if decision.Allowed {
		return true
	}
	retryAfter := decision.RetryAfterSeconds()
	writeProblem(c, http.StatusTooManyRequests, fmt.Sprintf("Too many requests; retry in %d seconds.", retryAfter), map[string]any{"retry_after_seconds": retryAfter})
	return false
}

// unavailable logs err and answers 503 with Retry-After: without its counters the limiter
// cannot tell, and a guard that let everything through while its database is down would be no
// guard.
func (g *Guard) unavailable(c *gin.Context, action abuse.Action, op string, err error) {
	g.logger.WarnContext(c.Request.Context(), "rate limiter unavailable",
		slog.String("action", string(action)), slog.String("op", op), slog.String("error", err.Error()))
	c.Header("Retry-After", strconv.Itoa(unavailableRetryAfter))
	writeProblem(c, http.StatusServiceUnavailable, "The service cannot answer right now; retry later.", nil)
}

// writeProblem aborts the request with an RFC 9457 problem, as postguard's own routes write
// theirs.
func writeProblem(c *gin.Context, status int, detail string, extra map[string]any) {
	body := make(map[string]any, 4+len(extra))
	for k, v := range extra {
		body[k] = v
	}
	body["type"] = "about:blank"
	body["title"] = http.StatusText(status)
	body["status"] = status
	body["detail"] = detail
	data, _ := json.Marshal(body) //nolint:errchkjson // strings and integers only
	c.Header("Cache-Control", "no-store")
	c.Data(status, "application/problem+json", data)
	c.Abort()
}
