package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"fmt"
	"hash/fnv"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/postguard/postguard/api/abuse"
)

// readyTimeout bounds the database ping of /readyz: a probe must answer quickly, and a database
// that takes longer is not ready for traffic.
const readyTimeout = 2 * time.Second

// openAPIDocument is the contract of this router, served at /openapi.yaml; the tests check
// every answer against it.
//
//go:embed openapi.yaml
var openAPIDocument []byte

// healthz is liveness: the process answers, whatever the database does.
func (s *server) healthz(c *gin.Context) {
	c.Header("Cache-Control", "no-store")
	c.Data(http.StatusOK, mediaJSON, []byte(`{"status":"ok"}`))
}

// readyz is readiness: 200 while the database takes a small write (its heartbeat) within
// readyTimeout, else 503. A ping would pass on a database that answers but cannot be written (a
// read-only PostgreSQL after a failover, a full or failing SQLite file), where every request
// that writes would fail.
func (s *server) readyz(c *gin.Context) error {
	c.Header("Cache-Control", "no-store")
	ctx, cancel := context.WithTimeout(c.Request.Context(), readyTimeout)
	defer cancel()
	if err := s.store.Ready(ctx); err != nil {
		return newError(http.StatusServiceUnavailable, "The database is unreachable or cannot be written.").withCause(err)
	}
	c.Data(http.StatusOK, mediaJSON, []byte(`{"status":"ready"}`))
	return nil
}

// serveOpenAPI serves the embedded OpenAPI document.
func serveOpenAPI(c *gin.Context) {
	c.Data(http.StatusOK, "application/yaml", openAPIDocument)
}

// mountRiverUI mounts River UI's handler at /riverui/ and redirects /riverui there. Every request
// passes, in order: the anti-framing headers (River UI sets none, and a framed UI could be
// clicked through by another site); the cross-site check (refuseCrossSite), so that a page
// elsewhere cannot use the browser's cached credentials to change jobs; the failed-login limit
// and HTTP basic auth (riverUIAuth). The handler gets the whole path (it was created with the
// prefix /riverui).
func (s *server) mountRiverUI(engine *gin.Engine, handler http.Handler, username, password string) {
	get(engine, "/riverui", denyFraming, func(c *gin.Context) {
		c.Redirect(http.StatusMovedPermanently, "/riverui/")
	})
	engine.Any("/riverui/*path", denyFraming, s.handle(s.refuseCrossSite), s.handle(s.riverUIAuth(username, password)), gin.WrapH(handler))
}

// denyFraming forbids every answer of the route to be shown in a frame of another page, for
// browsers that know CSP (frame-ancestors) and for older ones (X-Frame-Options).
func denyFraming(c *gin.Context) {
	h := c.Writer.Header()
	h.Set("X-Frame-Options", "DENY")
	h.Set("Content-Security-Policy", "frame-ancestors 'none'")
}

// refuseCrossSite answers 403, before basic auth or River UI sees the request, to a request other
// than GET or HEAD that a browser marks as sent by another site: Sec-Fetch-Site other than
// same-origin (same-site is refused too: a sibling subdomain is not River UI), or an Origin that
// is not the request's own. A browser attaches cached basic-auth credentials to a form that
// another site posts to River UI's API (text/plain needs no CORS preflight), and River UI would
// act on it. Clients that are not browsers send neither header and are not concerned.
func (s *server) refuseCrossSite(c *gin.Context) error {
	r := c.Request
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return nil
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return errCrossSite
	}
	for _, origin := range r.Header.Values("Origin") {
		if !s.ownOrigin(r, origin) {
			return errCrossSite
		}
	}
	return nil
}

// ownOrigin reports whether origin (an Origin header) is the request's own: the scheme and host
// the browser used to reach the service. The host is the request's Host header. The scheme is
// https when the connection is TLS, or when a trusted proxy (TRUSTED_PROXIES) that terminated
// TLS says so in X-Forwarded-Proto, else http. APP_URL's origin is the service's own too, for a
// proxy that rewrites Host. Default ports are ignored, as browsers leave them out of Origin.
func (s *server) ownOrigin(r *http.Request, origin string) bool {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	} else if s.ips.TrustsPeer(r.RemoteAddr) {
		protos := strings.Split(r.Header.Get("X-Forwarded-Proto"), ",")
		if strings.EqualFold(strings.TrimSpace(protos[len(protos)-1]), "https") {
			scheme = "https"
		}
	}
	got, ok := normalizeOrigin(origin)
	if !ok {
		return false // "null" (a sandboxed or opaque origin) or junk: nobody's own
	}
	if own, ok := normalizeOrigin(scheme + "://" + r.Host); ok && got == own {
		return true
	}
	return s.appOrigin != "" && got == s.appOrigin
}

