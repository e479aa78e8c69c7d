package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/tokens"
)

type tokenRequest struct {
	Token string `json:"token"`
}

type resetPasswordRequest struct {
	Token    string `json:"token"`
	Password string `json:"password"`
}

// setTokenPageHeaders protects answers of the routes whose URLs carry tokens: the token must not
// leak through the Referer of a link followed from the page (its logo's request included), stay
// in a cache, or be framed. A page replaces the Content-Security-Policy with its own.
func setTokenPageHeaders(c *gin.Context) {
	h := c.Writer.Header()
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", tokenRouteCSP)
	h.Set("X-Frame-Options", "DENY")
}

// tokenPage starts the GET page of a link's token: it marks the request's answers as pages of
// flow, and looks the token up without using it, in one statement that also reads its user's
// locale (the page's language). An implausible, unknown, expired or used token is the error
// page (400) at once, in the browser's language: the form would only fail later. A GET changes
// nothing, so a link scanner's prefetch does no harm.
func (s *server) tokenPage(c *gin.Context, flow mail.Page, purpose db.TokenPurpose) (string, error) {
	setTokenPageHeaders(c)
	answerHTML(c)
	setFlow(c, flow)
	token := c.Query("token")
	if !tokens.Plausible(token) {
		return "", errInvalidToken
	}
	owner, err := s.store.EmailTokenLookup(c.Request.Context(), tokens.Hash(token), purpose, s.now())
	switch {
	case errors.Is(err, db.ErrNotFound):
		return "", errInvalidToken
	case err != nil:
		return "", fmt.Errorf("error looking up %s token: %w", purpose, err)
	}
	setUserLocale(c, owner.Locale)
	return token, nil
}

// verifyEmailPage is the page a verification link opens: a form that posts the token back.
func (s *server) verifyEmailPage(c *gin.Context) error {
	token, err := s.tokenPage(c, mail.PageVerifyEmail, db.TokenPurposeVerify)
	if err != nil {
		return err
	}
	return s.renderPage(c, http.StatusOK, mail.PageVerifyEmail, &mail.PageData{Token: token})
}

// verifyEmail consumes a verification token and marks its user's email verified: 204 (200 and a
// page for the form), 400 when the token is invalid, expired or used. Of two concurrent uses of
// one token exactly one succeeds (EmailTokenConsume is one statement).
func (s *server) verifyEmail(c *gin.Context) error {
	setTokenPageHeaders(c)
	setFlow(c, mail.PageVerifyEmail)
	kind, err := bodyKindOf(c, true)
	if err != nil {
		return err
	}
	var token string
	if kind == bodyJSON {
		var req tokenRequest
		if err := decodeJSON(c, &req); err != nil {
			return err
		}
		token = req.Token
	} else {
		form, err := parseForm(c)
		if err != nil {
			return err
		}
		token = form.Get("token")
	}
	var fieldErrs []fieldError
	checkToken(token, &fieldErrs)
	if len(fieldErrs) > 0 && kind == bodyJSON {
		return validationError(fieldErrs)
	}
	if !tokens.Plausible(token) {
		return errInvalidToken // for a form, a missing token too: the link's error page
	}

	var locale string
	err = s.store.InTx(c.Request.Context(), func(ctx context.Context, tx riverstore.Tx) error {
		now := s.now()
		userID, err := tx.EmailTokenConsume(ctx, tokens.Hash(token), db.TokenPurposeVerify, now)
		if err != nil {
			return err
		}
		locale, err = tx.UserMarkEmailVerified(ctx, userID, now)
		return err
	})
	switch {
	case errors.Is(err, db.ErrNotFound):
		return errInvalidToken
	case err != nil:
		return fmt.Errorf("error verifying email: %w", err)
	}
	if kind == bodyForm {
		setUserLocale(c, locale)
		return s.renderPage(c, http.StatusOK, mail.PageEmailVerified, nil)
	}
	c.Status(http.StatusNoContent)
	return nil
}

