package api

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/tokens"
)

// tokenJobSeq numbers the jobs that insertToken's tokens pretend to come from (one token a job).
var tokenJobSeq atomic.Int64 //nolint:gochecknoglobals // unique across parallel tests

// insertToken stores raw's hash as a token of purpose for userID, as the email job would.
func insertToken(t testing.TB, store riverstore.Store, raw string, userID int64, purpose db.TokenPurpose, expiresAt time.Time) {
	t.Helper()
	require.NoError(t, store.EmailTokenInsert(t.Context(), &db.EmailTokenInsertParams{
		TokenHash: tokens.Hash(raw),
		UserID:    userID,
		Purpose:   purpose,
		JobID:     tokenJobSeq.Add(1),
		ExpiresAt: expiresAt,
		Now:       time.Now(),
	}))
}

// requireTokenPageHeaders checks the headers that keep a token in a URL private.
func requireTokenPageHeaders(t testing.TB, rec *httptest.ResponseRecorder) {
	t.Helper()
	require.Equal(t, "no-referrer", rec.Header().Get("Referrer-Policy"))
	require.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
	require.Contains(t, rec.Header().Get("Content-Security-Policy"), "frame-ancestors 'none'")
}

func requireHTML(t testing.TB, rec *httptest.ResponseRecorder, status int, contains ...string) {
	t.Helper()
	require.Equal(t, status, rec.Code, rec.Body.String())
	require.Equal(t, "text/html; charset=utf-8", rec.Header().Get("Content-Type"))
	for _, s := range contains {
		require.Contains(t, rec.Body.String(), s)
	}
}

func getUser(t testing.TB, store riverstore.Store, id int64) *db.User {
	t.Helper()
	user, err := store.UserGetByID(t.Context(), id)
	require.NoError(t, err)
	return user
}

