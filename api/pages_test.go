package api

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/tokens"
)

// examplesMail is README's worked example of MAIL_TEMPLATES_DIR: a French welcome and French
// pages.
const examplesMail = "../examples/mail"

// testLoginURL is APP_LOGIN_URL in the tests of pages: where every answer page links.
const testLoginURL = "https://acme.example/login"

// withFrenchPages gives the router a renderer of examples/mail, branded Acme, with a login URL.
func withFrenchPages(t testing.TB) func(config *Config) {
	t.Helper()
	renderer, err := mail.NewRenderer(&mail.RendererConfig{
		AppName: "Acme", AppURL: "http://localhost:8080", LoginURL: testLoginURL, TemplatesDir: examplesMail,
	})
	require.NoError(t, err)
	return func(config *Config) { config.Renderer = renderer }
}

// insertUserWithLocale inserts a user of locale directly (no jobs) and returns it.
func insertUserWithLocale(t testing.TB, store riverstore.Store, locale string) *db.User {
	t.Helper()
	user, err := store.UserInsert(t.Context(), &db.UserInsertParams{
		Email: strings.ToLower(uniqueEmail("page")), PasswordHash: "$argon2id$v=19$m=19456,t=2,p=1$x$y", Locale: locale, Now: time.Now(),
	})
	require.NoError(t, err)
	return user
}

// withHeader sets a header of req and returns it.
func withHeader(req *http.Request, name, value string) *http.Request {
	req.Header.Set(name, value)
	return req
}

// requirePage checks a page's answer: its status, language, headers and words.
func requirePage(t testing.TB, rec *httptest.ResponseRecorder, status int, locale string, contains ...string) {
	t.Helper()
	requireHTML(t, rec, status, contains...)
	require.Equal(t, locale, rec.Header().Get("Content-Language"))
	require.Contains(t, rec.Body.String(), `<html lang="`+locale+`">`)
	require.Equal(t, "DENY", rec.Header().Get("X-Frame-Options"))
	require.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
	csp := rec.Header().Get("Content-Security-Policy")
	require.Contains(t, csp, "frame-ancestors 'none'")
	require.Contains(t, csp, "style-src 'sha256-")
	require.NotContains(t, csp, "unsafe-inline")
}

