package mail

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ from the current templates")

// requireGolden compares got with testdata/name, or rewrites the file under
// -update.
func requireGolden(t *testing.T, name, got string) {
	t.Helper()

	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o600))
		return
	}

	want, err := os.ReadFile(path)
	require.NoError(t, err, "missing golden file; run go test ./jobs/mail -run TestRenderer_Render -update")
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Fatalf("%s differs from the golden file (-want +got; run with -update to accept):\n%s", path, diff)
	}
}

const testAppURL = "http://localhost:8080"

// newTestRenderer is a Renderer of APP_NAME Acme on testAppURL, with the templates directory
// holding files (name → text), or none when files is nil.
func newTestRenderer(t *testing.T, files map[string]string) (*Renderer, error) {
	t.Helper()

	config := &RendererConfig{AppName: "Acme", AppURL: testAppURL}
	if files != nil {
		config.TemplatesDir = writeTemplates(t, files)
	}
	return NewRenderer(config)
}

// writeTemplates writes files (name → text) into a new directory and returns it.
func writeTemplates(t *testing.T, files map[string]string) string {
	t.Helper()

	dir := t.TempDir()
	for name, text := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600))
	}
	return dir
}

// frenchWelcome is a French welcome mail, HTML and text, inside the built-in layouts.
var frenchWelcome = map[string]string{ //nolint:gochecknoglobals // test data
	"welcome.fr.html": `{{define "action_label"}}Commencer{{end}}
{{define "content"}}<p>Bienvenue sur {{.AppName}} ! Votre compte est prêt.</p>{{template "button" .}}{{end}}
{{define "footer"}}Vous recevez ce message car vous vous êtes inscrit sur {{.AppName}}. <a href="{{.UnsubscribeURL}}">Se désabonner</a>{{end}}`,
	"welcome.fr.txt": `{{define "subject"}}Bienvenue sur {{.AppName}}{{end}}
{{define "content"}}Bienvenue sur {{.AppName}} ! Votre compte est prêt : {{.ActionURL}}{{end}}
{{define "footer"}}Se désabonner : {{.UnsubscribeURL}}{{end}}`,
}

