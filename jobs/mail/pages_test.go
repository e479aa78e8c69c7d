package mail

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// examplesMail is README's worked example of MAIL_TEMPLATES_DIR: a French welcome and French
// pages; everything else falls back to the built-in English.
const examplesMail = "../../examples/mail"

// goldenPageName is the golden file of a page's i-th sample: pages/verify_email.html for the
// first, pages/reset_password.2.html for the second.
func goldenPageName(page Page, i int) string {
	if i == 0 {
		return "pages/" + string(page) + ".html"
	}
	return fmt.Sprintf("pages/%s.%d.html", page, i+1)
}

// stylePattern finds a page's <style> elements, for checking their hashes.
var stylePattern = regexp.MustCompile(`(?s)<style>(.*?)</style>`)

func TestRenderer_RenderPage(t *testing.T) {
	t.Parallel()

	renderer, err := NewRenderer(&RendererConfig{AppName: "Acme", AppURL: testAppURL, LoginURL: "https://acme.example/login"})
	require.NoError(t, err)

	for _, page := range Pages() {
		t.Run(string(page), func(t *testing.T) {
			t.Parallel()

			for i, data := range samplePageData(page) {
				got, err := renderer.RenderPage(page, "", data)
				require.NoError(t, err)
				require.Equal(t, "en", got.Locale)
				requireGolden(t, goldenPageName(page, i), got.HTML)

				// Every page: its language, its title and one heading, both naming the product.
				require.Contains(t, got.HTML, `<html lang="en">`)
				require.Contains(t, got.HTML, "<title>"+got.Title+" · Acme</title>")
				require.Equal(t, 1, strings.Count(got.HTML, "<h1>"), "one heading")
				require.Contains(t, got.HTML, `<h1><span class="brand">Acme</span> `+got.Title+`</h1>`)
				// No page is a dead end: each links to APP_LOGIN_URL.
				require.Contains(t, got.HTML, `href="https://acme.example/login"`)

				again, err := renderer.RenderPage(page, "", data)
				require.NoError(t, err)
				require.Equal(t, got, again, "rendering is deterministic")
			}
		})
	}

	t.Run("FormShownAgain", func(t *testing.T) {
		t.Parallel()

		got, err := renderer.RenderPage(PageResetPassword, "", &PageData{
			Token: "dG9rZW4", MinPassword: 8, MaxPassword: 256,
			Errors: FieldErrors{Password: "Password must be at least 8 characters long."},
		})
		require.NoError(t, err)
		require.Contains(t, got.HTML, `<p class="field-error" id="password-error">Password must be at least 8 characters long.</p>`)
		require.Contains(t, got.HTML, `aria-describedby="password-hint password-error" aria-invalid="true"`)
		require.Contains(t, got.HTML, `<label for="password">New password</label>`)

		got, err = renderer.RenderPage(PageForgotPassword, "", &PageData{
			Email:  `ada@"example`,
			Errors: FieldErrors{Email: "Email must be one plain address, like name@example.com."},
		})
		require.NoError(t, err)
		require.Contains(t, got.HTML, `value="ada@&#34;example" aria-invalid="true" aria-describedby="email-error"`, "the input kept, escaped")
	})

	t.Run("ErrorPages", func(t *testing.T) {
		t.Parallel()

		for _, tt := range []struct {
			data      *PageData
			title     string
			contains  string
			forgotURL bool
		}{
			{&PageData{Status: 400, Detail: "The link is invalid.", Flow: PageResetPassword}, "This link or form does not work", "The link is invalid.", true},
			{&PageData{Status: 400, Detail: "The link is invalid.", Flow: PageVerifyEmail}, "This link or form does not work", "Sign in to ask for a new verification email.", false},
			{&PageData{Status: 429, RetryAfter: 9 * time.Minute}, "Too many attempts", "Please wait 9 minutes, then try again.", false},
			{&PageData{Status: 503, Detail: "detail not shown"}, "Something went wrong on our side", "Please try again in a moment.", false},
			{&PageData{Status: 415, Detail: "The body must be a form."}, "This did not work", "The body must be a form.", false},
		} {
			got, err := renderer.RenderPage(PageError, "", tt.data)
			require.NoError(t, err)
			require.Equal(t, tt.title, got.Title)
			require.Contains(t, got.HTML, tt.contains)
			require.Equal(t, tt.forgotURL, strings.Contains(got.HTML, `href="http://localhost:8080/v1/auth/forgot-password"`), tt.title)
			require.NotContains(t, got.HTML, "detail not shown")
		}
	})

	t.Run("CSPAllowsItsOwnStylesOnly", func(t *testing.T) {
		t.Parallel()

		got, err := renderer.RenderPage(PageVerifyEmail, "", &PageData{Token: "dG9rZW4"})
		require.NoError(t, err)
		styles := stylePattern.FindAllStringSubmatch(got.HTML, -1)
		require.Len(t, styles, 1)
		sum := sha256.Sum256([]byte(styles[0][1]))
		require.Equal(t, "default-src 'none'; style-src 'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+
			"'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'", got.CSP)
		require.NotContains(t, got.CSP, "unsafe-inline")
	})

	t.Run("EscapesData", func(t *testing.T) {
		t.Parallel()

		renderer, err := NewRenderer(&RendererConfig{AppName: "Acme & <Co>", AppURL: testAppURL})
		require.NoError(t, err)
		got, err := renderer.RenderPage(PageUnsubscribe, "", &PageData{Token: `1.a"b&c=<x>`})
		require.NoError(t, err)
		require.Contains(t, got.HTML, "<title>Unsubscribe · Acme &amp; &lt;Co&gt;</title>")
		require.Contains(t, got.HTML, `action="unsubscribe?token=1.a%22b%26c%3d%3cx%3e"`)
		require.NotContains(t, got.HTML, "<x>")
	})

	t.Run("UnknownPage", func(t *testing.T) {
		t.Parallel()

		_, err := renderer.RenderPage("welcome", "", nil)
		require.ErrorContains(t, err, `unknown page "welcome"`)
	})
}

