package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/cmd/internal/service"
	"github.com/postguard/postguard/jobs/mail"
)

// axeCorePath is axe-core's script, which `make axe-core` installs (npm ci, the version and hash
// of scripts/axe/package-lock.json).
const axeCorePath = "../../scripts/axe/node_modules/axe-core/axe.min.js"

// pagesScreenshots is where TestServe_PagesBrowser writes each page's screenshot under
// -update-screenshot; README.md shows them.
const pagesScreenshots = "../../docs/pages"

// testBrandColor is APP_BRAND_COLOR in the browser tests: a teal, its computed CSS value, and
// the white its buttons' text gets (5.47:1).
const (
	testBrandColor    = "#0f766e"
	testBrandColorCSS = "rgb(15, 118, 110)"
)

// axeSource reads axe-core's script, or skips the test (fails it under CI=true) when it is not
// installed.
func axeSource(t *testing.T) string {
	t.Helper()

	data, err := os.ReadFile(axeCorePath)
	if err != nil {
		msg := fmt.Sprintf("no axe-core at %s: run `make axe-core` (npm ci in scripts/axe) to run the accessibility checks; under CI=true this fails (%v)", axeCorePath, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return string(data)
}

// axeViolation is one rule a page breaks, as axe-core reports it.
type axeViolation struct {
	ID     string `json:"id"`
	Impact string `json:"impact"`
	Help   string `json:"help"`
	Nodes  []struct {
		HTML           string `json:"html"`
		FailureSummary string `json:"failureSummary"`
	} `json:"nodes"`
}

// browser is one headless Chromium for a test, with axe-core at hand.
type browser struct {
	t   *testing.T
	ctx context.Context
	axe string
	// checked counts, for the test's log, each page's or mail's violations: all of them and
	// those of impact serious or critical.
	checked *[]string
}

// in is b for the subtest t: its failures are t's.
func (b *browser) in(t *testing.T) *browser {
	c := *b
	c.t = t
	return &c
}

// newBrowser starts a headless Chromium that asks for pages in language, with axe-core at hand.
func newBrowser(t *testing.T, server *runningServer, language string) *browser {
	t.Helper()

	axe := axeSource(t)
	ctx := startBrowser(t, server, &browserOpts{width: 800, height: 700, language: language})
	return &browser{t: t, ctx: ctx, axe: axe, checked: new([]string)}
}

// step is a context for one step of a flow: 30 s at most.
func (b *browser) step() context.Context {
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	b.t.Cleanup(cancel)
	return ctx
}

// open navigates to url and returns the answer's status.
func (b *browser) open(url string) int64 {
	b.t.Helper()
	resp, err := chromedp.Run(b.step(), chromedp.NavigateResponse(url))
	require.NoError(b.t, err, "error opening %s", url)
	return resp.Status
}

// follow clicks the link or button sel (an XPath) finds, as a person would, waits for the page
// it opens and returns that page's status. The element is activated by its click(), not by a
// mouse event at its box's centre: a link that wraps onto two lines (a mail's long link in
// /dev/mail's text part) may have its centre beside it.
func (b *browser) follow(sel string) int64 {
	b.t.Helper()
	click := func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		found, err := chromedp.Evaluate[bool](`(() => {
			const el = document.evaluate(`+strconv.Quote(sel)+`, document, null, XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue;
			if (!el) return false;
			el.click();
			return true;
		})()`)(ctx, t)
		if err == nil && !found {
			err = errors.New("nothing matches")
		}
		return chromedp.Void{}, err
	}
	resp, err := chromedp.RunResponse(b.step(), chromedp.WaitVisible(chromedp.Search(sel)), click)
	require.NoError(b.t, err, "error following %s", sel)
	return resp.Status
}

// fill types value into the input sel finds, after clearing it.
func (b *browser) fill(sel, value string) {
	b.t.Helper()
	require.NoError(b.t, chromedp.Do(b.step(),
		chromedp.Clear(chromedp.Search(sel), chromedp.NodeVisible),
		chromedp.SendKeys(chromedp.Search(sel), value, chromedp.NodeVisible),
	), "error typing into %s", sel)
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](b *browser, expression string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.step(), chromedp.Evaluate[T](expression))
	require.NoError(b.t, err, "error evaluating %s", expression)
	return v
}

// location is the page's URL.
func (b *browser) location() string {
	b.t.Helper()
	location, err := chromedp.Run(b.step(), chromedp.Location())
	require.NoError(b.t, err)
	return location
}

// text is what a person reads on the page.
func (b *browser) text() string { return eval[string](b, `document.body.innerText`) }