func TestRenderer_Render(t *testing.T) {
	t.Parallel()

	renderer, err := newTestRenderer(t, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"en"}, renderer.Locales())

	for _, tt := range []struct {
		name        string
		kind        Kind
		data        *Data
		wantSubject string
	}{
		{
			name: "PasswordReset",
			kind: KindPasswordReset,
			data: &Data{
				Name:      "Ada Lovelace",
				ActionURL: "http://localhost:8080/v1/auth/reset-password?token=cmVzZXQtdG9rZW4",
				ExpiresIn: time.Hour,
			},
			wantSubject: "Reset your Acme password",
		},
		{
			name: "Verification",
			kind: KindVerification,
			data: &Data{
				Name:      "Ada Lovelace",
				ActionURL: "http://localhost:8080/v1/auth/verify-email?token=dmVyaWZ5LXRva2Vu",
				ExpiresIn: 24 * time.Hour,
			},
			wantSubject: "Verify your email address for Acme",
		},
		{
			name: "Welcome",
			kind: KindWelcome,
			data: &Data{
				Name:           "Ada Lovelace",
				ActionURL:      "http://localhost:8080",
				UnsubscribeURL: "http://localhost:8080/v1/unsubscribe?token=dW5zdWJzY3JpYmU",
			},
			wantSubject: "Welcome to Acme",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			got, err := renderer.Render(tt.kind, "", tt.data)
			require.NoError(t, err)

			require.Equal(t, "en", got.Locale)
			require.Equal(t, tt.wantSubject, got.Subject)
			requireGolden(t, string(tt.kind)+".html", got.HTML)
			requireGolden(t, string(tt.kind)+".txt", got.Text)
			// APP_NAME is in the greeting's sign-off and in the footer of both parts.
			for _, part := range []string{got.HTML, got.Text} {
				require.Contains(t, part, "— The Acme team")
				require.Contains(t, part, "Acme · ")
				require.NotContains(t, part, DefaultAppName)
			}

			again, err := renderer.Render(tt.kind, "", tt.data)
			require.NoError(t, err)
			require.Equal(t, got, again, "rendering is deterministic")
		})
	}

	t.Run("DefaultAppName", func(t *testing.T) {
		t.Parallel()

		renderer, err := NewRenderer(&RendererConfig{AppURL: testAppURL})
		require.NoError(t, err)
		got, err := renderer.Render(KindWelcome, "", &Data{ActionURL: testAppURL, UnsubscribeURL: testAppURL + "/u"})
		require.NoError(t, err)
		require.Equal(t, "Welcome to postguard", got.Subject)
	})

	t.Run("EscapesUserData", func(t *testing.T) {
		t.Parallel()

		renderer, err := NewRenderer(&RendererConfig{AppName: "Acme & <Co>", AppURL: testAppURL})
		require.NoError(t, err)
		got, err := renderer.Render(KindWelcome, "", &Data{
			ActionURL:      testAppURL,
			Name:           "<script>alert(1)</script>",
			UnsubscribeURL: `javascript:alert(1)`,
		})
		require.NoError(t, err)

		require.NotContains(t, got.HTML, "<script>")
		require.Contains(t, got.HTML, "Hi &lt;script&gt;alert(1)&lt;/script&gt;,")
		require.Contains(t, got.HTML, "Acme &amp; &lt;Co&gt;")
		require.NotContains(t, got.HTML, "javascript:", "an unsafe URL is neutralised in href")
		require.Contains(t, got.HTML, `href="#ZgotmplZ"`)

		// Plain text is not HTML: it shows the name as typed.
		require.Contains(t, got.Text, "Hi <script>alert(1)</script>,")
		require.Equal(t, "Welcome to Acme & <Co>", got.Subject)
	})

	t.Run("EscapesQueryInHref", func(t *testing.T) {
		t.Parallel()

		got, err := renderer.Render(KindWelcome, "", &Data{
			ActionURL:      testAppURL,
			UnsubscribeURL: `http://localhost:8080/v1/unsubscribe?token=a"b&c=1`,
		})
		require.NoError(t, err)
		require.Contains(t, got.HTML, `href="http://localhost:8080/v1/unsubscribe?token=a%22b&amp;c=1"`)
		require.Contains(t, got.Text, `Unsubscribe: http://localhost:8080/v1/unsubscribe?token=a"b&c=1`)
	})

	t.Run("GreetsThereWithoutName", func(t *testing.T) {
		t.Parallel()

		got, err := renderer.Render(KindWelcome, "", &Data{ActionURL: "http://a", Name: "  ", UnsubscribeURL: "http://a/u"})
		require.NoError(t, err)
		require.Contains(t, got.HTML, "Hi there,")
		require.Contains(t, got.Text, "Hi there,\n")
	})

	t.Run("ExpiresIn", func(t *testing.T) {
		t.Parallel()

		got, err := renderer.Render(KindVerification, "", &Data{ActionURL: "http://a/v", ExpiresIn: 48 * time.Hour})
		require.NoError(t, err)
		require.Contains(t, got.HTML, "This link expires in 2 days.")
		require.Contains(t, got.Text, "This link expires in 2 days.")
	})

	t.Run("RequiresURLs", func(t *testing.T) {
		t.Parallel()

		_, err := renderer.Render(KindWelcome, "", &Data{ActionURL: "http://a"})
		require.ErrorContains(t, err, "UnsubscribeURL")
		_, err = renderer.Render(KindVerification, "", &Data{Name: "Ada"})
		require.ErrorContains(t, err, "ActionURL")
		_, err = renderer.Render(KindPasswordReset, "", nil)
		require.Error(t, err)
		_, err = renderer.Render("newsletter", "", &Data{ActionURL: "http://a"})
		require.ErrorContains(t, err, `unknown kind "newsletter"`)
	})
}