// TestServer_PagesLocale: a link's pages, its answers and its errors are in the language of the
// token's user; without one (an invalid token), in the browser's; else DEFAULT_LOCALE's.
func TestServer_PagesLocale(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		bundle := setup(t, newStore(t), &setupOpts{configFunc: withFrenchPages(t)})
		// Each subtest has a user of its own: they run in parallel, and a reset also verifies
		// its user's address.
		inEnglish := func(req *http.Request) *http.Request { return withHeader(req, "Accept-Language", "en-US,en;q=0.9") }
		inFrench := func(req *http.Request) *http.Request { return withHeader(req, "Accept-Language", "fr-CH, fr;q=0.9") }

		t.Run("Verify", func(t *testing.T) {
			t.Parallel()
			french := insertUserWithLocale(t, bundle.store, "fr-CA")
			raw := tokens.New()
			insertToken(t, bundle.store, raw, french.ID, db.TokenPurposeVerify, time.Now().Add(time.Hour))

			// The user's language wins over the browser's.
			rec := serve(t, bundle.router, inEnglish(httptest.NewRequest(http.MethodGet, "/v1/auth/verify-email?token="+raw, nil)))
			requirePage(t, rec, http.StatusOK, "fr", "<title>Confirmez votre adresse e-mail · Acme</title>", `name="token" value="`+raw+`"`)
			require.Nil(t, getUser(t, bundle.store, french.ID).EmailVerifiedAt, "a GET changes nothing")

			rec = serve(t, bundle.router, inEnglish(formRequest("/v1/auth/verify-email", url.Values{"token": {raw}})))
			requirePage(t, rec, http.StatusOK, "fr", "Adresse e-mail confirmée", `href="`+testLoginURL+`">Se connecter à Acme</a>`)
			require.NotNil(t, getUser(t, bundle.store, french.ID).EmailVerifiedAt)

			// Used now: no user to read, so the browser's language; then the default's.
			rec = serve(t, bundle.router, inFrench(formRequest("/v1/auth/verify-email", url.Values{"token": {raw}})))
			requirePage(t, rec, http.StatusBadRequest, "fr", "Ce lien ne fonctionne pas", `href="`+testLoginURL+`"`)
			rec = serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/v1/auth/verify-email?token="+raw, nil))
			requirePage(t, rec, http.StatusBadRequest, "en", "This link or form does not work", "Sign in to ask for a new verification email.", `href="`+testLoginURL+`"`)
		})

		t.Run("Reset", func(t *testing.T) {
			t.Parallel()
			french := insertUserWithLocale(t, bundle.store, "fr-CA")
			raw := tokens.New()
			insertToken(t, bundle.store, raw, french.ID, db.TokenPurposeReset, time.Now().Add(time.Hour))

			rec := serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/v1/auth/reset-password?token="+raw, nil))
			requirePage(t, rec, http.StatusOK, "fr", "Choisissez un nouveau mot de passe", `<label for="password">Nouveau mot de passe</label>`)

			rec = serve(t, bundle.router, inEnglish(formRequest("/v1/auth/reset-password", url.Values{"token": {raw}, "password": {"court"}})))
			requirePage(t, rec, http.StatusUnprocessableEntity, "fr",
				`<p class="field-error" id="password-error">Ce mot de passe ne convient pas : il doit compter de 8 à 256 caractères.</p>`,
				`aria-describedby="password-hint password-error" aria-invalid="true"`, `name="token" value="`+raw+`"`)

			rec = serve(t, bundle.router, inEnglish(formRequest("/v1/auth/reset-password", url.Values{"token": {raw}, "password": {"nouveau mot de passe"}})))
			requirePage(t, rec, http.StatusOK, "fr", "Mot de passe modifié", `href="`+testLoginURL+`"`)

			// Spent: the error, with the way to a new link, in the browser's language.
			rec = serve(t, bundle.router, inFrench(httptest.NewRequest(http.MethodGet, "/v1/auth/reset-password?token="+raw, nil)))
			requirePage(t, rec, http.StatusBadRequest, "fr", "Ce lien ne fonctionne pas", `href="http://localhost:8080/v1/auth/forgot-password">Demander un nouveau lien</a>`)
		})

		t.Run("Unsubscribe", func(t *testing.T) {
			t.Parallel()
			french := insertUserWithLocale(t, bundle.store, "fr-CA")
			target := "/v1/unsubscribe?token=" + url.QueryEscape(tokens.Unsubscribe(testSecret, french.ID))

			rec := serve(t, bundle.router, inEnglish(httptest.NewRequest(http.MethodGet, target, nil)))
			requirePage(t, rec, http.StatusOK, "fr", "<title>Se désabonner · Acme</title>", `<button type="submit">Me désabonner</button>`)
			rec = serve(t, bundle.router, inEnglish(formRequest(target, url.Values{"List-Unsubscribe": {"One-Click"}})))
			requirePage(t, rec, http.StatusOK, "fr", "Vous êtes désabonné", `href="`+testLoginURL+`"`)

			// A user who is gone: still a success, in the browser's language.
			gone := "/v1/unsubscribe?token=" + url.QueryEscape(tokens.Unsubscribe(testSecret, french.ID+1000))
			rec = serve(t, bundle.router, inFrench(httptest.NewRequest(http.MethodGet, gone, nil)))
			requirePage(t, rec, http.StatusOK, "fr", "Se désabonner")
			rec = serve(t, bundle.router, formRequest(gone, url.Values{"List-Unsubscribe": {"One-Click"}}))
			requirePage(t, rec, http.StatusOK, "en", "You are unsubscribed")
		})

		t.Run("UserWithoutLocale", func(t *testing.T) {
			t.Parallel()
			english := insertUserWithLocale(t, bundle.store, "")
			raw := tokens.New()
			insertToken(t, bundle.store, raw, english.ID, db.TokenPurposeVerify, time.Now().Add(time.Hour))

			rec := serve(t, bundle.router, inFrench(httptest.NewRequest(http.MethodGet, "/v1/auth/verify-email?token="+raw, nil)))
			requirePage(t, rec, http.StatusOK, "fr", "Confirmez votre adresse e-mail")
			rec = serve(t, bundle.router, withHeader(httptest.NewRequest(http.MethodGet, "/v1/auth/verify-email?token="+raw, nil), "Accept-Language", "de-DE"))
			requirePage(t, rec, http.StatusOK, "en", "Confirm your email address")
		})
	})
}