// requireAccessible runs axe-core on the page (WCAG 2 A and AA, and best practices) and fails
// the test on any violation of impact serious or critical, listing them; it records the counts
// under name.
func (b *browser) requireAccessible(name string) {
	b.t.Helper()
	ctx := b.step()
	// The pages allow no script: axe is evaluated by the DevTools protocol, which their
	// Content-Security-Policy does not govern, so the page is checked as its visitors get it.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](b.axe+"\n;typeof axe === 'object'")); err != nil {
		b.t.Fatalf("error injecting axe-core into %s: %v", name, err)
	}
	violations, err := chromedp.Run(ctx, chromedp.Evaluate[[]axeViolation](
		`axe.run(document, {resultTypes: ["violations"]}).then(r => r.violations)`, chromedp.EvalAwaitPromise))
	require.NoError(b.t, err, "error running axe-core on %s", name)

	var blocking, minor []string
	for _, v := range violations {
		if v.Impact != "serious" && v.Impact != "critical" {
			minor = append(minor, v.ID+" ("+v.Impact+")")
			continue
		}
		nodes := make([]string, 0, len(v.Nodes))
		for _, n := range v.Nodes {
			nodes = append(nodes, n.HTML+": "+n.FailureSummary)
		}
		blocking = append(blocking, fmt.Sprintf("%s (%s): %s\n    %s", v.ID, v.Impact, v.Help, strings.Join(nodes, "\n    ")))
	}
	*b.checked = append(*b.checked, fmt.Sprintf("%-40s %d serious or critical; %d others %v", name, len(blocking), len(minor), minor))
	if len(blocking) > 0 {
		b.t.Fatalf("axe-core: %s has %d violations of impact serious or critical:\n%s", name, len(blocking), strings.Join(blocking, "\n"))
	}
}

// screenshot writes the page's screenshot to docs/pages/NAME.png under -update-screenshot, and
// checks that the committed one is a PNG otherwise.
func (b *browser) screenshot(name string) {
	b.t.Helper()
	path := filepath.Join(pagesScreenshots, name+".png")
	if *updateScreenshot {
		shot, err := chromedp.Run(b.step(), chromedp.FullScreenshot(100))
		require.NoError(b.t, err)
		require.NoError(b.t, os.MkdirAll(pagesScreenshots, 0o750))
		require.NoError(b.t, os.WriteFile(path, shot, 0o600))
		b.t.Logf("wrote %s", path)
	}
	committed, err := os.ReadFile(path) //nolint:gosec // the repository's own file
	require.NoError(b.t, err, "README shows %s: run TestServe_PagesBrowser with -update-screenshot to write it", path)
	_, err = png.DecodeConfig(bytes.NewReader(committed))
	require.NoError(b.t, err, "%s is a PNG", path)
}

// requireBranded checks what every page shows of the brand: its language, the product in its
// title and in its one heading (the logo, loaded, with the product as its text), and the
// buttons in the brand colour with white text.
func (b *browser) requireBranded(locale, title string) {
	b.t.Helper()
	require.Equal(b.t, locale, eval[string](b, `document.documentElement.lang`))
	require.Equal(b.t, title+" · Acme", eval[string](b, `document.title`))
	require.Equal(b.t, 1, eval[int](b, `document.querySelectorAll("h1").length`))
	require.Equal(b.t, "Acme "+title, eval[string](b, `(() => { const h = document.querySelector("h1"); return (h.querySelector("img").alt + " " + h.textContent).replace(/\s+/g, " ").trim() })()`))
	require.True(b.t, eval[bool](b, `(() => { const img = document.querySelector("h1 img"); return img.complete && img.naturalWidth > 0 })()`),
		"the logo loads (the page's policy allows APP_LOGO_URL's origin)")
	button := eval[map[string]string](b, `(() => { const s = getComputedStyle(document.querySelector("button, .button")); return {bg: s.backgroundColor, fg: s.color} })()`)
	require.Equal(b.t, map[string]string{"bg": testBrandColorCSS, "fg": "rgb(255, 255, 255)"}, button,
		"the button in APP_BRAND_COLOR (the page's own styles apply under its policy)")
}

// requireLinksOn checks that the page links to APP_LOGIN_URL, and that following the link lands
// on the app's sign-in page: the page is no dead end.
func (b *browser) requireLinksOn(loginURL, label string) {
	b.t.Helper()
	require.EqualValues(b.t, http.StatusOK, b.follow(`//a[@href="`+loginURL+`"][contains(., "`+label+`")]`))
	require.Equal(b.t, loginURL, b.location())
	require.Contains(b.t, b.text(), "Sign in to Acme")
}