func TestServer_VerifyEmail(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		type bundleWithUser struct {
			*testBundle
			user *db.User
			raw  string
		}
		setupVerify := func(t *testing.T, expiresAt time.Time) *bundleWithUser {
			t.Helper()
			bundle := setup(t, newStore(t), nil)
			user := insertUser(t, bundle.store, uniqueEmail("verify"), false)
			raw := tokens.New()
			insertToken(t, bundle.store, raw, user.ID, db.TokenPurposeVerify, expiresAt)
			return &bundleWithUser{bundle, user, raw}
		}
		valid := func() time.Time { return time.Now().Add(24 * time.Hour) }

		t.Run("JSON", func(t *testing.T) {
			t.Parallel()
			b := setupVerify(t, valid())

			rec := serve(t, b.router, jsonRequest(t, "/v1/auth/verify-email", map[string]string{"token": b.raw}))
			require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
			require.Empty(t, rec.Body.String())
			requireTokenPageHeaders(t, rec)
			require.NotNil(t, getUser(t, b.store, b.user.ID).EmailVerifiedAt)

			// Used: refused.
			rec = serve(t, b.router, jsonRequest(t, "/v1/auth/verify-email", map[string]string{"token": b.raw}))
			decodeProblem(t, rec, http.StatusBadRequest)
			requireTokenPageHeaders(t, rec)
		})

		t.Run("Form", func(t *testing.T) {
			t.Parallel()
			b := setupVerify(t, valid())

			rec := serve(t, b.router, formRequest("/v1/auth/verify-email", url.Values{"token": {b.raw}}))
			requireHTML(t, rec, http.StatusOK, "Email address confirmed")
			requireTokenPageHeaders(t, rec)
			require.NotNil(t, getUser(t, b.store, b.user.ID).EmailVerifiedAt)

			rec = serve(t, b.router, multipartRequest(t, "/v1/auth/verify-email", url.Values{"token": {b.raw}}))
			requireHTML(t, rec, http.StatusBadRequest, "invalid, has expired or has been used")

			// A form without its token is a link that does not work, with the way on (JSON: 422).
			rec = serve(t, b.router, formRequest("/v1/auth/verify-email", url.Values{}))
			requireHTML(t, rec, http.StatusBadRequest, "This link or form does not work", "Sign in to ask for a new verification email.")
			decodeProblem(t, serve(t, b.router, jsonRequest(t, "/v1/auth/verify-email", map[string]string{})), http.StatusUnprocessableEntity)
		})

		t.Run("Expired", func(t *testing.T) {
			t.Parallel()
			b := setupVerify(t, time.Now().Add(-time.Minute))

			rec := serve(t, b.router, jsonRequest(t, "/v1/auth/verify-email", map[string]string{"token": b.raw}))
			decodeProblem(t, rec, http.StatusBadRequest)
			require.Nil(t, getUser(t, b.store, b.user.ID).EmailVerifiedAt)
		})

		t.Run("UnknownOrWrongPurpose", func(t *testing.T) {
			t.Parallel()
			b := setupVerify(t, valid())
			reset := tokens.New()
			insertToken(t, b.store, reset, b.user.ID, db.TokenPurposeReset, valid())

			for _, token := range []string{reset, tokens.New(), "not a token!", strings.Repeat("a", tokens.Len+1)} {
				rec := serve(t, b.router, jsonRequest(t, "/v1/auth/verify-email", map[string]string{"token": token}))
				decodeProblem(t, rec, http.StatusBadRequest)
			}
			require.Nil(t, getUser(t, b.store, b.user.ID).EmailVerifiedAt)
		})

		t.Run("ConcurrentUsesOneWins", func(t *testing.T) {
			t.Parallel()
			b := setupVerify(t, valid())
			codes := concurrently(t, 2, func() *http.Request {
				return jsonRequest(t, "/v1/auth/verify-email", map[string]string{"token": b.raw})
			}, b.router)
			require.ElementsMatch(t, []int{http.StatusNoContent, http.StatusBadRequest}, codes)
		})

		t.Run("PageChangesNothing", func(t *testing.T) {
			t.Parallel()
			b := setupVerify(t, valid())

			rec := serve(t, b.router, httptest.NewRequest(http.MethodGet, "/v1/auth/verify-email?token="+b.raw, nil))
			requireHTML(t, rec, http.StatusOK, `<form method="post" action="verify-email">`, `name="token" value="`+b.raw+`"`)
			requireTokenPageHeaders(t, rec)
			require.Nil(t, getUser(t, b.store, b.user.ID).EmailVerifiedAt)

			// The token is still good: the page's form then works.
			rec = serve(t, b.router, formRequest("/v1/auth/verify-email", url.Values{"token": {b.raw}}))
			requireHTML(t, rec, http.StatusOK)
		})

		t.Run("PageWithoutToken", func(t *testing.T) {
			t.Parallel()
			b := setupVerify(t, valid())
			for _, target := range []string{"/v1/auth/verify-email", "/v1/auth/verify-email?token=%3Cscript%3E"} {
				rec := serve(t, b.router, httptest.NewRequest(http.MethodGet, target, nil))
				requireHTML(t, rec, http.StatusBadRequest)
				requireTokenPageHeaders(t, rec)
				require.NotContains(t, rec.Body.String(), "<script>")
			}
		})
	})
}