// normalizeOrigin returns origin as scheme://host[:port], lower-cased and without the scheme's
// default port; ok is false unless origin is an http(s) origin and nothing more (no path, query,
// fragment or user).
func normalizeOrigin(origin string) (string, bool) {
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return "", false
	}
	host := strings.ToLower(u.Host)
	if port := u.Port(); (u.Scheme == "http" && port == "80") || (u.Scheme == "https" && port == "443") {
		host = strings.TrimSuffix(host, ":"+port)
	}
	return u.Scheme + "://" + host, true
}

// loginStripes is how many locks serialize River UI logins, by client IP bucket.
const loginStripes = 64

// riverUIAuth is River UI's HTTP basic auth, with a limit on failed logins per client IP
// (abuse.ActionRiverUILogin, 10 per 15 minutes by default) counted in the database, so that it
// holds across API processes. The limit is peeked at first: while it is reached, every request
// is answered 429, right credentials included, or a 200 among the 429s would tell a guesser the
// password. Only a request that carried wrong credentials spends it; one without any (a
// browser's first request, before it prompts) is a 401 challenge that guesses nothing.
//
// Peek, compare, spend is not one statement, so a burst of concurrent guesses could all peek
// before any spends and have more guesses compared than the limit allows. Each process therefore
// runs one client IP's logins one at a time (a lock per stripe of IP buckets): a burst gains
// nothing within a process, and across N processes at most N-1 guesses beyond the limit.
func (s *server) riverUIAuth(username, password string) handlerFunc {
	check := basicAuth(username, password)
	var stripes [loginStripes]sync.Mutex
	return func(c *gin.Context) error {
		// River UI's routes have no request deadline of their own; the lock must not be held
		// for longer than a /v1 request may wait on the database.
		ctx, cancel := context.WithTimeout(c.Request.Context(), s.requestTimeout)
		defer cancel()
		ip := s.ips.ClientIP(c.Request.RemoteAddr, c.Request.Header)
		stripe := fnv.New32a()
		_, _ = stripe.Write([]byte(abuse.BucketKey(ip)))
		mu := &stripes[stripe.Sum32()%loginStripes]
		mu.Lock()
		defer mu.Unlock()

		decision, err := s.limiter.Peek(ctx, abuse.ActionRiverUILogin, abuse.Subject{IP: ip})
		if err != nil {
			return fmt.Errorf("error checking River UI's failed logins: %w", err)
		}
		if !decision.Allowed {
			decision.SetHeaders(c.Writer.Header())
			return tooManyRequests(decision)
		}
		presented, ok := check(c.Request)
		if ok {
			return nil
		}
		if presented {
			decision, err := s.limiter.Allow(ctx, abuse.ActionRiverUILogin, abuse.Subject{IP: ip})
			if err != nil {
				return fmt.Errorf("error counting a failed River UI login: %w", err)
			}
			if !decision.Allowed { // other failures reached the limit meanwhile
				decision.SetHeaders(c.Writer.Header())
				return tooManyRequests(decision)
			}
		}
		c.Header("WWW-Authenticate", `Basic realm="River UI"`)
		return errUnauthorized
	}
}

// basicAuth returns a check of HTTP basic credentials in constant time: it compares SHA-256
// digests (equal lengths whatever was sent), user and password both, without short-circuiting.
// presented says the request carried basic credentials at all.
func basicAuth(username, password string) func(r *http.Request) (presented, ok bool) {
	wantUser, wantPass := sha256.Sum256([]byte(username)), sha256.Sum256([]byte(password))
	return func(r *http.Request) (bool, bool) {
		user, pass, presented := r.BasicAuth()
		gotUser, gotPass := sha256.Sum256([]byte(user)), sha256.Sum256([]byte(pass))
		userOK := subtle.ConstantTimeCompare(gotUser[:], wantUser[:])
		passOK := subtle.ConstantTimeCompare(gotPass[:], wantPass[:])
		return presented, presented && userOK&passOK == 1
	}
}