func TestNewRenderer_TemplatesDir(t *testing.T) {
	t.Parallel()

	builtin, err := newTestRenderer(t, nil)
	require.NoError(t, err)
	welcomeData := &Data{Name: "Ada", ActionURL: testAppURL, UnsubscribeURL: testAppURL + "/v1/unsubscribe?token=1.abc"}
	verificationData := &Data{Name: "Ada", ActionURL: testAppURL + "/v1/auth/verify-email?token=abc", ExpiresIn: 24 * time.Hour}

	t.Run("OverrideReplacesOneFileFallsBackForRest", func(t *testing.T) {
		t.Parallel()

		renderer, err := newTestRenderer(t, map[string]string{
			"welcome.html": `{{define "action_label"}}Open {{.AppName}}{{end}}
{{define "content"}}<p>Our own welcome to {{.AppName}}.</p>{{template "button" .}}{{end}}
{{define "footer"}}<a href="{{.UnsubscribeURL}}">Unsubscribe</a>{{end}}`,
		})
		require.NoError(t, err)
		require.Equal(t, []string{"en"}, renderer.Locales())

		got, err := renderer.Render(KindWelcome, "", welcomeData)
		require.NoError(t, err)
		want, err := builtin.Render(KindWelcome, "", welcomeData)
		require.NoError(t, err)

		// The HTML is the override's, inside the built-in layout.
		require.Contains(t, got.HTML, "<p>Our own welcome to Acme.</p>")
		require.Contains(t, got.HTML, ">Open Acme</a>")
		require.Contains(t, got.HTML, "Hi Ada,")
		require.Contains(t, got.HTML, "— The Acme team")
		require.NotContains(t, got.HTML, "Your account is ready.")
		// The subject and text, which it does not replace, are the built-in ones.
		require.Equal(t, want.Subject, got.Subject)
		require.Equal(t, want.Text, got.Text)

		// The other kinds are untouched.
		gotVerification, err := renderer.Render(KindVerification, "", verificationData)
		require.NoError(t, err)
		wantVerification, err := builtin.Render(KindVerification, "", verificationData)
		require.NoError(t, err)
		require.Equal(t, wantVerification, gotVerification)
	})

	t.Run("LayoutOverride", func(t *testing.T) {
		t.Parallel()

		renderer, err := newTestRenderer(t, map[string]string{
			"layout.txt": `{{define "layout"}}[{{.AppName}}] {{.Subject}}
{{template "content" .}}
{{template "footer" .}}{{end}}`,
		})
		require.NoError(t, err)
		got, err := renderer.Render(KindVerification, "", verificationData)
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(got.Text, "[Acme] Verify your email address for Acme\nPlease confirm"), got.Text)
		want, err := builtin.Render(KindVerification, "", verificationData)
		require.NoError(t, err)
		require.Equal(t, want.HTML, got.HTML)
	})

	t.Run("FrenchTemplates", func(t *testing.T) {
		t.Parallel()

		renderer, err := newTestRenderer(t, frenchWelcome)
		require.NoError(t, err)
		require.Equal(t, []string{"en", "fr"}, renderer.Locales())
		require.Empty(t, renderer.Warnings())

		got, err := renderer.Render(KindWelcome, "fr-CA", welcomeData)
		require.NoError(t, err)
		require.Equal(t, "fr", got.Locale)
		require.Equal(t, "Bienvenue sur Acme", got.Subject)
		require.Contains(t, got.HTML, `<html lang="fr">`)
		require.Contains(t, got.HTML, "Bienvenue sur Acme ! Votre compte est prêt.")
		require.Contains(t, got.Text, "Bienvenue sur Acme ! Votre compte est prêt : http://localhost:8080")

		// French users' other mail has no French file: it falls back to the built-in English.
		gotVerification, err := renderer.Render(KindVerification, "fr", verificationData)
		require.NoError(t, err)
		require.Equal(t, "fr", gotVerification.Locale)
		require.Equal(t, "Verify your email address for Acme", gotVerification.Subject)

		// Other users get the default locale's.
		english, err := renderer.Render(KindWelcome, "de-DE", welcomeData)
		require.NoError(t, err)
		require.Equal(t, "en", english.Locale)
		require.Equal(t, "Welcome to Acme", english.Subject)
	})

	t.Run("ParentLocaleFallback", func(t *testing.T) {
		t.Parallel()

		files := map[string]string{
			"layout.pt-BR.txt": `{{define "layout"}}Olá (Brasil)
{{template "content" .}}
{{template "footer" .}}{{end}}`,
			"welcome.pt.txt": `{{define "subject"}}Bem-vindo ao {{.AppName}}{{end}}
{{define "content"}}Sua conta está pronta.{{end}}
{{define "footer"}}{{.UnsubscribeURL}}{{end}}`,
		}
		renderer, err := newTestRenderer(t, files)
		require.NoError(t, err)
		require.Equal(t, []string{"en", "pt", "pt-BR"}, renderer.Locales())

		brazil, err := renderer.Render(KindWelcome, "pt-BR", welcomeData)
		require.NoError(t, err)
		require.Equal(t, "pt-BR", brazil.Locale)
		require.Equal(t, "Bem-vindo ao Acme", brazil.Subject, "pt-BR has no welcome file: pt's")
		require.True(t, strings.HasPrefix(brazil.Text, "Olá (Brasil)\nSua conta está pronta."), brazil.Text)

		portugal, err := renderer.Render(KindWelcome, "pt-PT", welcomeData)
		require.NoError(t, err)
		require.Equal(t, "pt", portugal.Locale)
		require.True(t, strings.HasPrefix(portugal.Text, "Hi Ada,\n\nSua conta está pronta."), portugal.Text)

		require.Len(t, renderer.Warnings(), 2, "pt and pt-BR's welcome: text in Portuguese, HTML in English")
		require.Contains(t, renderer.Warnings()[0], "welcome.pt.txt")
	})

	t.Run("WarnsOfMixedLanguages", func(t *testing.T) {
		t.Parallel()

		dir := writeTemplates(t, map[string]string{"welcome.fr.html": frenchWelcome["welcome.fr.html"]})
		renderer, err := NewRenderer(&RendererConfig{AppURL: testAppURL, TemplatesDir: dir})
		require.NoError(t, err)
		require.Equal(t, []string{
			"locale fr: the welcome mail's HTML comes from " + filepath.Join(dir, "welcome.fr.html") +
				", its subject and text from built-in welcome.txt; add the other file for one language throughout",
		}, renderer.Warnings())
	})

	t.Run("DefaultLocale", func(t *testing.T) {
		t.Parallel()

		// Files without a locale are the default locale's.
		renderer, err := NewRenderer(&RendererConfig{
			AppURL:        testAppURL,
			DefaultLocale: "fr",
			TemplatesDir:  writeTemplates(t, map[string]string{"welcome.txt": frenchWelcome["welcome.fr.txt"]}),
		})
		require.NoError(t, err)
		require.Equal(t, []string{"fr"}, renderer.Locales())
		got, err := renderer.Render(KindWelcome, "en-US", welcomeData)
		require.NoError(t, err)
		require.Equal(t, "fr", got.Locale)
		require.Equal(t, "Bienvenue sur postguard", got.Subject)

		_, err = NewRenderer(&RendererConfig{AppURL: testAppURL, DefaultLocale: "not a locale"})
		require.ErrorContains(t, err, `"not a locale" is not a BCP 47 language tag`)
	})

	t.Run("IgnoresDotFiles", func(t *testing.T) {
		t.Parallel()

		renderer, err := newTestRenderer(t, map[string]string{".DS_Store": "\x00\x01", ".welcome.html.swp": "x"})
		require.NoError(t, err)
		require.Equal(t, []string{"en"}, renderer.Locales())
	})
}