func TestServer_ResetPassword(t *testing.T) {
	t.Parallel()

	const newPassword = "brand new password"

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		type bundleWithUser struct {
			*testBundle
			user        *db.User
			raw, other  string
			oldPassword string
		}
		setupReset := func(t *testing.T, expiresAt time.Time) *bundleWithUser {
			t.Helper()
			bundle := setup(t, newStore(t), nil)
			user := insertUser(t, bundle.store, uniqueEmail("reset"), false)
			raw, other := tokens.New(), tokens.New()
			insertToken(t, bundle.store, raw, user.ID, db.TokenPurposeReset, expiresAt)
			insertToken(t, bundle.store, other, user.ID, db.TokenPurposeReset, time.Now().Add(time.Hour))
			return &bundleWithUser{bundle, user, raw, other, user.PasswordHash}
		}
		valid := func() time.Time { return time.Now().Add(time.Hour) }

		t.Run("JSON", func(t *testing.T) {
			t.Parallel()
			b := setupReset(t, valid())

			rec := serve(t, b.router, jsonRequest(t, "/v1/auth/reset-password", map[string]string{"token": b.raw, "password": newPassword}))
			require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
			requireTokenPageHeaders(t, rec)

			user := getUser(t, b.store, b.user.ID)
			ok, err := verifyPassword(user.PasswordHash, newPassword)
			require.NoError(t, err)
			require.True(t, ok)
			require.NotNil(t, user.EmailVerifiedAt, "a completed reset marks the email verified")

			// The used token and the user's other reset token are both spent.
			for _, token := range []string{b.raw, b.other} {
				rec = serve(t, b.router, jsonRequest(t, "/v1/auth/reset-password", map[string]string{"token": token, "password": "yet another password"}))
				decodeProblem(t, rec, http.StatusBadRequest)
			}
			ok, err = verifyPassword(getUser(t, b.store, b.user.ID).PasswordHash, newPassword)
			require.NoError(t, err)
			require.True(t, ok)
		})

		t.Run("Form", func(t *testing.T) {
			t.Parallel()
			b := setupReset(t, valid())

			// A short password: the form again, with its error beside the field and the token kept.
			rec := serve(t, b.router, formRequest("/v1/auth/reset-password", url.Values{"token": {b.raw}, "password": {"short"}}))
			requireHTML(t, rec, http.StatusUnprocessableEntity,
				`<p class="field-error" id="password-error">Password must be at least 8 characters long.</p>`,
				`aria-describedby="password-hint password-error" aria-invalid="true"`,
				`<form method="post" action="reset-password" novalidate>`,
				`name="token" value="`+b.raw+`"`)
			require.NotContains(t, rec.Body.String(), "short", "the password is not shown again")
			requireTokenPageHeaders(t, rec)
			require.Equal(t, b.oldPassword, getUser(t, b.store, b.user.ID).PasswordHash)

			rec = serve(t, b.router, formRequest("/v1/auth/reset-password", url.Values{"token": {b.raw}, "password": {newPassword}}))
			requireHTML(t, rec, http.StatusOK, "Password changed", `<a class="button" href="http://localhost:8080">Sign in to postguard</a>`)
			requireTokenPageHeaders(t, rec)

			// A short password with a token that no longer works: the link's error, and the way on.
			rec = serve(t, b.router, formRequest("/v1/auth/reset-password", url.Values{"token": {b.other}, "password": {"short"}}))
			requireHTML(t, rec, http.StatusBadRequest, "This link or form does not work", `href="http://localhost:8080/v1/auth/forgot-password">Ask for a new link</a>`)

			// Without a token, or with one that is not a token, the form cannot be shown again:
			// the link's error too.
			for _, token := range []string{"", "not a token"} {
				rec = serve(t, b.router, formRequest("/v1/auth/reset-password", url.Values{"token": {token}, "password": {"short"}}))
				requireHTML(t, rec, http.StatusBadRequest, "This link or form does not work", "Ask for a new link")
			}
			rec = serve(t, b.router, jsonRequest(t, "/v1/auth/reset-password", map[string]string{"password": "short"}))
			decodeProblem(t, rec, http.StatusUnprocessableEntity) // JSON lists both fields, as before
		})

		t.Run("Expired", func(t *testing.T) {
			t.Parallel()
			b := setupReset(t, time.Now().Add(-time.Second))

			rec := serve(t, b.router, jsonRequest(t, "/v1/auth/reset-password", map[string]string{"token": b.raw, "password": newPassword}))
			decodeProblem(t, rec, http.StatusBadRequest)
			user := getUser(t, b.store, b.user.ID)
			require.Equal(t, b.oldPassword, user.PasswordHash)
			require.Nil(t, user.EmailVerifiedAt)
		})

		t.Run("VerifyTokenIsNotAResetToken", func(t *testing.T) {
			t.Parallel()
			b := setupReset(t, valid())
			verify := tokens.New()
			insertToken(t, b.store, verify, b.user.ID, db.TokenPurposeVerify, valid())

			rec := serve(t, b.router, jsonRequest(t, "/v1/auth/reset-password", map[string]string{"token": verify, "password": newPassword}))
			decodeProblem(t, rec, http.StatusBadRequest)
			require.Equal(t, b.oldPassword, getUser(t, b.store, b.user.ID).PasswordHash)
		})

		t.Run("ConcurrentUsesOneWins", func(t *testing.T) {
			t.Parallel()
			b := setupReset(t, valid())
			codes := concurrently(t, 2, func() *http.Request {
				return jsonRequest(t, "/v1/auth/reset-password", map[string]string{"token": b.raw, "password": newPassword})
			}, b.router)
			require.ElementsMatch(t, []int{http.StatusNoContent, http.StatusBadRequest}, codes)
		})

		t.Run("PageChangesNothing", func(t *testing.T) {
			t.Parallel()
			b := setupReset(t, valid())

			rec := serve(t, b.router, httptest.NewRequest(http.MethodGet, "/v1/auth/reset-password?token="+b.raw, nil))
			requireHTML(t, rec, http.StatusOK, `<form method="post" action="reset-password" novalidate>`, `name="token" value="`+b.raw+`"`, `type="password"`)
			requireTokenPageHeaders(t, rec)
			user := getUser(t, b.store, b.user.ID)
			require.Equal(t, b.oldPassword, user.PasswordHash)
			require.Nil(t, user.EmailVerifiedAt)

			rec = serve(t, b.router, formRequest("/v1/auth/reset-password", url.Values{"token": {b.raw}, "password": {newPassword}}))
			requireHTML(t, rec, http.StatusOK)
		})
	})
}

