package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/db"
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
// leak through the Referer of a link followed from the page, stay in a cache, or be framed
// (pageCSP).
func setTokenPageHeaders(c *gin.Context) {
	h := c.Writer.Header()
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", pageCSP)
	h.Set("X-Frame-Options", "DENY")
}

// verifyEmailPage is the page a verification link opens: a form that posts the token back. It
// changes nothing, so a link scanner's prefetch does no harm.
func (s *server) verifyEmailPage(c *gin.Context) error {
	setTokenPageHeaders(c)
	answerHTML(c)
	token := c.Query("token")
	if !tokens.Plausible(token) {
		return errInvalidToken
	}
	return s.renderPage(c, http.StatusOK, &pageData{Form: formVerify, Title: "Confirm your email address", Token: token})
}

// verifyEmail consumes a verification token and marks its user's email verified: 204 (200 and a
// page for the form), 400 when the token is invalid, expired or used. Of two concurrent uses of
// one token exactly one succeeds (EmailTokenConsume is one statement).
func (s *server) verifyEmail(c *gin.Context) error {
	setTokenPageHeaders(c)
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
	if len(fieldErrs) > 0 {
		return validationError(fieldErrs)
	}
	if !tokens.Plausible(token) {
		return errInvalidToken
	}

	err = s.store.InTx(c.Request.Context(), func(ctx context.Context, tx db.Tx) error {
		now := s.now()
		userID, err := tx.EmailTokenConsume(ctx, tokens.Hash(token), db.TokenPurposeVerify, now)
		if err != nil {
			return err
		}
		_, err = tx.UserMarkEmailVerified(ctx, userID, now)
		return err
	})
	switch {
	case errors.Is(err, db.ErrNotFound):
		return errInvalidToken
	case err != nil:
		return fmt.Errorf("error verifying email: %w", err)
	}
	if kind == bodyForm {
		return s.renderPage(c, http.StatusOK, &pageData{Title: "Email address confirmed", Message: "Thank you: your email address is confirmed. You can close this page."})
	}
	c.Status(http.StatusNoContent)
	return nil
}

// resetPasswordPage is the page a reset link opens: a form for the new password that posts the
// token back. It changes nothing.
func (s *server) resetPasswordPage(c *gin.Context) error {
	setTokenPageHeaders(c)
	answerHTML(c)
	token := c.Query("token")
	if !tokens.Plausible(token) {
		return errInvalidToken
	}
	return s.renderPage(c, http.StatusOK, &pageData{
		Form: formReset, Title: "Choose a new password", Token: token,
		MinPassword: minPasswordLen, MaxPassword: maxPasswordLen,
	})
}

// resetPassword consumes a reset token and sets the new password: 204 (200 and a page for the
// form), 400 when the token is invalid, expired or used, 422 when the password is not
// acceptable, 429 past the per-IP limit (RESET_PASSWORD). The token is looked up before the
// password is hashed, so a made-up token costs one read rather than a 19 MiB argon2id hash, and
// a flood of them cannot starve registrations of the hasher. The hash happens outside the
// transaction; the transaction then consumes the token (of two uses of one token exactly one
// wins, whatever the lookup saw), sets the password, marks the email verified (the user proved
// they read it) and invalidates the user's other reset tokens.
func (s *server) resetPassword(c *gin.Context) error {
	setTokenPageHeaders(c)
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
	if _, err := s.store.EmailTokenLookup(ctx, tokenHash, db.TokenPurposeReset, s.now()); err != nil {
		if errors.Is(err, db.ErrNotFound) {
			return errInvalidToken
		}
		return fmt.Errorf("error looking up reset token: %w", err)
	}
	hash, err := s.hasher.Hash(ctx, req.Password)
	if err != nil {
		return err
	}
	err = s.store.InTx(ctx, func(ctx context.Context, tx db.Tx) error {
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
		return s.renderPage(c, http.StatusOK, &pageData{Title: "Password changed", Message: "Your new password is set. You can now sign in with it."})
	}
	c.Status(http.StatusNoContent)
	return nil
}

// unsubscribePage is the page an unsubscribe link opens: a confirm button that posts RFC 8058's
// one-click body. It changes nothing (link scanners prefetch links in mail). A forged or
// malformed token is refused at once (400): checking it takes no database.
func (s *server) unsubscribePage(c *gin.Context) error {
	setTokenPageHeaders(c)
	answerHTML(c)
	token := c.Query("token")
	if _, ok := tokens.ParseUnsubscribe(s.secret, token); !ok {
		return errInvalidToken
	}
	return s.renderPage(c, http.StatusOK, &pageData{Form: formUnsubscribe, Title: "Unsubscribe", Token: token})
}

// unsubscribe is RFC 8058's one-click unsubscribe: a POST to the link's URL (token in the
// query) with the form body List-Unsubscribe=One-Click, urlencoded or multipart. No cookie or
// other auth (the signed token is the authority), never a redirect, repeatable: 200 and a page;
// 400 for a forged token or a missing body field.
func (s *server) unsubscribe(c *gin.Context) error {
	setTokenPageHeaders(c)
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
	if _, err := s.store.UserUnsubscribe(c.Request.Context(), userID, s.now()); err != nil && !errors.Is(err, db.ErrNotFound) {
		return fmt.Errorf("error unsubscribing user: %w", err)
	}
	return s.renderPage(c, http.StatusOK, &pageData{
		Title:   "You are unsubscribed",
		Message: "You will not receive our optional emails any more. Emails you ask for, such as password resets, still reach you.",
	})
}

// checkToken records a missing token.
func checkToken(token string, fieldErrs *[]fieldError) {
	if token == "" {
		*fieldErrs = append(*fieldErrs, fieldError{Pointer: "#/token", Detail: "Token is required."})
	}
}
