package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/email"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs"
	"github.com/postguard/postguard/jobs/mail"
)

// Field limits of the HTTP API (docs/api.md), counted in Unicode code points.
const (
	minPasswordLen = 8
	maxPasswordLen = 256
	maxNameLen     = 100
)

type registerRequest struct {
	Email    string `json:"email"`
	Password string `json:"password"`
	Name     string `json:"name"`
	Locale   string `json:"locale"`
}

type registerResponse struct {
	ID    int64  `json:"id"`
	Email string `json:"email"`
}

type emailRequest struct {
	Email string `json:"email"`
}

// The answers of forgot-password and resend-verification: constant, whether or not the email
// belongs to an account, so they reveal nothing.
var (
	forgotPasswordAnswer     = mustJSON(map[string]string{"message": "If an account uses this email address, a link to reset its password is on its way."})
	resendVerificationAnswer = mustJSON(map[string]string{"message": "If an account uses this email address and it is not verified yet, a new verification link is on its way."})
)

// register creates an account: validate, spend the rate-limit allowance, hash the password
// (outside any transaction, bounded by the hasher's semaphore), then insert the user and its
// welcome and verification jobs in one transaction. 201 {"id","email"}; 409 when the email is
// taken. The user keeps a locale, its mail's language: the body's locale, else the first
// language of Accept-Language, else none.
func (s *server) register(c *gin.Context) error {
	if _, err := bodyKindOf(c, false); err != nil {
		return err
	}
	var req registerRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	var fieldErrs []fieldError
	email := checkEmail(req.Email, &fieldErrs)
	checkPassword(req.Password, &fieldErrs)
	name := checkName(req.Name, &fieldErrs)
	locale := checkLocale(req.Locale, &fieldErrs)
	if len(fieldErrs) > 0 {
		return validationError(fieldErrs)
	}
	if locale == "" {
		locale = acceptLanguageLocale(c.Request)
	}

	if err := s.allow(c, abuse.ActionRegister, email); err != nil {
		return err
	}

	ctx := c.Request.Context()
	hash, err := s.hasher.Hash(ctx, req.Password)
	if err != nil {
		return err
	}
	var user *db.User
	err = s.store.InTx(ctx, func(ctx context.Context, tx riverstore.Tx) error {
		var err error
		user, err = tx.UserInsert(ctx, &db.UserInsertParams{Email: email, Name: name, PasswordHash: hash, Locale: locale, Now: s.now()})
		if err != nil {
			return err
		}
		if _, err := tx.JobInsert(ctx, jobs.WelcomeEmailArgs{UserID: user.ID}, nil); err != nil {
			return fmt.Errorf("error inserting welcome email job: %w", err)
		}
		if _, err := tx.JobInsert(ctx, jobs.VerificationEmailArgs{UserID: user.ID}, nil); err != nil {
			return fmt.Errorf("error inserting verification email job: %w", err)
		}
		return nil
	})
	switch {
	case errors.Is(err, db.ErrEmailTaken):
		return errEmailTaken
	case err != nil:
		return fmt.Errorf("error registering user: %w", err)
	}
	return writeJSON(c, http.StatusCreated, registerResponse{ID: user.ID, Email: user.Email})
}

// forgotPassword enqueues a password reset email when the email belongs to an account. The
// answer is 202 with a constant body either way (see uniformAnswer); the form of GET
// /v1/auth/forgot-password is answered with a page, the same either way too.
func (s *server) forgotPassword(c *gin.Context) error {
	setFlow(c, mail.PageForgotPassword)
	pages := &uniformPages{form: mail.PageForgotPassword, answer: mail.PageResetLinkSent}
	return s.uniformAnswer(c, abuse.ActionForgotPassword, forgotPasswordAnswer, pages, func(ctx context.Context, tx riverstore.Tx, user *db.User) error {
		if _, err := tx.JobInsert(ctx, jobs.PasswordResetEmailArgs{UserID: user.ID}, nil); err != nil {
			return fmt.Errorf("error inserting password reset email job: %w", err)
		}
		return nil
	})
}

// resendVerification enqueues a verification email when the email belongs to an account not
// verified yet. The answer is 202 with a constant body either way (see uniformAnswer).
func (s *server) resendVerification(c *gin.Context) error {
	return s.uniformAnswer(c, abuse.ActionResendVerification, resendVerificationAnswer, nil, func(ctx context.Context, tx riverstore.Tx, user *db.User) error {
		if user.EmailVerifiedAt != nil {
			return nil
		}
		if _, err := tx.JobInsert(ctx, jobs.VerificationEmailArgs{UserID: user.ID}, nil); err != nil {
			return fmt.Errorf("error inserting verification email job: %w", err)
		}
		return nil
	})
}