// appServer is the host app of the browser tests: its sign-in page (APP_LOGIN_URL) and its logo
// (APP_LOGO_URL).
func appServer(t *testing.T) *httptest.Server {
	t.Helper()

	const logo = `<svg xmlns="http://www.w3.org/2000/svg" width="132" height="32" viewBox="0 0 132 32">` +
		`<rect width="32" height="32" rx="7" fill="#0f766e"/><path d="M9 23l7-14 7 14z" fill="#fff"/>` +
		`<text x="40" y="24" font-family="Helvetica, Arial, sans-serif" font-size="22" font-weight="700" fill="#0f766e">Acme</text></svg>`
	mux := http.NewServeMux()
	mux.HandleFunc("GET /login", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(`<!doctype html><html lang="en"><title>Sign in · Acme</title><h1>Sign in to Acme</h1>`))
	})
	mux.HandleFunc("GET /logo.svg", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "image/svg+xml")
		_, _ = w.Write([]byte(logo))
	})
	server := httptest.NewServer(mux)
	t.Cleanup(server.Close)
	return server
}

// startServerOwnURL starts `postguard serve` with APP_URL its own address, so that the links in
// its mail lead back to it: the port is chosen first, then given to HTTP_ADDR; should another
// process take it in between, the server cannot listen and is started again on another.
func startServerOwnURL(t *testing.T, env map[string]string) *runningServer {
	t.Helper()

	for range 5 {
		probe, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := probe.Addr().String()
		require.NoError(t, probe.Close())
		env["HTTP_ADDR"], env["APP_URL"] = addr, "http://"+addr
		server, err := tryStartServer(t, service.RoleServe, env)
		if errors.Is(err, syscall.EADDRINUSE) {
			continue
		}
		require.NoError(t, err)
		return server
	}
	t.Fatal("no free port for the server in 5 tries")
	return nil
}

