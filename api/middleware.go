package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
)

const (
	// requestIDHeader carries a request's id, in and out. The id is never put in a body, so
	// answers that must be byte-identical stay so.
	requestIDHeader = "X-Request-Id"
	// maxRequestIDLen bounds an incoming id that is honoured.
	maxRequestIDLen = 64

	ctxKeyRequestID = "postguard.request_id"
	ctxKeyHTML      = "postguard.html_answers"
)

// requestID honours a well-formed incoming X-Request-Id (1 to 64 of [A-Za-z0-9._-], so a
// client cannot inject log syntax or a header), else makes a random one, and echoes it in the
// answer's X-Request-Id header.
func (s *server) requestID(c *gin.Context) {
	id := c.GetHeader(requestIDHeader)
	if !validRequestID(id) {
		id = newRequestID()
	}
	c.Set(ctxKeyRequestID, id)
	c.Header(requestIDHeader, id)
	c.Next()
}

func validRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDLen {
		return false
	}
	for i := range len(id) {
		switch b := id[i]; {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9', b == '.', b == '_', b == '-':
		default:
			return false
		}
	}
	return true
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

func requestIDOf(c *gin.Context) string { return c.GetString(ctxKeyRequestID) }

// routeOf is the matched route pattern ("/v1/unsubscribe"), never the raw URL, which may carry a
// token in its query; "unmatched" for a 404, so that labels stay few.
func routeOf(c *gin.Context) string {
	if route := c.FullPath(); route != "" {
		return route
	}
	return "unmatched"
}

// methodOf is the request's method when it is a standard one, else "OTHER", so a client cannot
// mint metric series.
func methodOf(c *gin.Context) string {
	switch m := c.Request.Method; m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return m
	default:
		return "OTHER"
	}
}

// observe writes the access log line and the HTTP metrics of every request. The line has the
// method, the route pattern, the status, the duration, the request id and the bytes written:
// never the query string (tokens), the body (emails, passwords) or the client IP.
func (s *server) observe(c *gin.Context) {
	start := time.Now()
	c.Next()
	elapsed := time.Since(start)

	route, method, status := routeOf(c), methodOf(c), c.Writer.Status()
	s.metrics.requests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
	s.metrics.duration.WithLabelValues(route, method).Observe(elapsed.Seconds())

	level := slog.LevelInfo
	if status >= 500 {
		level = slog.LevelWarn
	}
	s.logger.LogAttrs(c.Request.Context(), level, "HTTP request",
		slog.String("method", method),
		slog.String("route", route),
		slog.Int("status", status),
		slog.Duration("duration", elapsed),
		slog.String("request_id", requestIDOf(c)),
		slog.Int("bytes", max(c.Writer.Size(), 0)),
	)
}

// recoverer turns a panic in a handler into a logged 500 problem. http.ErrAbortHandler is
// re-raised: it is net/http's way to abort a response on purpose.
func (s *server) recoverer(c *gin.Context) {
	defer func() {
		rec := recover()
		if rec == nil {
			return
		}
		if rec == http.ErrAbortHandler { //nolint:errorlint // the sentinel itself is what is panicked
			panic(rec)
		}
		err, ok := rec.(error)
		if !ok {
			err = fmt.Errorf("%v", rec)
		}
		s.logger.ErrorContext(c.Request.Context(), "panic serving request",
			slog.String("request_id", requestIDOf(c)),
			slog.String("route", routeOf(c)),
			slog.String("error", err.Error()),
			slog.String("stack", string(debug.Stack())),
		)
		// errInternal carries no cause, so writeError does not log the panic a second time.
		s.writeError(c, errInternal)
	}()
	c.Next()
}

// requestDeadline gives a /v1 request's context the deadline RequestTimeout: every database call
// takes that context, so with the database unreachable (a connection that never answers, a pool
// waiting for a free connection) the request ends in time and writeError answers 503. Without it,
// nothing would end such a request but the client giving up.
func (s *server) requestDeadline(c *gin.Context) {
	ctx, cancel := context.WithTimeout(c.Request.Context(), s.requestTimeout)
	defer cancel()
	c.Request = c.Request.WithContext(ctx)
	c.Next()
}

// headWithoutBody answers a HEAD request as the GET of its route would, without the body: the
// handler writes its answer as for a GET, its body's bytes are counted and dropped, and the
// answer's Content-Length says how many there were. net/http drops the body of a HEAD on the
// wire anyway; this keeps it out of every other caller of the router too (httptest's).
func headWithoutBody(c *gin.Context) {
	if c.Request.Method != http.MethodHead {
		c.Next()
		return
	}
	w := &headWriter{ResponseWriter: c.Writer}
	c.Writer = w
	defer func() { c.Writer = w.ResponseWriter }()
	c.Next()
	if w.size > 0 && w.Header().Get("Content-Length") == "" {
		w.Header().Set("Content-Length", strconv.Itoa(w.size))
	}
	w.ResponseWriter.WriteHeaderNow()
}