// TestNewRenderer_Refuses: every mistake in a templates directory, in a mail's file or a page's,
// stops NewRenderer, and its error names the file (and the line, where there is one).
func TestNewRenderer_Refuses(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name  string
		files map[string]string
		// file is the name the error must carry, want a part of the error.
		file string
		want string
	}{
		{
			name:  "ParseError",
			files: map[string]string{"welcome.fr.html": `{{define "content"}}<p>Bonjour {{.Name</p>{{end}}`},
			file:  "welcome.fr.html",
			want:  "welcome.fr.html:1:",
		},
		{
			name:  "UnknownField",
			files: map[string]string{"welcome.txt": `{{define "subject"}}Hello {{.Nom}}{{end}}{{define "content"}}x{{end}}{{define "footer"}}x{{end}}`},
			file:  "welcome.txt",
			want:  "unknown field .Nom",
		},
		{
			name: "UnknownFieldInBranchNotTaken",
			files: map[string]string{"verification.html": `{{define "action_label"}}Go{{end}}
{{define "content"}}{{if false}}{{.ExpiresIn.Weeks}}{{end}}{{template "button" .}}{{end}}
{{define "footer"}}x{{end}}`},
			file: "verification.html",
			want: "verification.html:2:",
		},
		{
			name:  "FieldOfWrongValue",
			files: map[string]string{"password_reset.txt": `{{define "subject"}}Reset{{end}}{{define "content"}}{{.Name.Hours}}{{end}}{{define "footer"}}x{{end}}`},
			file:  "password_reset.txt",
			want:  "can't evaluate field Hours",
		},
		{
			name:  "MissingBlock",
			files: map[string]string{"welcome.fr.txt": `{{define "content"}}Bonjour{{end}}{{define "footer"}}x{{end}}`},
			file:  "welcome.fr.txt",
			want:  `no template "subject"`,
		},
		{
			// The built-in kinds' HTML calls the "button" the built-in layout defines.
			name:  "LayoutWithoutButton",
			files: map[string]string{"layout.html": `{{define "layout"}}{{template "content" .}}{{template "footer" .}}{{end}}`},
			file:  "layout.html",
			want:  `no such template "button"`,
		},
		{
			name:  "EmptySubject",
			files: map[string]string{"welcome.txt": `{{define "subject"}} {{end}}{{define "content"}}x{{end}}{{define "footer"}}x{{end}}`},
			file:  "welcome.txt",
			want:  "the subject block must render one line of text",
		},
		{
			name:  "MultiLineSubject",
			files: map[string]string{"welcome.txt": "{{define \"subject\"}}Hello\nBcc: x{{end}}{{define \"content\"}}x{{end}}{{define \"footer\"}}x{{end}}"},
			file:  "welcome.txt",
			want:  "the subject block must render one line of text",
		},
		{
			name:  "UnknownName",
			files: map[string]string{"welcom.html": "x"},
			file:  "welcom.html",
			want:  `"welcom" is not a template`,
		},
		{
			name:  "UnknownExtension",
			files: map[string]string{"welcome.htm": "x"},
			file:  "welcome.htm",
			want:  `"htm" is not a template extension`,
		},
		{
			name:  "BadLocale",
			files: map[string]string{"welcome.french.html": "x"},
			file:  "welcome.french.html",
			want:  `"french" is not a BCP 47 language tag`,
		},
		{
			name:  "OtherFile",
			files: map[string]string{"README.md": "x"},
			file:  "README.md",
			want:  "is not a template",
		},
		{
			name:  "PageParseError",
			files: map[string]string{"page_error.fr.html": "{{define \"title\"}}Erreur{{end}}\n{{define \"content\"}}<p>{{.Detail</p>{{end}}"},
			file:  "page_error.fr.html",
			want:  "page_error.fr.html:2:",
		},
		{
			name:  "PageUnknownField",
			files: map[string]string{"page_verify_email.html": "{{define \"title\"}}Confirm{{end}}\n{{define \"content\"}}<a href=\"{{.ActionURL}}\">x</a>{{end}}"},
			file:  "page_verify_email.html",
			want:  "page_verify_email.html:2:31: unknown field .ActionURL (templates see .AppName, .AppURL, .LoginURL",
		},
		{
			name:  "PageUnknownFieldInBranchNotTaken",
			files: map[string]string{"page_error.html": `{{define "title"}}x{{end}}{{define "content"}}{{if eq .Status 418}}{{.Errors.Name}}{{end}}{{end}}`},
			file:  "page_error.html",
			want:  "unknown field .Name",
		},
		{
			name:  "PagePageFieldInMail",
			files: map[string]string{"welcome.txt": `{{define "subject"}}Hi{{end}}{{define "content"}}{{.Token}}{{end}}{{define "footer"}}x{{end}}`},
			file:  "welcome.txt",
			want:  "unknown field .Token",
		},
		{
			name:  "PageMissingTitle",
			files: map[string]string{"page_unsubscribed.html": `{{define "content"}}Bye{{end}}`},
			file:  "page_unsubscribed.html",
			want:  `"title" is undefined`,
		},
		{
			name:  "PageEmptyTitle",
			files: map[string]string{"page_unsubscribed.html": `{{define "title"}} {{end}}{{define "content"}}Bye{{end}}`},
			file:  "page_unsubscribed.html",
			want:  "the title block must render some text",
		},
		{
			name:  "PageLayoutWithoutContent",
			files: map[string]string{"page_layout.html": `{{define "layout"}}{{.Title}}{{template "body" .}}{{end}}`},
			file:  "page_layout.html",
			want:  `no such template "body"`,
		},
		{
			name:  "PageTextPage",
			files: map[string]string{"page_error.txt": "x"},
			file:  "page_error.txt",
			want:  `"txt" is not a page template extension (pages are html only)`,
		},
		{
			name:  "PageUnknownPage",
			files: map[string]string{"page_verify.html": "x"},
			file:  "page_verify.html",
			want:  `"page_verify" is not a template (expected one of layout, welcome, verification, password_reset, page_layout, page_verify_email, page_email_verified, page_forgot_password, page_reset_link_sent, page_reset_password, page_password_changed, page_unsubscribe, page_unsubscribed, page_error, page_start)`,
		},
		{
			name:  "SameLocaleTwice",
			files: map[string]string{"welcome.fr-ca.txt": frenchWelcome["welcome.fr.txt"], "welcome.fr-CA.txt": frenchWelcome["welcome.fr.txt"]},
			file:  "welcome.fr-",
			want:  "names the same template as",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			dir := writeTemplates(t, tt.files)
			renderer, err := NewRenderer(&RendererConfig{AppURL: testAppURL, TemplatesDir: dir})
			require.Nil(t, renderer)
			require.Error(t, err)
			require.Contains(t, err.Error(), filepath.Join(dir, tt.file))
			require.Contains(t, err.Error(), tt.want)
		})
	}

	t.Run("SubDirectory", func(t *testing.T) {
		t.Parallel()

		dir := t.TempDir()
		require.NoError(t, os.Mkdir(filepath.Join(dir, "welcome.fr.html"), 0o700))
		_, err := NewRenderer(&RendererConfig{AppURL: testAppURL, TemplatesDir: dir})
		require.ErrorContains(t, err, filepath.Join(dir, "welcome.fr.html")+": is not a file")
	})

	t.Run("MissingDirectory", func(t *testing.T) {
		t.Parallel()

		dir := filepath.Join(t.TempDir(), "nowhere")
		_, err := NewRenderer(&RendererConfig{AppURL: testAppURL, TemplatesDir: dir})
		require.ErrorContains(t, err, dir)
	})

	t.Run("EveryErrorAtOnce", func(t *testing.T) {
		t.Parallel()

		dir := writeTemplates(t, map[string]string{
			"welcome.fr.html":   `{{.Name`,
			"verification.html": `{{define "content"}}{{.Bogus}}{{end}}`,
		})
		_, err := NewRenderer(&RendererConfig{AppURL: testAppURL, TemplatesDir: dir})
		require.ErrorContains(t, err, filepath.Join(dir, "welcome.fr.html"))
		require.ErrorContains(t, err, filepath.Join(dir, "verification.html"))
	})
}

