// Package ginlimit puts an abuse.Limiter in front of a Gin app's own routes: as middleware that
// spends one request of an action per request (Guard.Limit), or as plain calls inside a handler
// for the failure-counting pattern of a login (Guard.Peek before checking a password,
// Guard.Spend when it was wrong, Guard.Clear when it was right). The client IP is the
// abuse.IPResolver's (never Gin's ClientIP, whose fallbacks differ), and a refusal is answered as
// postguard's own routes answer one: 429 application/problem+json with Retry-After,
// retry_after_seconds and the IETF draft's RateLimit-Policy and RateLimit headers. The counters
// are the Limiter's, in the database, shared by every process of the app (and by postguard's
// limits API when both use the same database and secret).
package ginlimit

import (
	"cmp"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

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
// true while every rule has requests left, false once it answered 429 (or 503). The login
// pattern peeks before it checks a password, so that an exhausted account is refused even with
// the right password, and a right guess among the refusals tells a guesser nothing.
func (g *Guard) Peek(c *gin.Context, action abuse.Action, subject abuse.Subject) bool {
	return g.answer(c, action, "peek", func() (*abuse.Decision, error) {
		return g.limiter.Peek(c.Request.Context(), action, subject)
	})
}

// Clear starts subject's current windows of action afresh, for the scopes subject names (see
// abuse.Limiter.Clear): a login that succeeded clears the account's key, and leaves its IP's
// failures counted. It returns false once it has answered 503, when the database failed.
func (g *Guard) Clear(c *gin.Context, action abuse.Action, subject abuse.Subject) bool {
	if err := g.limiter.Clear(c.Request.Context(), action, subject); err != nil {
		g.unavailable(c, action, "clear", err)
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