// headWriter is the writer of a HEAD request's handlers (headWithoutBody): it keeps the status
// and headers they set, counts the body they write and sends none of it. The headers go out
// once the handlers are done, so that Content-Length can be set.
type headWriter struct {
	gin.ResponseWriter

	size    int
	written bool
}

func (w *headWriter) Write(p []byte) (int, error) {
	w.written = true
	w.size += len(p)
	return len(p), nil
}

func (w *headWriter) WriteString(s string) (int, error) {
	w.written = true
	w.size += len(s)
	return len(s), nil
}

func (w *headWriter) WriteHeaderNow() { w.written = true }

// Flush sends nothing: the headers leave when the handlers are done.
func (w *headWriter) Flush() {}

func (w *headWriter) Written() bool { return w.written || w.ResponseWriter.Written() }

func (w *headWriter) Size() int {
	if !w.Written() {
		return -1
	}
	return w.size
}

// refuseDotSegments answers a request whose path holds a dot segment (".", "..", or either
// percent-encoded) with the 404 of a path no route has. The router never resolves them (see
// newServer), so such a path could only reach a route as a parameter's value, an address or
// an id that it is not; refused here, it reaches no handler at all, River UI's included.
func (s *server) refuseDotSegments(c *gin.Context) {
	for segment := range strings.SplitSeq(c.Request.URL.EscapedPath(), "/") {
		if decoded, err := url.PathUnescape(segment); err == nil && (decoded == "." || decoded == "..") {
			s.writeError(c, errNotFound)
			c.Abort()
			return
		}
	}
	c.Next()
}

// pathParam is the route parameter name, percent-decoded. Routes match the escaped path, so
// Gin's parameters are as sent (a%2Fb@example.com); the escaped path is valid by construction,
// so decoding cannot fail.
func pathParam(c *gin.Context, name string) string {
	raw := c.Param(name)
	if decoded, err := url.PathUnescape(raw); err == nil {
		return decoded
	}
	return raw
}

// limitBody caps the body at MaxBodyBytes: reading past it fails with *http.MaxBytesError, which
// writeError answers 413 (as a page for a form post). The check happens when the handler reads,
// not here, so that the 413 carries the route's headers (the token pages' ones) and format; the
// reader stops at the limit whatever Content-Length says.
func (s *server) limitBody(c *gin.Context) {
	if c.Request.Body != nil {
		// net/http's own writer, so that it closes the connection after an oversized body
		// rather than reading the rest of it.
		var w http.ResponseWriter = c.Writer
		if u, ok := c.Writer.(interface{ Unwrap() http.ResponseWriter }); ok {
			w = u.Unwrap()
		}
		c.Request.Body = http.MaxBytesReader(w, c.Request.Body, MaxBodyBytes)
	}
	c.Next()
}

// securityHeaders sets headers that every answer should carry.
func securityHeaders(c *gin.Context) {
	c.Header("X-Content-Type-Options", "nosniff")
	c.Next()
}

// httpMetrics are the router's Prometheus collectors.
type httpMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newHTTPMetrics(reg prometheus.Registerer) (*httpMetrics, error) {
	requests, err := registerOrReuse(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "postguard_http_requests_total",
		Help: "HTTP requests answered, by route pattern, method and status.",
	}, []string{"route", "method", "status"}))
	if err != nil {
		return nil, err
	}
	duration, err := registerOrReuse(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "postguard_http_request_duration_seconds",
		Help:    "Time to answer HTTP requests, by route pattern and method.",
		Buckets: prometheus.DefBuckets,
	}, []string{"route", "method"}))
	if err != nil {
		return nil, err
	}
	return &httpMetrics{requests: requests, duration: duration}, nil
}

// registerOrReuse registers c, or returns the collector registered already under its name (a
// second router on the same registry, as `serve` has none but tests do).
func registerOrReuse[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	if err := reg.Register(c); err != nil {
		var already prometheus.AlreadyRegisteredError
		if errors.As(err, &already) {
			if existing, ok := already.ExistingCollector.(T); ok {
				return existing, nil
			}
		}
		var zero T
		return zero, fmt.Errorf("error registering HTTP metrics: %w", err)
	}
	return c, nil
}

// wantsHTML says the request came from one of the service's HTML pages (a form post or a page
// GET), so errors are answered with an HTML page rather than a problem.
func wantsHTML(c *gin.Context) bool { return c.GetBool(ctxKeyHTML) }

// answerHTML marks the request as one whose answers, errors included, are HTML pages.
func answerHTML(c *gin.Context) { c.Set(ctxKeyHTML, true) }