// TestServer_ForgotPasswordPage: GET /v1/auth/forgot-password is a form that posts to the route;
// a bad address shows it again with its error; every other answer is one page, the same byte
// for byte whether the address has an account (a French one) or not, limited like the JSON
// route.
func TestServer_ForgotPasswordPage(t *testing.T) {
	t.Parallel()

	now := time.Now().Truncate(15 * time.Minute) // a window's start: its 429 waits the whole window
	rules := generousRules().With(abuse.Rule{Action: abuse.ActionForgotPassword, Scope: abuse.ScopeIP, Limit: 2, Window: 15 * time.Minute})

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		bundle := setup(t, newStore(t), &setupOpts{rules: &rules, limiterNow: func() time.Time { return now }, configFunc: withFrenchPages(t)})
		known := insertUserWithLocale(t, bundle.store, "fr")
		post := func(ip, email string) *httptest.ResponseRecorder {
			req := formRequest("/v1/auth/forgot-password", url.Values{"email": {email}})
			req.RemoteAddr = ip + ":4321"
			return serve(t, bundle.router, req)
		}

		rec := serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/v1/auth/forgot-password", nil))
		requirePage(t, rec, http.StatusOK, "en", "<title>Reset your password · Acme</title>",
			`<form method="post" action="forgot-password" novalidate>`,
			`<label for="email">Email address</label>`, `name="email" type="email" autocomplete="email" required value=""`,
			`href="`+testLoginURL+`"`)
		require.Empty(t, rec.Header().Get("Referrer-Policy"), "not a token's page")
		rec = serve(t, bundle.router, withHeader(httptest.NewRequest(http.MethodGet, "/v1/auth/forgot-password", nil), "Accept-Language", "fr"))
		requirePage(t, rec, http.StatusOK, "fr", "Réinitialiser votre mot de passe")

		// Not an address: the form again, its error beside the field, the input kept; nothing
		// spent (the limit of 2 is still whole below).
		for range 3 {
			rec = post("192.0.2.30", `ada@"example`)
			requirePage(t, rec, http.StatusUnprocessableEntity, "en",
				`<p class="field-error" id="email-error">Email must be one plain address, like name@example.com.</p>`,
				`value="ada@&#34;example" aria-invalid="true" aria-describedby="email-error" autofocus`)
		}
		rec = post("192.0.2.30", "")
		requirePage(t, rec, http.StatusUnprocessableEntity, "en", "Email is required.")

		// A known address (whose user is French) and an unknown one: one page, in the browser's
		// language, never the user's.
		answer := func(ip, email string) (int, http.Header, string) {
			rec := post(ip, email)
			h := rec.Header().Clone()
			h.Del(requestIDHeader)
			h.Del("Date")
			return rec.Code, h, rec.Body.String()
		}
		knownStatus, knownHeader, knownBody := answer("192.0.2.30", known.Email)
		unknownStatus, unknownHeader, unknownBody := answer("192.0.2.31", uniqueEmail("nobody"))
		require.Equal(t, http.StatusOK, knownStatus)
		require.Equal(t, knownStatus, unknownStatus)
		require.Equal(t, knownHeader, unknownHeader)
		require.Equal(t, knownBody, unknownBody)
		require.Contains(t, knownBody, "<title>Check your email · Acme</title>")
		require.Contains(t, knownBody, `href="`+testLoginURL+`"`)
		require.Equal(t, "en", knownHeader.Get("Content-Language"))
		require.Equal(t, 1, jobCount(t, bundle.store, "password_reset_email"))

		// Limited exactly like the JSON route: the IP's second request passes, its third is the
		// error page with the wait.
		rec = post("192.0.2.30", uniqueEmail("nobody"))
		require.Equal(t, http.StatusOK, rec.Code)
		rec = post("192.0.2.30", uniqueEmail("nobody"))
		requirePage(t, rec, http.StatusTooManyRequests, "en", "Too many attempts", "Please wait 15 minutes, then try again.")
		require.Equal(t, "900", rec.Header().Get("Retry-After"))
		rec = serve(t, bundle.router, func() *http.Request {
			req := jsonRequest(t, "/v1/auth/forgot-password", map[string]string{"email": known.Email})
			req.RemoteAddr = "192.0.2.30:4321"
			return req
		}())
		decodeProblem(t, rec, http.StatusTooManyRequests)

		// JSON is unchanged: 202 and its message.
		rec = serve(t, bundle.router, jsonRequest(t, "/v1/auth/forgot-password", map[string]string{"email": known.Email}))
		require.Equal(t, http.StatusAccepted, rec.Code)
		require.JSONEq(t, string(forgotPasswordAnswer), rec.Body.String())
	})
}

