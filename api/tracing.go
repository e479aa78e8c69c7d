package api

import (
	"net/http"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// tracerScope is the instrumentation scope of the spans the router starts.
const tracerScope = "github.com/postguard/postguard/api"

// untracedRoutes are the routes whose requests get no span: probes and scrapes, which arrive
// every few seconds whatever happens and would bury the requests worth a look.
var untracedRoutes = map[string]bool{ //nolint:gochecknoglobals // a constant table
	"/healthz": true,
	"/readyz":  true,
	"/metrics": true,
}

// traceRequest starts the span of a request, a child of nothing: named by its method and route
// pattern ("POST /v1/auth/register"; the method alone for a path no route has), never by its
// path or query, which may carry an address or a token. Its attributes are the method, the route
// and the status, and nothing else of the request: no URL, no client address, no user agent, no
// header. A W3C traceparent the client sent becomes a link, not the parent: the routes are
// public, and a client must not choose the trace, nor its sampling, of postguard's work.
func (s *server) traceRequest(c *gin.Context) {
	route := c.FullPath()
	if untracedRoutes[route] {
		c.Next()
		return
	}
	method := methodOf(c)
	name := method
	if route != "" {
		name += " " + route
	}
	opts := []trace.SpanStartOption{
		trace.WithNewRoot(),
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(semconv.HTTPRequestMethodKey.String(method)),
	}
	if route != "" {
		opts = append(opts, trace.WithAttributes(semconv.HTTPRoute(route)))
	}
	remote := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(c.Request.Context(), propagation.HeaderCarrier(c.Request.Header)))
	if remote.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: remote}))
	}

	ctx, span := s.tracer.Start(c.Request.Context(), name, opts...)
	defer span.End()
	c.Request = c.Request.WithContext(ctx)
	c.Next()

	status := c.Writer.Status()
	span.SetAttributes(semconv.HTTPResponseStatusCode(status))
	if status >= http.StatusInternalServerError {
		span.SetStatus(codes.Error, "")
	}
}