// TestRenderer_Brand: APP_BRAND_COLOR and APP_LOGO_URL reach the built-in pages and mail: the
// buttons' colour and their text's, the links', and the logo with APP_NAME as its text.
func TestRenderer_Brand(t *testing.T) {
	t.Parallel()

	renderer, err := NewRenderer(&RendererConfig{
		AppName: "Acme", AppURL: testAppURL,
		BrandColor: "#0F766E", LogoURL: "https://cdn.acme.example:8443/brand/logo.png?v=2",
	})
	require.NoError(t, err)
	require.Equal(t, "https://cdn.acme.example:8443/brand/logo.png?v=2", renderer.LogoURL())

	page, err := renderer.RenderPageSample(PageResetPassword, "")
	require.NoError(t, err)
	require.Contains(t, page.HTML, "a { color: #0f766e; }")
	require.Contains(t, page.HTML, "color: #ffffff; background: #0f766e;")
	require.Contains(t, page.HTML, `<h1><img class="logo" src="https://cdn.acme.example:8443/brand/logo.png?v=2" alt="Acme"> Choose a new password</h1>`)
	require.Contains(t, page.CSP, "; img-src https://cdn.acme.example:8443;")

	for _, kind := range Kinds() {
		got, err := renderer.RenderSample(kind, "")
		require.NoError(t, err)
		require.Contains(t, got.HTML, `<img src="https://cdn.acme.example:8443/brand/logo.png?v=2" alt="Acme" height="40"`, kind)
		require.Contains(t, got.HTML, "background-color:#0f766e;", kind)
		require.Contains(t, got.HTML, "color:#ffffff;text-decoration:none;", kind)
		require.Contains(t, got.HTML, `style="color:#0f766e;word-break:break-all;"`, kind)
		require.NotContains(t, got.HTML, DefaultBrandColor, kind)
	}

	t.Run("DefaultsWithoutLogo", func(t *testing.T) {
		t.Parallel()

		renderer, err := NewRenderer(&RendererConfig{AppURL: testAppURL})
		require.NoError(t, err)
		page, err := renderer.RenderPageSample(PageEmailVerified, "")
		require.NoError(t, err)
		require.Contains(t, page.HTML, "background: "+DefaultBrandColor)
		require.NotContains(t, page.HTML, "<img")
		require.NotContains(t, page.CSP, "img-src")
		require.Contains(t, page.HTML, `href="http://localhost:8080"`, "APP_LOGIN_URL defaults to APP_URL")
	})

	t.Run("WelcomeButtonGoesToLogin", func(t *testing.T) {
		t.Parallel()

		renderer, err := NewRenderer(&RendererConfig{AppURL: testAppURL, LoginURL: "https://acme.example/login"})
		require.NoError(t, err)
		got, err := renderer.RenderSample(KindWelcome, "")
		require.NoError(t, err)
		require.Contains(t, got.Text, "Get started: https://acme.example/login")
	})

	t.Run("Refuses", func(t *testing.T) {
		t.Parallel()

		for _, tt := range []struct {
			config *RendererConfig
			want   string
		}{
			{&RendererConfig{AppURL: testAppURL, BrandColor: "blue"}, `"blue" is not a colour of the form #rrggbb`},
			{&RendererConfig{AppURL: testAppURL, BrandColor: "#fde047"}, "gives links a contrast of 1.31:1 on white"},
			{&RendererConfig{AppURL: testAppURL, LogoURL: "javascript:alert(1)"}, "is not an absolute http or https URL"},
			{&RendererConfig{AppURL: testAppURL, LoginURL: "/login"}, "is not an absolute http or https URL"},
		} {
			_, err := NewRenderer(tt.config)
			require.ErrorContains(t, err, tt.want)
		}
	})
}