// TestServer_StartPage: where /dev/mail is served, GET / is a page linking it, for the requests
// /dev/mail answers (from this machine); otherwise / is not a route.
func TestServer_StartPage(t *testing.T) {
	t.Parallel()

	local := func(method string) *http.Request {
		req := httptest.NewRequest(method, "/", nil)
		req.RemoteAddr, req.Host = "127.0.0.1:50123", "localhost:8080"
		return req
	}
	bundle := newSQLiteBundle(t, &setupOpts{configFunc: func(config *Config) { config.DevMail = mail.NewOutbox(0) }})
	rec := serve(t, bundle.router, local(http.MethodGet))
	requirePage(t, rec, http.StatusOK, "en", "<title>Start here · postguard</title>", `href="/dev/mail">Read the mail</a>`, `<a href="/v1/auth/forgot-password">`)

	// Another machine gets the 404 of an unknown path, whatever the method, as /dev/mail does.
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		decodeProblem(t, serve(t, bundle.router, httptest.NewRequest(method, "/", nil)), http.StatusNotFound)
	}

	rec = serve(t, newSQLiteBundle(t, nil).router, local(http.MethodGet))
	decodeProblem(t, rec, http.StatusNotFound)
}

// TestServer_PagesLinkOn: no answer page is a dead end: each links to APP_LOGIN_URL.
func TestServer_PagesLinkOn(t *testing.T) {
	t.Parallel()

	renderer, err := mail.NewRenderer(&mail.RendererConfig{AppName: "Acme", AppURL: "http://localhost:8080", LoginURL: testLoginURL})
	require.NoError(t, err)
	bundle := newSQLiteBundle(t, &setupOpts{configFunc: func(config *Config) { config.Renderer = renderer }})
	user := insertUser(t, bundle.store, uniqueEmail("next"), false)
	verify, reset := tokens.New(), tokens.New()
	insertToken(t, bundle.store, verify, user.ID, db.TokenPurposeVerify, time.Now().Add(time.Hour))
	insertToken(t, bundle.store, reset, user.ID, db.TokenPurposeReset, time.Now().Add(time.Hour))
	unsubscribe := "/v1/unsubscribe?token=" + url.QueryEscape(tokens.Unsubscribe(testSecret, user.ID))

	for name, req := range map[string]*http.Request{
		"EmailVerified":   formRequest("/v1/auth/verify-email", url.Values{"token": {verify}}),
		"PasswordChanged": formRequest("/v1/auth/reset-password", url.Values{"token": {reset}, "password": {"a new password"}}),
		"Unsubscribed":    formRequest(unsubscribe, url.Values{"List-Unsubscribe": {"One-Click"}}),
		"ResetLinkSent":   formRequest("/v1/auth/forgot-password", url.Values{"email": {user.Email}}),
		"InvalidLink":     httptest.NewRequest(http.MethodGet, "/v1/auth/verify-email?token="+tokens.New(), nil),
		"BadForm":         formRequest("/v1/auth/verify-email", url.Values{}),
		"TooLarge":        formRequest("/v1/auth/verify-email", url.Values{"token": {strings.Repeat("a", MaxBodyBytes)}}),
	} {
		rec := serve(t, bundle.router, req)
		require.Equal(t, "text/html; charset=utf-8", rec.Header().Get("Content-Type"), name)
		require.Contains(t, rec.Body.String(), `href="`+testLoginURL+`"`, name)
		require.Equal(t, 1, strings.Count(rec.Body.String(), "<h1>"), name)
	}
}