// resetPasswordPage is the page a reset link opens: a form for the new password that posts the
// token back.
func (s *server) resetPasswordPage(c *gin.Context) error {
	token, err := s.tokenPage(c, mail.PageResetPassword, db.TokenPurposeReset)
	if err != nil {
		return err
	}
	return s.renderPage(c, http.StatusOK, mail.PageResetPassword, resetFormData(token, ""))
}

// resetFormData fills the reset form, with the error of its password when it is shown again.
func resetFormData(token, passwordErr string) *mail.PageData {
	return &mail.PageData{
		Token: token, MinPassword: minPasswordLen, MaxPassword: maxPasswordLen,
		Errors: mail.FieldErrors{Password: passwordErr},
	}
}

// resetPassword consumes a reset token and sets the new password: 204 (200 and a page for the
// form), 400 when the token is invalid, expired or used, 422 when the password is not
// acceptable, 429 past the per-IP limit (RESET_PASSWORD). The token is looked up before the
// password is hashed, so a made-up token costs one read rather than a 19 MiB argon2id hash, and
// a flood of them cannot starve registrations of the hasher. The hash happens outside the
// transaction; the transaction then consumes the token (of two uses of one token exactly one
// wins, whatever the lookup saw), sets the password, marks the email verified (the user proved
// they read it) and invalidates the user's other reset tokens.
//
// The form (the reset page's post) is answered with pages: a password that is not acceptable
// shows the form again with its error (422), in the token's user's language (a lookup, no hash,
// no counter spent: the request is refused before the limiter, as every malformed one is).
func (s *server) resetPassword(c *gin.Context) error {
	setTokenPageHeaders(c)
	setFlow(c, mail.PageResetPassword)
	kind, err := bodyKindOf(c, true)
	if err != nil {
		return err
	}
	var req resetPasswordRequest
	if kind == bodyJSON {
		if err := decodeJSON(c, &req); err != nil {
			return err
		}
	} else {
		form, err := parseForm(c)
		if err != nil {
			return err
		}
		req.Token, req.Password = form.Get("token"), form.Get("password")
	}
	var fieldErrs []fieldError
	checkToken(req.Token, &fieldErrs)
	checkPassword(req.Password, &fieldErrs)
	if kind == bodyForm && !tokens.Plausible(req.Token) {
		return errInvalidToken // a form without its link's token: the link's error page
	}
	if kind == bodyForm && len(fieldErrs) > 0 {
		// Only the password is wrong: the form again, if its token can still be used.
		if err := s.lookUpResetToken(c, tokens.Hash(req.Token)); err != nil {
			return err
		}
		return s.renderPage(c, http.StatusUnprocessableEntity, mail.PageResetPassword, resetFormData(req.Token, fieldErrs[0].Detail))
	}
	if len(fieldErrs) > 0 {
		return validationError(fieldErrs)
	}
	if !tokens.Plausible(req.Token) {
		return errInvalidToken
	}

	if err := s.allow(c, abuse.ActionResetPassword, ""); err != nil {
		return err
	}

	ctx := c.Request.Context()
	tokenHash := tokens.Hash(req.Token)
	if err := s.lookUpResetToken(c, tokenHash); err != nil {
		return err
	}
	hash, err := s.hasher.Hash(ctx, req.Password)
	if err != nil {
		return err
	}
	err = s.store.InTx(ctx, func(ctx context.Context, tx riverstore.Tx) error {
		now := s.now()
		userID, err := tx.EmailTokenConsume(ctx, tokenHash, db.TokenPurposeReset, now)
		if err != nil {
			return err
		}
		if err := tx.UserSetPassword(ctx, userID, hash, now); err != nil {
			return fmt.Errorf("error setting password: %w", err)
		}
		if err := tx.EmailTokenInvalidateUser(ctx, userID, db.TokenPurposeReset, now); err != nil {
			return fmt.Errorf("error invalidating reset tokens: %w", err)
		}
		return nil
	})
	switch {
	case errors.Is(err, db.ErrNotFound):
		return errInvalidToken
	case err != nil:
		return fmt.Errorf("error resetting password: %w", err)
	}
	if kind == bodyForm {
		return s.renderPage(c, http.StatusOK, mail.PagePasswordChanged, nil)
	}
	c.Status(http.StatusNoContent)
	return nil
}