func TestRenderer_Match(t *testing.T) {
	t.Parallel()

	renderer, err := NewRenderer(&RendererConfig{
		AppURL: testAppURL,
		TemplatesDir: writeTemplates(t, map[string]string{
			"welcome.fr.txt":    frenchWelcome["welcome.fr.txt"],
			"welcome.pt-BR.txt": frenchWelcome["welcome.fr.txt"],
		}),
	})
	require.NoError(t, err)
	require.Equal(t, []string{"en", "fr", "pt-BR"}, renderer.Locales())

	for _, tt := range []struct {
		preference, want string
	}{
		{"", "en"},
		{"fr", "fr"},
		{"fr-CA", "fr"},
		{"fr-ch", "fr"},
		{"en-GB", "en"},
		{"pt", "pt-BR"},
		{"pt-PT", "pt-BR"},
		{"pt-BR", "pt-BR"},
		{"de", "en"},
		{"zh-Hant-TW", "en"},
		{"und", "en"},
		{"not a locale", "en"},
	} {
		require.Equal(t, tt.want, renderer.Match(tt.preference), "Match(%q)", tt.preference)
	}
}

func TestRenderer_RenderSample(t *testing.T) {
	t.Parallel()

	renderer, err := newTestRenderer(t, frenchWelcome)
	require.NoError(t, err)
	for _, locale := range renderer.Locales() {
		for _, kind := range Kinds() {
			got, err := renderer.RenderSample(kind, locale)
			require.NoError(t, err)
			require.Equal(t, locale, got.Locale)
			require.Contains(t, got.Text, "Ada Lovelace")
			require.Contains(t, got.HTML, testAppURL)
		}
	}
}

func TestExpiry(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		in                   time.Duration
		want                 string
		days, hours, minutes int64
	}{
		{0, "", 0, 0, 0},
		{time.Minute, "1 minute", 0, 0, 1},
		{30 * time.Minute, "30 minutes", 0, 0, 30},
		{90 * time.Minute, "90 minutes", 0, 1, 90},
		{90*time.Minute + time.Second, "91 minutes", 0, 1, 91},
		{time.Hour, "1 hour", 0, 1, 60},
		{2 * time.Hour, "2 hours", 0, 2, 120},
		{24 * time.Hour, "24 hours", 1, 24, 1440},
		{36 * time.Hour, "36 hours", 1, 36, 2160},
		{72 * time.Hour, "3 days", 3, 72, 4320},
	} {
		e := Expiry(tt.in)
		require.Equal(t, tt.want, e.String(), "Expiry(%s)", tt.in)
		require.Equal(t, tt.days, e.Days(), "Expiry(%s).Days", tt.in)
		require.Equal(t, tt.hours, e.Hours(), "Expiry(%s).Hours", tt.in)
		require.Equal(t, tt.minutes, e.Minutes(), "Expiry(%s).Minutes", tt.in)
	}
}