func TestCheckBrandColor(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		color string
		want  string // "" for accepted
	}{
		{"#2563eb", ""},
		{"#2563EB", ""},
		{"#000000", ""},
		{"#767676", ""}, // the lightest grey that reaches 4.5:1 on white (4.54:1)
		{"#777777", "gives links a contrast of 4.47:1 on white, under the 4.5:1 that WCAG AA asks of text; a darker shade such as #757575 reaches it"},
		{"#ffffff", "gives links a contrast of 1.00:1 on white"},
		{"#fde047", "gives links a contrast of 1.31:1 on white, under the 4.5:1 that WCAG AA asks of text; a darker shade such as #867625 reaches it"},
		{"2563eb", "is not a colour of the form #rrggbb"},
		{"#25e", "is not a colour of the form #rrggbb"},
		{"#2563eg", "is not a colour of the form #rrggbb"},
		{"#2563eb;}", "is not a colour of the form #rrggbb"},
		{"", "is not a colour of the form #rrggbb"},
	} {
		err := CheckBrandColor(tt.color)
		if tt.want == "" {
			require.NoError(t, err, tt.color)
			continue
		}
		require.ErrorContains(t, err, tt.want, tt.color)
		if suggestion := regexp.MustCompile(`such as (#[0-9a-f]{6})`).FindStringSubmatch(err.Error()); suggestion != nil {
			require.NoError(t, CheckBrandColor(suggestion[1]), "the suggested shade passes")
		}
	}
}

// TestTextColorOn: a button's text is white or black, whichever contrasts more with the brand
// colour, so it reaches WCAG AA (4.5:1) on any colour.
func TestTextColorOn(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct{ bg, want string }{
		{"#2563eb", "#ffffff"},
		{"#000000", "#ffffff"},
		{"#ffffff", "#000000"},
		{"#fde047", "#000000"},
		{"#767676", "#000000"}, // 4.54:1 with white, 4.62:1 with black
		{"#0f766e", "#ffffff"},
		{"#d9480f", "#000000"}, // an orange: 3.9:1 with white, 5.4:1 with black
	} {
		bg, ok := parseHexColor(tt.bg)
		require.True(t, ok)
		text := textColorOn(bg)
		require.Equal(t, tt.want, text.String(), tt.bg)
		require.GreaterOrEqual(t, contrast(text, bg), MinTextContrast, tt.bg)
	}
	// Every grey, the worst case of the two candidates included: never under √21.
	for v := range 256 {
		bg := rgb{uint8(v), uint8(v), uint8(v)}
		require.GreaterOrEqual(t, contrast(textColorOn(bg), bg), 4.58, bg.String())
	}
}

func TestCheckLogoURL(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct{ url, want string }{
		{"https://cdn.acme.example/logo.svg", ""},
		{"http://127.0.0.1:8081/logo.png", ""},
		{"https://xn--bcher-kva.example/logo.png", ""},
		{"/logo.png", "is not an absolute http or https URL"},
		{"data:image/png;base64,AAAA", "is not an absolute http or https URL"},
		{"ftp://acme.example/logo.png", "is not an absolute http or https URL"},
		{"https://user:pass@acme.example/logo.png", "carries credentials"},
		{"https://[::1]/logo.png", "the host must be an ASCII domain name or an IPv4 address"},
		{"https://bücher.example/logo.png", "the host must be an ASCII domain name or an IPv4 address"},
		{"https://acme.example/" + strings.Repeat("a", maxLogoURLLen), "at most 2048"},
	} {
		err := CheckLogoURL(tt.url)
		if tt.want == "" {
			require.NoError(t, err, tt.url)
			continue
		}
		require.ErrorContains(t, err, tt.want, tt.url)
	}
}