// TestServe_PagesBrowser walks each flow of the service's pages as a person does, in a real
// headless Chromium, through the real wiring (serve, the log mailer and /dev/mail), branded
// (APP_BRAND_COLOR, APP_LOGO_URL, APP_LOGIN_URL): a new user verifies their address from the
// mail; a user who forgot their password asks for a link, gets the form, types a password too
// short and is shown the form again with its error, then sets it; a user unsubscribes from the
// welcome. In English (the built-in pages) and in French (examples/mail: a user who chose fr,
// a browser that asks for it). axe-core checks every page and every built-in mail:
// no violation of impact serious or critical. With -update-screenshot it writes each English
// page's screenshot to docs/pages/, which README.md shows.
func TestServe_PagesBrowser(t *testing.T) {
	t.Parallel()

	app := appServer(t)
	loginURL, logoURL := app.URL+"/login", app.URL+"/logo.svg"
	env := func(templates string) map[string]string {
		env := map[string]string{
			"DATABASE_URL":            "sqlite://" + filepath.Join(t.TempDir(), "postguard.db"),
			"MAILER":                  "log",
			"APP_NAME":                "Acme",
			"APP_LOGIN_URL":           loginURL,
			"APP_BRAND_COLOR":         testBrandColor,
			"APP_LOGO_URL":            logoURL,
			"JOB_FETCH_COOLDOWN":      "10ms",
			"JOB_FETCH_POLL_INTERVAL": "50ms",
		}
		if templates != "" {
			env["MAIL_TEMPLATES_DIR"] = templates
		}
		return env
	}

	for _, tt := range []struct {
		name, templates, locale string
		// language is the browser's.
		language string
		// words are the titles of the pages, and the labels of their links and buttons.
		words map[string]string
	}{
		{
			name: "English", locale: "en", language: "en-US",
			words: map[string]string{
				"verify": "Confirm your email address", "confirm": "Confirm my email address", "verified": "Email address confirmed", "signIn": "Sign in to Acme",
				"start": "Start here", "askReset": "Ask for a password reset", "forgot": "Reset your password", "email": "Email address",
				"emailError": "Email must be one plain address, like name@example.com.", "send": "Send me a reset link", "sent": "Check your email", "back": "Back to sign in",
				"reset": "Choose a new password", "password": "New password", "passwordError": "Password must be at least 8 characters long.",
				"setPassword": "Set my new password", "changed": "Password changed",
				"unsubscribe": "Unsubscribe", "unsubscribeButton": "Unsubscribe", "unsubscribed": "You are unsubscribed", "goTo": "Go to Acme",
				"error": "This link or form does not work",
			},
		},
		{
			name: "French", templates: frenchMailTemplates, locale: "fr", language: "fr-FR",
			words: map[string]string{
				"verify": "Confirmez votre adresse e-mail", "confirm": "Confirmer mon adresse", "verified": "Adresse e-mail confirmée", "signIn": "Se connecter à Acme",
				"start": "Par où commencer", "askReset": "Demander un nouveau mot de passe", "forgot": "Réinitialiser votre mot de passe", "email": "Adresse e-mail",
				"emailError": "Saisissez une seule adresse, comme nom@exemple.fr.", "send": "M’envoyer un lien", "sent": "Consultez vos e-mails", "back": "Retour à la connexion",
				"reset": "Choisissez un nouveau mot de passe", "password": "Nouveau mot de passe", "passwordError": "Ce mot de passe ne convient pas : il doit compter de 8 à 256 caractères.",
				"setPassword": "Enregistrer mon mot de passe", "changed": "Mot de passe modifié",
				"unsubscribe": "Se désabonner", "unsubscribeButton": "Me désabonner", "unsubscribed": "Vous êtes désabonné", "goTo": "Aller sur Acme",
				"error": "Ce lien ne fonctionne pas",
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			w := tt.words
			env := env(tt.templates)
			server := startServerOwnURL(t, env)
			b := newBrowser(t, server, tt.language)
			english := tt.locale == "en"
			shot := func(name string) {
				if english {
					b.screenshot(name)
				}
			}
			keptMails := func(n int) {
				t.Helper()
				require.Eventually(t, func() bool {
					return strings.Count(server.Logs.String(), "email kept by the log mailer") >= n
				}, 30*time.Second, 50*time.Millisecond, "mail not kept; logs:\n%s", server.Logs.String())
			}
			// openMail opens /dev/mail, the newest mail whose subject has subject, and returns
			// the XPath of the link of its text part whose address has path.
			openMail := func(subject string) {
				t.Helper()
				require.EqualValues(t, http.StatusOK, b.open(server.URL+"/dev/mail"))
				require.EqualValues(t, http.StatusOK, b.follow(`//a[contains(., "`+subject+`")]`))
			}
			textLink := func(path string) string { return `//pre/a[contains(@href, "` + path + `")]` }

			// A user registers (as the host app's sign-up would) in their language.
			email := "amelie." + tt.locale + "@example.com"
			body := `{"email":"` + email + `","password":"correct horse battery","name":"Amélie"`
			if !english {
				body += `,"locale":"fr"`
			}
			status, answer := opsPost(t, server.URL+"/v1/auth/register", body+"}")
			require.Equal(t, http.StatusCreated, status, answer)
			keptMails(2)

			t.Run("Verify", func(t *testing.T) {
				b := b.in(t)
				openMail("Verify your email address for Acme")
				require.EqualValues(t, http.StatusOK, b.follow(textLink("/v1/auth/verify-email?token=")))
				require.True(t, strings.HasPrefix(b.location(), server.URL+"/v1/auth/verify-email?token="))
				b.requireBranded(tt.locale, w["verify"])
				b.requireAccessible(tt.name + " verify_email")
				shot("verify-email")

				require.EqualValues(t, http.StatusOK, b.follow(`//button[contains(., "`+w["confirm"]+`")]`))
				b.requireBranded(tt.locale, w["verified"])
				b.requireAccessible(tt.name + " email_verified")
				shot("email-verified")
				b.requireLinksOn(loginURL, w["signIn"])

				// The link again: used now, the error page, with the way on (a used token has no
				// user to read: the browser's language).
				openMail("Verify your email address for Acme")
				require.EqualValues(t, http.StatusBadRequest, b.follow(textLink("/v1/auth/verify-email?token=")))
				require.Contains(t, b.text(), w["error"])
				b.requireAccessible(tt.name + " error")
				shot("error")
			})

			t.Run("ForgotPassword", func(t *testing.T) {
				b := b.in(t)
				require.EqualValues(t, http.StatusOK, b.open(server.URL+"/"))
				b.requireBranded(tt.locale, w["start"])
				b.requireAccessible(tt.name + " start")
				shot("start")

				require.EqualValues(t, http.StatusOK, b.follow(`//a[contains(., "`+w["askReset"]+`")]`))
				b.requireBranded(tt.locale, w["forgot"])
				b.requireAccessible(tt.name + " forgot_password")
				shot("forgot-password")

				// An address without a domain's dot: the form again, the error beside its field.
				b.fill(`//input[@id="email"]`, "amelie@example")
				require.EqualValues(t, http.StatusUnprocessableEntity, b.follow(`//button[contains(., "`+w["send"]+`")]`))
				requireFieldError(t, b, "email", w["email"], w["emailError"])
				require.Equal(t, "amelie@example", eval[string](b, `document.getElementById("email").value`), "what was typed is kept")
				b.requireAccessible(tt.name + " forgot_password with its error")
				shot("forgot-password-error")

				b.fill(`//input[@id="email"]`, email)
				require.EqualValues(t, http.StatusOK, b.follow(`//button[contains(., "`+w["send"]+`")]`))
				b.requireBranded(tt.locale, w["sent"])
				b.requireAccessible(tt.name + " reset_link_sent")
				shot("reset-link-sent")
				b.requireLinksOn(loginURL, w["back"])
				keptMails(3)

				openMail("Reset your Acme password")
				require.EqualValues(t, http.StatusOK, b.follow(textLink("/v1/auth/reset-password?token=")))
				b.requireBranded(tt.locale, w["reset"])
				b.requireAccessible(tt.name + " reset_password")
				shot("reset-password")

				b.fill(`//input[@id="password"]`, "short")
				require.EqualValues(t, http.StatusUnprocessableEntity, b.follow(`//button[contains(., "`+w["setPassword"]+`")]`))
				requireFieldError(t, b, "password", w["password"], w["passwordError"])
				require.Empty(t, eval[string](b, `document.getElementById("password").value`), "a password is never shown again")
				b.requireAccessible(tt.name + " reset_password with its error")
				shot("reset-password-error")

				b.fill(`//input[@id="password"]`, "a much longer password")
				require.EqualValues(t, http.StatusOK, b.follow(`//button[contains(., "`+w["setPassword"]+`")]`))
				b.requireBranded(tt.locale, w["changed"])
				b.requireAccessible(tt.name + " password_changed")
				shot("password-changed")
				b.requireLinksOn(loginURL, w["signIn"])
			})

			t.Run("Unsubscribe", func(t *testing.T) {
				b := b.in(t)
				welcome := "Welcome to Acme"
				if !english {
					welcome = "Bienvenue sur Acme"
				}
				openMail(welcome)
				// The welcome's button goes to the app's sign-in, not to APP_URL.
				require.Equal(t, loginURL, eval[string](b, `document.querySelector("pre a").href`))

				require.EqualValues(t, http.StatusOK, b.follow(textLink("/v1/unsubscribe?token=")))
				b.requireBranded(tt.locale, w["unsubscribe"])
				b.requireAccessible(tt.name + " unsubscribe")
				shot("unsubscribe")

				require.EqualValues(t, http.StatusOK, b.follow(`//button[contains(., "`+w["unsubscribeButton"]+`")]`))
				b.requireBranded(tt.locale, w["unsubscribed"])
				b.requireAccessible(tt.name + " unsubscribed")
				shot("unsubscribed")
				b.requireLinksOn(loginURL, w["goTo"])
			})

			t.Run("Mail", func(t *testing.T) {
				b := b.in(t)
				// Each mail as it is sent, rendered by the server's own configuration.
				cfg, err := loadMailConfig(envFunc(env))
				require.NoError(t, err)
				for _, kind := range mail.Kinds() {
					rendered, err := cfg.Renderer.RenderSample(kind, tt.locale)
					require.NoError(t, err)
					require.Contains(t, rendered.HTML, `src="`+logoURL+`"`)
					page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
						w.Header().Set("Content-Type", "text/html; charset=utf-8")
						_, _ = w.Write([]byte(rendered.HTML))
					}))
					t.Cleanup(page.Close)
					require.EqualValues(t, http.StatusOK, b.open(page.URL))
					require.Equal(t, rendered.Subject, eval[string](b, `document.title`))
					b.requireAccessible(tt.name + " mail " + string(kind))
				}
			})

			t.Logf("axe-core, %s:\n%s", tt.name, strings.Join(*b.checked, "\n"))
			require.Len(t, *b.checked, 15, "every page and mail checked")
		})
	}
}

// requireFieldError checks a form shown again: the field's label, its error beside it, and the
// field marked invalid, described by the error (as assistive technology reads it) and focused
// when the page opens.
func requireFieldError(t *testing.T, b *browser, id, label, message string) {
	t.Helper()
	field := eval[map[string]string](b, `(() => {
		const input = document.getElementById("`+id+`");
		const described = (input.getAttribute("aria-describedby") || "").split(" ").map(id => document.getElementById(id).textContent.trim());
		return {label: input.labels[0].textContent.trim(), invalid: input.getAttribute("aria-invalid"), error: described[described.length - 1], autofocus: String(input.autofocus)};
	})()`)
	require.Equal(t, map[string]string{"label": label, "invalid": "true", "error": message, "autofocus": "true"}, field)
	require.Contains(t, b.text(), message)
}