func TestServer_Unsubscribe(t *testing.T) {
	t.Parallel()

	oneClick := url.Values{"List-Unsubscribe": {"One-Click"}}

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		bundle := setup(t, newStore(t), nil)
		user := insertUser(t, bundle.store, uniqueEmail("unsub"), false)
		token := tokens.Unsubscribe(testSecret, user.ID)
		target := "/v1/unsubscribe?token=" + url.QueryEscape(token)

		// The page changes nothing.
		rec := serve(t, bundle.router, httptest.NewRequest(http.MethodGet, target, nil))
		requireHTML(t, rec, http.StatusOK, `<form method="post" action="unsubscribe?token=`+token+`">`, `name="List-Unsubscribe" value="One-Click"`)
		requireTokenPageHeaders(t, rec)
		require.Nil(t, getUser(t, bundle.store, user.ID).UnsubscribedAt)

		// One-click POST, urlencoded, no cookie or auth: done, and repeatable.
		rec = serve(t, bundle.router, formRequest(target, oneClick))
		requireHTML(t, rec, http.StatusOK, "You are unsubscribed")
		requireTokenPageHeaders(t, rec)
		first := getUser(t, bundle.store, user.ID).UnsubscribedAt
		require.NotNil(t, first)

		rec = serve(t, bundle.router, formRequest(target, oneClick))
		requireHTML(t, rec, http.StatusOK)
		rec = serve(t, bundle.router, multipartRequest(t, target, oneClick))
		requireHTML(t, rec, http.StatusOK)
		require.Equal(t, first.Unix(), getUser(t, bundle.store, user.ID).UnsubscribedAt.Unix())

		// Multipart alone works for another user.
		other := insertUser(t, bundle.store, uniqueEmail("unsub"), false)
		rec = serve(t, bundle.router, multipartRequest(t, "/v1/unsubscribe?token="+tokens.Unsubscribe(testSecret, other.ID), oneClick))
		requireHTML(t, rec, http.StatusOK)
		require.NotNil(t, getUser(t, bundle.store, other.ID).UnsubscribedAt)

		// Forged, foreign, malformed or missing tokens: 400, nothing changes, never a redirect.
		victim := insertUser(t, bundle.store, uniqueEmail("unsub"), false)
		for _, forged := range []string{
			tokens.Unsubscribe([]byte("another secret, another deployment!!"), victim.ID),
			strings.Replace(tokens.Unsubscribe(testSecret, user.ID), itoa(user.ID), itoa(victim.ID), 1),
			itoa(victim.ID) + ".",
			"",
		} {
			rec := serve(t, bundle.router, formRequest("/v1/unsubscribe?token="+url.QueryEscape(forged), oneClick))
			requireHTML(t, rec, http.StatusBadRequest)
			requireTokenPageHeaders(t, rec)
			rec = serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/v1/unsubscribe?token="+url.QueryEscape(forged), nil))
			requireHTML(t, rec, http.StatusBadRequest)
		}
		require.Nil(t, getUser(t, bundle.store, victim.ID).UnsubscribedAt)

		// RFC 8058's body is required.
		victimTarget := "/v1/unsubscribe?token=" + tokens.Unsubscribe(testSecret, victim.ID)
		rec = serve(t, bundle.router, formRequest(victimTarget, url.Values{"List-Unsubscribe": {"Maybe"}}))
		requireHTML(t, rec, http.StatusBadRequest)
		require.Nil(t, getUser(t, bundle.store, victim.ID).UnsubscribedAt)

		// A validly signed token of a user who no longer exists has nothing to do: still 200.
		rec = serve(t, bundle.router, formRequest("/v1/unsubscribe?token="+tokens.Unsubscribe(testSecret, 987654321), oneClick))
		requireHTML(t, rec, http.StatusOK)
	})
}

