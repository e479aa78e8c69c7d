package api

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/postguard/postguard/jobs/mail"
)

// The service's HTML pages are the templates of mail.Renderer (MAIL_TEMPLATES_DIR's page_*.html
// and the built-in ones): renderPage answers one, in the locale of the request (pageLocale), with
// the headers every page carries.

// Context keys of a request's pages.
const (
	// ctxKeyFlow is the page whose route the request is on (mail.Page): the error page says
	// what to do next in its terms.
	ctxKeyFlow = "postguard.page_flow"
	// ctxKeyUserLocale is the locale of the user the request is about, once a handler knows it
	// (from the token's user): its pages are in that user's language.
	ctxKeyUserLocale = "postguard.user_locale"
)

// tokenRouteCSP is the Content-Security-Policy of the answers of the routes whose URLs carry
// tokens that are not pages (problems, 204s): nothing loads, nothing frames them. A page
// replaces it with its own (mail.RenderedPage.CSP).
const tokenRouteCSP = "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'" //nolint:gosec // a policy, not a credential

// setFlow records the page whose route the request is on, for the error page.
func setFlow(c *gin.Context, page mail.Page) { c.Set(ctxKeyFlow, page) }

func flowOf(c *gin.Context) mail.Page {
	page, _ := c.Get(ctxKeyFlow)
	flow, _ := page.(mail.Page)
	return flow
}

// setUserLocale records the locale of the user the request is about ("" when unknown).
func setUserLocale(c *gin.Context, locale string) { c.Set(ctxKeyUserLocale, locale) }

// pageLocale is the locale of the request's pages: its user's, when a handler found one (a
// token's), else the best match of the browser's Accept-Language, else DEFAULT_LOCALE; always
// one of the locales that have templates. A page about an email address (forgot-password) never
// uses its user's: its answer must not tell whether the address has an account.
func (s *server) pageLocale(c *gin.Context) string {
	if locale := c.GetString(ctxKeyUserLocale); locale != "" {
		return s.renderer.Match(locale)
	}
	return s.renderer.MatchAcceptLanguage(c.GetHeader("Accept-Language"))
}

// renderPage answers status with page, in the request's locale. Every page: not cached (a page
// of a token holds it; the others are small and vary by language), its own
// Content-Security-Policy (its styles by hash, the logo, forms to the service only, no framing)
// and X-Frame-Options for older browsers, so that no site can overlay a confirm button and have
// it clicked.
func (s *server) renderPage(c *gin.Context, status int, page mail.Page, data *mail.PageData) error {
	rendered, err := s.renderer.RenderPage(page, s.pageLocale(c), data)
	if err != nil {
		return err
	}
	h := c.Writer.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Language", rendered.Locale)
	h.Set("Content-Security-Policy", rendered.CSP)
	h.Set("X-Frame-Options", "DENY")
	h.Add("Vary", "Accept-Language")
	c.Data(status, "text/html; charset=utf-8", []byte(rendered.HTML))
	return nil
}

// writeErrorPage answers e as the error page, for requests that came from the service's pages.
func (s *server) writeErrorPage(c *gin.Context, e *Error) {
	data := &mail.PageData{Status: e.Status, Detail: e.Detail, Flow: flowOf(c)}
	switch seconds := e.Extra["retry_after_seconds"].(type) {
	case int64:
		data.RetryAfter = time.Duration(seconds) * time.Second
	case int:
		data.RetryAfter = time.Duration(seconds) * time.Second
	}
	if err := s.renderPage(c, e.Status, mail.PageError, data); err != nil {
		// The templates were all rendered at start; fall back to a problem.
		s.logger.ErrorContext(c.Request.Context(), "error rendering error page",
			slog.String("request_id", requestIDOf(c)), slog.String("error", err.Error()))
		writeProblem(c, e)
	}
}

// forgotPasswordPage is the form that asks for a reset link; it posts to POST
// /v1/auth/forgot-password, which answers it with a page, or shows it again with its error.
func (s *server) forgotPasswordPage(c *gin.Context) error {
	answerHTML(c)
	setFlow(c, mail.PageForgotPassword)
	return s.renderPage(c, http.StatusOK, mail.PageForgotPassword, nil)
}

// startPage is GET / where /dev/mail is served (development with the log mailer, to this
// machine only; see mountDevMail): where a person trying postguard begins. Elsewhere / is not a
// route (404).
func (s *server) startPage(c *gin.Context) error {
	answerHTML(c)
	return s.renderPage(c, http.StatusOK, mail.PageStart, nil)
}