func TestNewRenderer_PageTemplates(t *testing.T) {
	t.Parallel()

	t.Run("ExamplesMail", func(t *testing.T) {
		t.Parallel()

		renderer, err := NewRenderer(&RendererConfig{AppName: "Acme", AppURL: testAppURL, TemplatesDir: examplesMail})
		require.NoError(t, err)
		require.Equal(t, []string{"en", "fr"}, renderer.Locales())
		require.Empty(t, renderer.Warnings())

		french := map[Page]string{
			PageVerifyEmail:     "Confirmez votre adresse e-mail",
			PageEmailVerified:   "Adresse e-mail confirmée",
			PageForgotPassword:  "Réinitialiser votre mot de passe",
			PageResetLinkSent:   "Consultez vos e-mails",
			PageResetPassword:   "Choisissez un nouveau mot de passe",
			PagePasswordChanged: "Mot de passe modifié",
			PageUnsubscribe:     "Se désabonner",
			PageUnsubscribed:    "Vous êtes désabonné",
			PageError:           "Ce lien ne fonctionne pas",
			PageStart:           "Par où commencer",
		}
		require.Len(t, french, len(Pages()), "the example covers every page")
		for page, title := range french {
			for i, data := range samplePageData(page) {
				got, err := renderer.RenderPage(page, "fr-CA", data)
				require.NoError(t, err)
				require.Equal(t, "fr", got.Locale)
				require.Contains(t, got.HTML, `<html lang="fr">`)
				if i == 0 {
					require.Equal(t, title, got.Title, page)
				}
				// The French page sits in the built-in layout: branded alike.
				require.Contains(t, got.HTML, "<title>"+got.Title+" · Acme</title>")
				require.Contains(t, got.HTML, "a { color: "+DefaultBrandColor+"; }")

				english, err := renderer.RenderPage(page, "de", data)
				require.NoError(t, err)
				require.Equal(t, "en", english.Locale, "no German: the default locale's")
			}
		}

		got, err := renderer.RenderPage(PageResetPassword, "fr", &PageData{Token: "dG9rZW4", MinPassword: 8, MaxPassword: 256, Errors: FieldErrors{Password: "Password must be at least 8 characters long."}})
		require.NoError(t, err)
		require.Contains(t, got.HTML, "Ce mot de passe ne convient pas : il doit compter de 8 à 256 caractères.")
		require.NotContains(t, got.HTML, "Password must be")
	})

	t.Run("FallsBackFileByFilePerLocale", func(t *testing.T) {
		t.Parallel()

		renderer, err := newTestRenderer(t, map[string]string{
			"page_layout.pt.html":          `{{define "layout"}}<html lang="{{.Locale}}"><title>{{.Title}}</title><h1>PT {{.Title}}</h1>{{template "content" .}}</html>{{end}}`,
			"page_verify_email.pt-BR.html": `{{define "title"}}Confirme seu e-mail{{end}}{{define "content"}}<form><input type="hidden" name="token" value="{{.Token}}"></form>{{end}}`,
			"page_error.html":              `{{define "title"}}Oops {{.Status}}{{end}}{{define "content"}}<a href="{{.LoginURL}}">{{.Detail}}</a>{{end}}`,
		})
		require.NoError(t, err)
		require.Equal(t, []string{"en", "pt", "pt-BR"}, renderer.Locales())

		// pt-BR: its own page, in pt's layout (no pt-BR layout).
		got, err := renderer.RenderPage(PageVerifyEmail, "pt-BR", &PageData{Token: "dG9rZW4"})
		require.NoError(t, err)
		require.Equal(t, "pt-BR", got.Locale)
		require.Equal(t, `<html lang="pt-BR"><title>Confirme seu e-mail</title><h1>PT Confirme seu e-mail</h1><form><input type="hidden" name="token" value="dG9rZW4"></form></html>`, got.HTML)
		require.Equal(t, "default-src 'none'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'", got.CSP, "no <style>, no style-src")

		// pt: the built-in page in pt's layout.
		got, err = renderer.RenderPage(PageVerifyEmail, "pt-PT", &PageData{Token: "dG9rZW4"})
		require.NoError(t, err)
		require.Equal(t, "pt", got.Locale)
		require.Contains(t, got.HTML, "<h1>PT Confirm your email address</h1>")

		// en: built-in throughout, but the error page without a locale is the default locale's.
		builtin, err := newTestRenderer(t, nil)
		require.NoError(t, err)
		got, err = renderer.RenderPage(PageVerifyEmail, "en", &PageData{Token: "dG9rZW4"})
		require.NoError(t, err)
		want, err := builtin.RenderPage(PageVerifyEmail, "en", &PageData{Token: "dG9rZW4"})
		require.NoError(t, err)
		require.Equal(t, want, got)
		got, err = renderer.RenderPage(PageError, "en", &PageData{Status: 400, Detail: "Bad link."})
		require.NoError(t, err)
		require.Equal(t, "Oops 400", got.Title)
		require.Contains(t, got.HTML, `<a href="http://localhost:8080">Bad link.</a>`)
		require.Contains(t, got.HTML, "<title>Oops 400 · Acme</title>", "in the built-in layout")

		// The mail of pt users is untouched: the pages' files are not the mail's.
		mail, err := renderer.RenderSample(KindWelcome, "pt")
		require.NoError(t, err)
		wantMail, err := builtin.RenderSample(KindWelcome, "en")
		require.NoError(t, err)
		require.Equal(t, wantMail.HTML, strings.Replace(mail.HTML, `lang="pt"`, `lang="en"`, 1))
	})

	t.Run("OwnStylesHashed", func(t *testing.T) {
		t.Parallel()

		renderer, err := newTestRenderer(t, map[string]string{
			"page_email_verified.html": `{{define "title"}}Done{{end}}{{define "content"}}<style>.x { color: {{.BrandColor}}; }</style><p class="x">Done.</p>{{end}}`,
		})
		require.NoError(t, err)
		got, err := renderer.RenderPageSample(PageEmailVerified, "")
		require.NoError(t, err)
		styles := stylePattern.FindAllStringSubmatch(got.HTML, -1)
		require.Len(t, styles, 2, "the layout's and the page's")
		for _, style := range styles {
			sum := sha256.Sum256([]byte(style[1]))
			require.Contains(t, got.CSP, "'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'")
		}
	})
}