// concurrently sends n requests made by newRequest at once and returns their statuses.
func concurrently(t *testing.T, n int, newRequest func() *http.Request, router http.Handler) []int {
	t.Helper()
	reqs := make([]*http.Request, n)
	for i := range reqs {
		reqs[i] = newRequest()
	}
	codes := make([]int, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, req := range reqs {
		wg.Go(func() {
			<-start
			codes[i] = serve(t, router, req).Code
		})
	}
	close(start)
	wg.Wait()
	return codes
}

// TestServer_PagesCarryAppName: every HTML page of the service, forms, results and errors, names
// the product (APP_NAME) in its title and heading, escaped.
func TestServer_PagesCarryAppName(t *testing.T) {
	t.Parallel()

	bundle := setup(t, dbtest.NewSQLite(t), &setupOpts{configFunc: func(config *Config) { config.AppName = "Acme & Co" }})
	user := insertUser(t, bundle.store, uniqueEmail("brand"), false)
	raw := tokens.New()
	insertToken(t, bundle.store, raw, user.ID, db.TokenPurposeVerify, time.Now().Add(time.Hour))
	reset := tokens.New()
	insertToken(t, bundle.store, reset, user.ID, db.TokenPurposeReset, time.Now().Add(time.Hour))
	unsubscribe := "/v1/unsubscribe?token=" + url.QueryEscape(tokens.Unsubscribe(testSecret, user.ID))

	for _, tt := range []struct {
		name  string
		req   *http.Request
		title string
	}{
		{"VerifyPage", httptest.NewRequest(http.MethodGet, "/v1/auth/verify-email?token="+raw, nil), "Confirm your email address"},
		{"VerifyResult", formRequest("/v1/auth/verify-email", url.Values{"token": {raw}}), "Email address confirmed"},
		{"VerifyError", formRequest("/v1/auth/verify-email", url.Values{"token": {raw}}), "This link or form does not work"},
		{"ResetPage", httptest.NewRequest(http.MethodGet, "/v1/auth/reset-password?token="+reset, nil), "Choose a new password"},
		{"ForgotPasswordPage", httptest.NewRequest(http.MethodGet, "/v1/auth/forgot-password", nil), "Reset your password"},
		{"UnsubscribePage", httptest.NewRequest(http.MethodGet, unsubscribe, nil), "Unsubscribe"},
	} {
		rec := serve(t, bundle.router, tt.req)
		require.Equal(t, "text/html; charset=utf-8", rec.Header().Get("Content-Type"), tt.name)
		body := rec.Body.String()
		require.Contains(t, body, "<title>"+tt.title+" · Acme &amp; Co</title>", tt.name)
		require.Contains(t, body, `<h1><span class="brand">Acme &amp; Co</span> `+tt.title+`</h1>`, tt.name)
	}

	// Without APP_NAME: postguard.
	plain := newSQLiteBundle(t, nil)
	insertToken(t, plain.store, raw, insertUser(t, plain.store, uniqueEmail("brand"), false).ID, db.TokenPurposeVerify, time.Now().Add(time.Hour))
	rec := serve(t, plain.router, httptest.NewRequest(http.MethodGet, "/v1/auth/verify-email?token="+raw, nil))
	require.Contains(t, rec.Body.String(), "<title>Confirm your email address · postguard</title>")
}
