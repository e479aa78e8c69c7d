package api

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"

	"github.com/gin-gonic/gin"
)

// pagesHTML is the one template of the service's small HTML pages: the three forms that mail
// links open, and the result or error page of a form post.
//
//go:embed pages.html
var pagesHTML string

var pagesTemplate = template.Must(template.New("pages").Parse(pagesHTML))

// Forms of pageData.Form; "" is a result page.
const (
	formVerify      = "verify"
	formReset       = "reset"
	formUnsubscribe = "unsubscribe"
)

// pageData fills pagesTemplate.
type pageData struct {
	// AppName is APP_NAME, in every page's title and heading; renderPage sets it.
	AppName     string
	Form        string
	Title       string
	Message     string
	Errors      []string
	Token       string
	MinPassword int
	MaxPassword int
}

// pageCSP is the Content-Security-Policy of the service's pages: no scripts or outside resources
// (the pages use neither), forms posting only to the service itself, and no framing by any
// other page (frame-ancestors; X-Frame-Options for older browsers), so that a site cannot
// overlay a confirm button and have it clicked.
const pageCSP = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

// renderPage answers status with the page, which no other page may frame.
func (s *server) renderPage(c *gin.Context, status int, data *pageData) error {
	data.AppName = s.appName
	var buf bytes.Buffer
	if err := pagesTemplate.Execute(&buf, data); err != nil {
		return fmt.Errorf("error rendering page: %w", err)
	}
	h := c.Writer.Header()
	h.Set("X-Frame-Options", "DENY")
	h.Set("Content-Security-Policy", pageCSP)
	c.Data(status, "text/html; charset=utf-8", buf.Bytes())
	return nil
}

// writeErrorPage answers e as an HTML page, for requests that came from the service's pages.
func (s *server) writeErrorPage(c *gin.Context, e *Error) {
	data := &pageData{Title: pageErrorTitle(e.Status), Message: e.Detail}
	if fieldErrs, ok := e.Extra["errors"].([]fieldError); ok && len(fieldErrs) > 1 {
		for _, fe := range fieldErrs {
			data.Errors = append(data.Errors, fe.Detail)
		}
	}
	if err := s.renderPage(c, e.Status, data); err != nil {
		// Unreachable with the embedded template; fall back to a problem.
		s.logger.ErrorContext(c.Request.Context(), "error rendering error page",
			slog.String("request_id", requestIDOf(c)), slog.String("error", err.Error()))
		writeProblem(c, e)
	}
}

// pageErrorTitle is the heading of an error page: words for a person, where a problem has the
// status phrase.
func pageErrorTitle(status int) string {
	switch {
	case status == http.StatusBadRequest:
		return "This link or form does not work"
	case status == http.StatusUnprocessableEntity:
		return "Please check the form"
	case status == http.StatusTooManyRequests:
		return "Too many attempts"
	case status >= 500:
		return "Something went wrong on our side"
	default:
		return http.StatusText(status)
	}
}