// uniformPages are the pages of a uniformAnswer route that has a form: the form, shown again with
// its error, and the answer.
type uniformPages struct {
	form, answer mail.Page
}

// uniformAnswer runs a route whose answer must not tell whether an email belongs to an account,
// nor whether anyone asked about it lately: validate the body {"email"}, spend the rate-limit
// allowance and, when every rule admitted, look the user up in the same round trip (see
// allowQuietly), and, when found, call ifFound in a transaction. Every branch answers the same
// status, headers and body (202, answer), and none returns early for an unknown or refused email.
// A route with pages also takes its form: an address that does not parse shows the form again
// with its error and the address as typed (422); every other answer is pages.answer (200), in the
// browser's language (never the user's, which would tell that there is one), byte for byte the
// same for every address.
//
// Timing: an unknown email costs one round trip (the checks and the lookup, one statement); a
// known one adds a transaction with a job insert (a millisecond or so). The answer is held until
// at least server.uniformMin (100 ms) has passed since the request began, which covers that
// difference with a wide margin; the per-IP and per-email limits leave an attacker very few
// samples besides. Most requests of a flood are for unknown emails, so the lookup runs outside
// the transaction; ifFound reads the user again inside it when it needs a consistent view.
func (s *server) uniformAnswer(c *gin.Context, action abuse.Action, answer []byte, pages *uniformPages, ifFound func(ctx context.Context, tx riverstore.Tx, user *db.User) error) error {
	start := time.Now()
	kind, err := bodyKindOf(c, pages != nil)
	if err != nil {
		return err
	}
	var raw string
	if kind == bodyJSON {
		var req emailRequest
		if err := decodeJSON(c, &req); err != nil {
			return err
		}
		raw = req.Email
	} else {
		form, err := parseForm(c)
		if err != nil {
			return err
		}
		raw = form.Get("email")
	}
	var fieldErrs []fieldError
	email := checkEmail(raw, &fieldErrs)
	if len(fieldErrs) > 0 {
		if kind == bodyForm {
			return s.renderPage(c, http.StatusUnprocessableEntity, pages.form, &mail.PageData{
				Email: raw, Errors: mail.FieldErrors{Email: fieldErrs[0].Detail},
			})
		}
		return validationError(fieldErrs)
	}

	user, err := s.allowQuietly(c, action, email)
	if err != nil {
		return err
	}

	ctx := c.Request.Context()
	if user != nil {
		err = s.store.InTx(ctx, func(ctx context.Context, tx riverstore.Tx) error {
			return ifFound(ctx, tx, user)
		})
	}
	waitUntil(ctx, start.Add(s.uniformMin))
	if err != nil {
		return fmt.Errorf("error handling %s: %w", action, err)
	}
	if kind == bodyForm {
		return s.renderPage(c, http.StatusOK, pages.answer, nil)
	}
	c.Data(http.StatusAccepted, mediaJSON, answer)
	return nil
}

// allow spends one request of action for the client's IP and email. The RateLimit headers
// describe the client's own IP rule, whichever rule answered: an email's budget would tell the
// client how often others tried that address lately. On a refusal, by either rule, it returns
// the 429 problem with the refusing rule's Retry-After.
func (s *server) allow(c *gin.Context, action abuse.Action, email string) error {
	decision, err := s.spend(c, action, email)
	if err != nil {
		return err
	}
	if ip, ok := decision.Of(abuse.ScopeIP); ok {
		ip.SetHeaders(c.Writer.Header())
	}
	if decision.Allowed {
		return nil
	}
	c.Header("Retry-After", strconv.FormatInt(decision.RetryAfterSeconds(), 10))
	return tooManyRequests(decision)
}

