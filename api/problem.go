package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"
)

// Error is an error with a public face: Status, Title and Detail are what the client sees (as
// an RFC 9457 problem), Cause is what the operator sees in the log, never the client. Extra
// holds extension members of the problem (e.g. "retry_after_seconds", "errors").
type Error struct {
	Status int
	Title  string
	Detail string
	Cause  error
	Extra  map[string]any
}

// Error returns the public message, and the cause when there is one.
func (e *Error) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("%d %s: %s: %v", e.Status, e.Title, e.Detail, e.Cause)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Title, e.Detail)
}

// Unwrap returns the private cause.
func (e *Error) Unwrap() error { return e.Cause }

// problemContentType is RFC 9457's media type.
const problemContentType = "application/problem+json"

// newError returns an Error with the standard title of status.
func newError(status int, detail string) *Error {
	return &Error{Status: status, Title: http.StatusText(status), Detail: detail}
}

// withCause returns a copy of e carrying cause (for the log).
func (e *Error) withCause(cause error) *Error {
	c := *e
	c.Cause = cause
	return &c
}

var (
	errNotFound         = newError(http.StatusNotFound, "No route matches the request's path.")
	errMethodNotAllowed = newError(http.StatusMethodNotAllowed, "The route does not accept this method; see the Allow header.")
	errTooLarge         = newError(http.StatusRequestEntityTooLarge, fmt.Sprintf("The request body exceeds %d bytes.", MaxBodyBytes))
	errInvalidToken     = newError(http.StatusBadRequest, "The link is invalid, has expired or has been used already.")
	errEmailTaken       = newError(http.StatusConflict, "An account with this email address exists already.")
	errUnavailable      = newError(http.StatusServiceUnavailable, "The service cannot answer right now; retry later.")
	errInternal         = newError(http.StatusInternalServerError, "Internal server error. The details are in the service's log.")
	errUnauthorized     = newError(http.StatusUnauthorized, "Valid credentials are required.")
	errCrossSite        = newError(http.StatusForbidden, "Changes must be sent from River UI itself, not from another site's page.")
)

// fieldError is one entry of a 422 problem's "errors" member: a JSON pointer into the request
// and what is wrong there.
type fieldError struct {
	Pointer string `json:"pointer"`
	Detail  string `json:"detail"`
}

// validationError returns the 422 problem listing fieldErrs.
func validationError(fieldErrs []fieldError) *Error {
	detail := "The request has invalid fields."
	if len(fieldErrs) == 1 {
		detail = fieldErrs[0].Detail
	}
	return &Error{
		Status: http.StatusUnprocessableEntity,
		Title:  http.StatusText(http.StatusUnprocessableEntity),
		Detail: detail,
		Extra:  map[string]any{"errors": fieldErrs},
	}
}

// badRequest returns a 400 problem about the body's form.
func badRequest(detail string, cause error) *Error {
	return &Error{Status: http.StatusBadRequest, Title: http.StatusText(http.StatusBadRequest), Detail: detail, Cause: cause}
}

// handlerFunc is a route handler that returns its error instead of writing it.
type handlerFunc func(c *gin.Context) error

// handle adapts h to Gin, sending any error it returns through writeError.
func (s *server) handle(h handlerFunc) gin.HandlerFunc {
	return func(c *gin.Context) {
		if err := h(c); err != nil {
			s.writeError(c, err)
		}
	}
}

// writeError is the one place where errors become answers. An *Error is answered as it says (its
// cause, if any, logged at info level, warn for a 503, or error level for another 5xx); a body over the limit is a 413;
// a request whose context ended (the client left, or RequestTimeout passed) and an error saying
// the database cannot be reached (see databaseUnavailable) are a 503 logged at warn level;
// anything else is a generic 500 logged at error level with its message, which the client never
// sees. Every 503 carries Retry-After.
func (s *server) writeError(c *gin.Context, err error) {
	ctx := c.Request.Context()
	attrs := []any{slog.String("request_id", requestIDOf(c)), slog.String("route", routeOf(c))}

	var apiErr *Error
	var maxBytesErr *http.MaxBytesError
	switch {
	case errors.As(err, &apiErr):
		switch {
		case apiErr.Cause == nil: // nothing the operator needs beyond the access log
		case apiErr.Status == http.StatusServiceUnavailable:
			// A state that passes (readyz during an outage, probed every few seconds), not a bug.
			s.logger.WarnContext(ctx, "API error", append(attrs, slog.String("error", err.Error()))...)
		case apiErr.Status >= 500:
			s.logger.ErrorContext(ctx, "API error", append(attrs, slog.String("error", err.Error()))...)
		default:
			s.logger.InfoContext(ctx, "API error", append(attrs, slog.String("error", err.Error()))...)
		}
	case errors.As(err, &maxBytesErr):
		apiErr = errTooLarge
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		s.logger.WarnContext(ctx, "request ended before its answer", append(attrs, slog.String("error", err.Error()))...)
		apiErr = errUnavailable
	case databaseUnavailable(err):
		s.logger.WarnContext(ctx, "database unavailable", append(attrs, slog.String("error", err.Error()))...)
		apiErr = errUnavailable
	default:
		s.logger.ErrorContext(ctx, "internal error", append(attrs, slog.String("error", err.Error()))...)
		apiErr = errInternal
	}

	c.Abort()
	if c.Writer.Written() {
		return // too late to answer; the log has it
	}
	if apiErr.Status == http.StatusServiceUnavailable {
		// The database is down or slow, not the request wrong: the same request may succeed
		// later, and a client (or a proxy) should wait a moment rather than hammer a service
		// that is recovering.
		c.Header("Retry-After", strconv.Itoa(unavailableRetryAfterSeconds))
	}
	if wantsHTML(c) {
		s.writeErrorPage(c, apiErr)
		return
	}
	writeProblem(c, apiErr)
}

// writeProblem writes e as an RFC 9457 problem. Every problem's type is "about:blank": the status
// says what kind of problem it is (each status has one meaning in this API), the title is the
// status phrase and the detail says what happened. Extension members never replace the standard
// ones.
func writeProblem(c *gin.Context, e *Error) {
	body := make(map[string]any, 4+len(e.Extra))
	for k, v := range e.Extra {
		body[k] = v
	}
	body["type"] = "about:blank"
	body["title"] = e.Title
	body["status"] = e.Status
	body["detail"] = e.Detail
	data, err := json.Marshal(body)
	if err != nil { // unreachable with the values used here; answer without the extensions
		data, _ = json.Marshal(map[string]any{"type": "about:blank", "title": e.Title, "status": e.Status, "detail": e.Detail})
	}
	c.Header("Cache-Control", "no-store")
	c.Data(e.Status, problemContentType, data)
}