func TestRenderer_MatchAcceptLanguage(t *testing.T) {
	t.Parallel()

	renderer, err := NewRenderer(&RendererConfig{AppURL: testAppURL, TemplatesDir: writeTemplates(t, map[string]string{
		"page_error.fr.html":    `{{define "title"}}Erreur{{end}}{{define "content"}}x{{end}}`,
		"page_error.pt-BR.html": `{{define "title"}}Erro{{end}}{{define "content"}}x{{end}}`,
	})})
	require.NoError(t, err)
	require.Equal(t, []string{"en", "fr", "pt-BR"}, renderer.Locales())

	for _, tt := range []struct{ header, want string }{
		{"", "en"},
		{"fr", "fr"},
		{"fr-CH, fr;q=0.9, en;q=0.8", "fr"},
		{"de-DE, fr;q=0.5", "fr"}, // no German: the next language the browser accepts
		{"de-DE, en;q=0.5, fr;q=0.4", "en"},
		{"en-GB,en;q=0.9", "en"},
		{"pt-PT", "pt-BR"},
		{"de", "en"},
		{"*", "en"},
		{"fr;q=nope", "en"},
		{strings.Repeat("fr,", 400), "en"},
	} {
		require.Equal(t, tt.want, renderer.MatchAcceptLanguage(tt.header), "MatchAcceptLanguage(%q)", tt.header)
	}
}

func TestRenderer_RenderPageSample(t *testing.T) {
	t.Parallel()

	renderer, err := newTestRenderer(t, map[string]string{"page_error.fr.html": `{{define "title"}}Erreur {{.Status}}{{end}}{{define "content"}}{{.Detail}}{{end}}`})
	require.NoError(t, err)
	for _, locale := range renderer.Locales() {
		for _, page := range Pages() {
			got, err := renderer.RenderPageSample(page, locale)
			require.NoError(t, err)
			require.Equal(t, locale, got.Locale)
			require.NotEmpty(t, got.Title)
		}
	}
	got, err := renderer.RenderPageSample(PageError, "fr")
	require.NoError(t, err)
	require.Equal(t, "Erreur 400", got.Title)
}