// allowQuietly is allow for the routes whose answer must not tell whether anyone asked about an
// email lately (forgot-password, resend-verification): a 429 or a RateLimit header about the
// email's budget would say so to whoever sends the next request for it. The RateLimit headers
// describe the client's own IP rule only, and only that rule's refusal is a 429. When every rule
// admitted, it returns the email's user, read with the checks in one round trip (nil when the
// email has no account); when the email rule refuses, it returns no user and no error, and the
// caller answers exactly as for an admitted request, doing nothing. The refusal is still counted
// in the limiter's metrics.
func (s *server) allowQuietly(c *gin.Context, action abuse.Action, email string) (*db.User, error) {
	ip := s.ips.ClientIP(c.Request.RemoteAddr, c.Request.Header)
	decision, user, err := s.limiter.AllowUser(c.Request.Context(), action, abuse.Subject{IP: ip, Email: email})
	if err != nil {
		return nil, fmt.Errorf("error checking rate limit: %w", err)
	}
	if ip, ok := decision.Of(abuse.ScopeIP); ok {
		ip.SetHeaders(c.Writer.Header())
	}
	switch {
	case decision.Allowed:
		return user, nil
	case decision.Rule.Scope == abuse.ScopeIP:
		return nil, tooManyRequests(decision)
	default:
		return nil, nil
	}
}

// spend asks the limiter to spend one request of action for the client's IP and email.
func (s *server) spend(c *gin.Context, action abuse.Action, email string) (*abuse.Decision, error) {
	ip := s.ips.ClientIP(c.Request.RemoteAddr, c.Request.Header)
	decision, err := s.limiter.Allow(c.Request.Context(), action, abuse.Subject{IP: ip, Email: email})
	if err != nil {
		// Fail closed: without the database there is nothing useful to do anyway.
		return nil, fmt.Errorf("error checking rate limit: %w", err)
	}
	return decision, nil
}

// tooManyRequests is the 429 problem of a refusal; its headers are the caller's to set.
func tooManyRequests(decision *abuse.Decision) *Error {
	retryAfter := decision.RetryAfterSeconds()
	return &Error{
		Status: http.StatusTooManyRequests,
		Title:  http.StatusText(http.StatusTooManyRequests),
		Detail: fmt.Sprintf("Too many requests; retry in %d seconds.", retryAfter),
		Extra:  map[string]any{"retry_after_seconds": retryAfter},
	}
}

// waitUntil sleeps until deadline, or until ctx ends.
func waitUntil(ctx context.Context, deadline time.Time) {
	d := time.Until(deadline)
	if d <= 0 {
		return
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
	}
}

// checkEmail returns the normalised email, or records why raw is not one.
func checkEmail(raw string, fieldErrs *[]fieldError) string {
	if strings.TrimSpace(raw) == "" {
		*fieldErrs = append(*fieldErrs, fieldError{Pointer: "#/email", Detail: "Email is required."})
		return ""
	}
	address, err := email.Normalize(raw)
	if err != nil {
		*fieldErrs = append(*fieldErrs, fieldError{Pointer: "#/email", Detail: "Email must be one plain address, like name@example.com."})
		return ""
	}
	return address
}

// checkPassword records why password is not acceptable: missing, not UTF-8, or outside 8–256
// code points. Passwords are never trimmed, normalised or truncated.
func checkPassword(password string, fieldErrs *[]fieldError) {
	n := utf8.RuneCountInString(password)
	var detail string
	switch {
	case password == "":
		detail = "Password is required."
	case !utf8.ValidString(password):
		detail = "Password must be valid UTF-8 text."
	case n < minPasswordLen:
		detail = fmt.Sprintf("Password must be at least %d characters long.", minPasswordLen)
	case n > maxPasswordLen:
		detail = fmt.Sprintf("Password must be at most %d characters long.", maxPasswordLen)
	default:
		return
	}
	*fieldErrs = append(*fieldErrs, fieldError{Pointer: "#/password", Detail: detail})
}

// checkName returns the trimmed name, or records why it is not acceptable: not UTF-8, over 100
// code points, control, format or line-separator characters, or a URL, an email address or a
// domain name in it (see nameCarriesLink). An empty name is fine.
func checkName(name string, fieldErrs *[]fieldError) string {
	name = strings.TrimSpace(name)
	var detail string
	switch {
	case !utf8.ValidString(name):
		detail = "Name must be valid UTF-8 text."
	case utf8.RuneCountInString(name) > maxNameLen:
		detail = fmt.Sprintf("Name must be at most %d characters long.", maxNameLen)
	case strings.ContainsFunc(name, invisibleInName):
		detail = "Name must not contain control, formatting or line-separator characters."
	case nameCarriesLink(name):
		detail = "Name must not contain a web address, an email address or a domain name."
	default:
		return name
	}
	*fieldErrs = append(*fieldErrs, fieldError{Pointer: "#/name", Detail: detail})
	return ""
}

// writeJSON answers status with v as JSON.
func writeJSON(c *gin.Context, status int, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("error encoding answer: %w", err)
	}
	c.Data(status, mediaJSON, data)
	return nil
}

func mustJSON(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return data
}