// lookUpResetToken proves a reset token usable without using it, and records its user's locale
// for the pages: errInvalidToken when it is not.
func (s *server) lookUpResetToken(c *gin.Context, tokenHash []byte) error {
	owner, err := s.store.EmailTokenLookup(c.Request.Context(), tokenHash, db.TokenPurposeReset, s.now())
	switch {
	case errors.Is(err, db.ErrNotFound):
		return errInvalidToken
	case err != nil:
		return fmt.Errorf("error looking up reset token: %w", err)
	}
	setUserLocale(c, owner.Locale)
	return nil
}

// unsubscribePage is the page an unsubscribe link opens: a confirm button that posts RFC 8058's
// one-click body. It changes nothing (link scanners prefetch links in mail). A forged or
// malformed token is refused at once (400), before any database; a valid one's user is read
// for the page's language (a user who is gone gets the page in the browser's: unsubscribing
// them still succeeds).
func (s *server) unsubscribePage(c *gin.Context) error {
	setTokenPageHeaders(c)
	answerHTML(c)
	setFlow(c, mail.PageUnsubscribe)
	token := c.Query("token")
	userID, ok := tokens.ParseUnsubscribe(s.secret, token)
	if !ok {
		return errInvalidToken
	}
	user, err := s.store.UserGetByID(c.Request.Context(), userID)
	switch {
	case errors.Is(err, db.ErrNotFound):
	case err != nil:
		return fmt.Errorf("error reading unsubscribing user: %w", err)
	default:
		setUserLocale(c, user.Locale)
	}
	return s.renderPage(c, http.StatusOK, mail.PageUnsubscribe, &mail.PageData{Token: token})
}

// unsubscribe is RFC 8058's one-click unsubscribe: a POST to the link's URL (token in the
// query) with the form body List-Unsubscribe=One-Click, urlencoded or multipart. No cookie or
// other auth (the signed token is the authority), never a redirect, repeatable: 200 and a page;
// 400 for a forged token or a missing body field.
func (s *server) unsubscribe(c *gin.Context) error {
	setTokenPageHeaders(c)
	setFlow(c, mail.PageUnsubscribe)
	if mt := mediaTypeOf(c.Request); mt != mediaURLEncoded && mt != mediaMultipart {
		return newError(http.StatusUnsupportedMediaType,
			"The body must be the form List-Unsubscribe=One-Click (RFC 8058), application/x-www-form-urlencoded or multipart/form-data.")
	}
	answerHTML(c)
	form, err := parseForm(c)
	if err != nil {
		return err
	}
	if form.Get("List-Unsubscribe") != "One-Click" {
		return badRequest("The body must be the form List-Unsubscribe=One-Click (RFC 8058).", nil)
	}
	userID, ok := tokens.ParseUnsubscribe(s.secret, c.Query("token"))
	if !ok {
		return errInvalidToken
	}
	// A validly signed token whose user is gone has nothing left to unsubscribe: still a success.
	locale, err := s.store.UserUnsubscribe(c.Request.Context(), userID, s.now())
	if err != nil && !errors.Is(err, db.ErrNotFound) {
		return fmt.Errorf("error unsubscribing user: %w", err)
	}
	setUserLocale(c, locale)
	return s.renderPage(c, http.StatusOK, mail.PageUnsubscribed, nil)
}

// checkToken records a missing token.
func checkToken(token string, fieldErrs *[]fieldError) {
	if token == "" {
		*fieldErrs = append(*fieldErrs, fieldError{Pointer: "#/token", Detail: "Token is required."})
	}
}
