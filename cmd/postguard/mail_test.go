package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/cmd/internal/service"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/jobs/mail/resendfake"
)

// frenchMailTemplates is the MAIL_TEMPLATES_DIR of README's worked example, examples/mail: one
// French mail, the welcome (text and HTML), and French pages; the rest falls back to the
// built-in English.
const frenchMailTemplates = "../../examples/mail"

// writeMailTemplates writes files (name → text) into a new directory and returns it.
func writeMailTemplates(t *testing.T, files map[string]string) string {
	t.Helper()

	dir := t.TempDir()
	for name, text := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600))
	}
	return dir
}

// TestServe_MailTemplatesStopStart: a template that does not parse, or that names a field
// templates do not see, stops `postguard serve` before it opens its database, with an error
// naming the variable and the file.
func TestServe_MailTemplatesStopStart(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name  string
		files map[string]string
		file  string
		want  string
	}{
		{
			name:  "ParseError",
			files: map[string]string{"welcome.fr.html": `{{define "content"}}<p>Bonjour {{.Name</p>{{end}}`},
			file:  "welcome.fr.html",
			want:  "welcome.fr.html:1: bad character",
		},
		{
			name: "UnknownField",
			files: map[string]string{"verification.fr.txt": `{{define "subject"}}Confirmez votre adresse{{end}}
{{define "content"}}Bonjour {{.Prenom}} : {{.ActionURL}}{{end}}
{{define "footer"}}{{.AppName}}{{end}}`},
			file: "verification.fr.txt",
			want: "verification.fr.txt:2:30: unknown field .Prenom",
		},
		{
			name: "PageUnknownField",
			files: map[string]string{"page_reset_password.fr.html": `{{define "title"}}Nouveau mot de passe{{end}}
{{define "content"}}<input name="password" aria-invalid="{{.Errors.Mot}}">{{end}}`},
			file: "page_reset_password.fr.html",
			want: "page_reset_password.fr.html:2:66: unknown field .Mot",
		},
		{
			name:  "PageWithoutTitle",
			files: map[string]string{"page_email_verified.html": `{{define "content"}}Done.{{end}}`},
			file:  "page_email_verified.html",
			want:  `"title" is undefined`,
		},
		{
			name:  "UnknownPage",
			files: map[string]string{"page_verified.html": `{{define "title"}}Done{{end}}`},
			file:  "page_verified.html",
			want:  `"page_verified" is not a template`,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			dir := writeMailTemplates(t, tt.files)
			dbPath := filepath.Join(t.TempDir(), "postguard.db")
			out, err := runCommand(t, []string{"serve"}, map[string]string{
				"DATABASE_URL":       "sqlite://" + dbPath,
				"HTTP_ADDR":          "127.0.0.1:0",
				"METRICS_ADDR":       "off",
				"MAIL_TEMPLATES_DIR": dir,
			})
			require.Error(t, err, out)
			require.ErrorContains(t, err, "configuration error")
			require.ErrorContains(t, err, "invalid MAIL_TEMPLATES_DIR")
			require.ErrorContains(t, err, filepath.Join(dir, tt.file))
			require.ErrorContains(t, err, tt.want)
			require.NoFileExists(t, dbPath, "stopped before opening the database")
		})
	}
}

// sentMail is what the provider received of one mail.
type sentMail struct {
	To      []string `json:"to"`
	Subject string   `json:"subject"`
	HTML    string   `json:"html"`
	Text    string   `json:"text"`
}

// TestServe_FrenchMail: with one French template in MAIL_TEMPLATES_DIR, a user who registers in
// French, by register's locale or by the browser's Accept-Language, gets a French welcome; the
// verification mail, which has no French template, and every mail of an English user, are the
// built-in English ones.
func TestServe_FrenchMail(t *testing.T) {
	t.Parallel()

	received := make(chan *resendfake.Request, 16)
	fake := resendfake.New(t, &resendfake.Config{BeforeAnswerFunc: func(req *resendfake.Request) { received <- req }})
	env := resendEnv("sqlite://"+filepath.Join(t.TempDir(), "postguard.db"), fake)
	env["APP_NAME"] = "Acme"
	env["MAIL_TEMPLATES_DIR"] = frenchMailTemplates
	server := startServer(t, service.RoleServe, env)
	require.Contains(t, server.Logs.String(), `mail_locales="[en fr]"`)

	register := func(email, locale, acceptLanguage string) {
		body := `{"email":"` + email + `","password":"correct horse battery"`
		if locale != "" {
			body += `,"locale":"` + locale + `"`
		}
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, server.URL+"/v1/auth/register", strings.NewReader(body+"}"))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if acceptLanguage != "" {
			req.Header.Set("Accept-Language", acceptLanguage)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode)
	}
	register("amelie@example.fr", "fr", "en-US,en;q=0.9") // the field wins over the header
	register("bastien@example.ch", "", "fr-CH, fr;q=0.9, en;q=0.8")
	register("carol@example.com", "", "en-GB,en;q=0.9")

	// Two mails each; the fake hands over each request as it receives it.
	mails := map[string][]sentMail{}
	for range 6 {
		select {
		case req := <-received:
			var m sentMail
			require.NoError(t, json.Unmarshal(req.Body, &m))
			require.Len(t, m.To, 1)
			mails[m.To[0]] = append(mails[m.To[0]], m)
		case <-time.After(30 * time.Second):
			t.Fatalf("6 mails not sent within 30s; got %v\nlogs:\n%s", mails, server.Logs.String())
		}
	}
	subjects := map[string][]string{}
	for to, sent := range mails {
		for _, m := range sent {
			subjects[to] = append(subjects[to], m.Subject)
		}
	}
	for _, to := range []string{"amelie@example.fr", "bastien@example.ch"} {
		require.ElementsMatch(t, []string{"Bienvenue sur Acme", "Verify your email address for Acme"}, subjects[to], to)
		for _, m := range mails[to] {
			if m.Subject == "Bienvenue sur Acme" {
				require.Contains(t, m.Text, "Bienvenue sur Acme ! Votre compte est prêt.")
				require.Contains(t, m.HTML, `<html lang="fr">`)
				require.Contains(t, m.HTML, ">Commencer</a>")
				require.Contains(t, m.HTML, "— The Acme team", "the layout falls back to the built-in one")
			}
		}
	}
	require.ElementsMatch(t, []string{"Welcome to Acme", "Verify your email address for Acme"}, subjects["carol@example.com"])
	require.NoError(t, server.stop(t))
}

func TestMailPreview_Run(t *testing.T) {
	t.Parallel()

	t.Run("EveryKindAndLocale", func(t *testing.T) {
		t.Parallel()

		out := filepath.Join(t.TempDir(), "preview")
		stdout, err := runCommand(t, []string{"mail", "preview", "--out", out}, map[string]string{
			"APP_NAME":           "Acme",
			"APP_URL":            "https://acme.example",
			"MAIL_TEMPLATES_DIR": frenchMailTemplates,
			// Not needed, not read: a preview opens no database.
			"DATABASE_URL": "postgres://nowhere.invalid/postguard",
		})
		require.NoError(t, err, stdout)

		read := func(name string) string {
			t.Helper()
			data, err := os.ReadFile(filepath.Join(out, name))
			require.NoError(t, err)
			require.Contains(t, stdout, filepath.Join(out, name), "each file written is listed")
			return string(data)
		}
		for _, locale := range []string{"en", "fr"} {
			for _, kind := range []string{"welcome", "verification", "password_reset"} {
				html, text := read(locale+"/"+kind+".html"), read(locale+"/"+kind+".txt")
				require.Contains(t, html, "https://acme.example", locale+"/"+kind)
				require.Contains(t, text, "Ada Lovelace", locale+"/"+kind)
			}
		}
		require.Contains(t, read("fr/welcome.txt"), "Bienvenue sur Acme ! Votre compte est prêt.")
		require.Contains(t, read("fr/welcome.html"), `<html lang="fr">`)
		require.Contains(t, read("en/welcome.txt"), "Welcome to Acme! Your account is ready.")
		require.Contains(t, read("fr/verification.txt"), "Please confirm", "no French verification: the built-in one")
		require.Contains(t, read("en/password_reset.txt"), "https://acme.example/v1/auth/reset-password?token=")
		// The pages beside the mail, each in both locales.
		for _, locale := range []string{"en", "fr"} {
			for _, page := range mail.Pages() {
				html := read(locale + "/pages/" + string(page) + ".html")
				require.Contains(t, html, `<html lang="`+locale+`">`, page)
				require.Contains(t, html, " · Acme</title>", page)
			}
		}
		require.Contains(t, read("fr/pages/reset_password.html"), "Choisissez un nouveau mot de passe")
		require.Contains(t, read("en/pages/reset_password.html"), "Choose a new password")
		index := read("index.html")
		require.Contains(t, index, "<td>fr</td><td>welcome</td><td>Bienvenue sur Acme</td>")
		require.Contains(t, index, `<a href="en/password_reset.html">HTML</a>`)
		require.Contains(t, index, `<td>fr</td><td>forgot_password</td><td><a href="fr/pages/forgot_password.html">Réinitialiser votre mot de passe</a></td>`)
	})

	t.Run("SameChecksAsServer", func(t *testing.T) {
		t.Parallel()

		dir := writeMailTemplates(t, map[string]string{"welcome.txt": `{{define "subject"}}{{.Bogus}}{{end}}`})
		_, err := runCommand(t, []string{"mail", "preview", "--out", t.TempDir()}, map[string]string{"MAIL_TEMPLATES_DIR": dir, "APP_NAME": "\x07"})
		require.ErrorContains(t, err, "invalid APP_NAME")
		_, err = runCommand(t, []string{"mail", "preview", "--out", t.TempDir()}, map[string]string{"MAIL_TEMPLATES_DIR": dir})
		require.ErrorContains(t, err, filepath.Join(dir, "welcome.txt")+":1:22: unknown field .Bogus")
		_, err = runCommand(t, []string{"mail", "preview", "--out", t.TempDir()}, map[string]string{"APP_BRAND_COLOR": "#ffff00"})
		require.ErrorContains(t, err, "invalid APP_BRAND_COLOR")

		pages := writeMailTemplates(t, map[string]string{"page_error.fr.html": "{{define \"title\"}}Erreur{{end}}\n{{define \"content\"}}{{.ActionURL}}{{end}}"})
		_, err = runCommand(t, []string{"mail", "preview", "--out", t.TempDir()}, map[string]string{"MAIL_TEMPLATES_DIR": pages})
		require.ErrorContains(t, err, filepath.Join(pages, "page_error.fr.html")+":2:22: unknown field .ActionURL")
	})

	t.Run("Usage", func(t *testing.T) {
		t.Parallel()

		for _, args := range [][]string{{"mail"}, {"mail", "send"}, {"mail", "preview"}, {"mail", "preview", "--out"}, {"mail", "preview", "--out", "x", "y"}, {"serve", "extra"}} {
			out, err := runCommand(t, args, nil)
			require.ErrorIs(t, err, errUsage, "%v", args)
			require.Contains(t, out, "Usage: postguard", "%v", args)
		}
	})
}

// TestServe_DevMailOnlyWithLogMailer: /dev/mail exists on `serve` with the log mailer and a
// loopback APP_URL only. With another mailer it is not mounted; with a public APP_URL neither
// (it would show reset links to anyone), and the log mailer prints whole mails instead.
func TestServe_DevMailOnlyWithLogMailer(t *testing.T) {
	t.Parallel()

	get := func(t *testing.T, url string) int {
		t.Helper()
		resp, err := http.Get(url)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	sqliteEnv := func(t *testing.T, env map[string]string) map[string]string {
		t.Helper()
		env["DATABASE_URL"] = "sqlite://" + filepath.Join(t.TempDir(), "postguard.db")
		env["JOB_FETCH_COOLDOWN"], env["JOB_FETCH_POLL_INTERVAL"] = "10ms", "50ms"
		return env
	}

	t.Run("LogMailer", func(t *testing.T) {
		t.Parallel()
		server := startServer(t, service.RoleServe, sqliteEnv(t, map[string]string{"MAILER": "log"}))
		require.Equal(t, http.StatusOK, get(t, server.URL+"/dev/mail"))
		require.Equal(t, http.StatusOK, get(t, server.URL+"/"), "the start page, where /dev/mail is")
		require.NoError(t, server.stop(t))
	})

	t.Run("NoMailer", func(t *testing.T) {
		t.Parallel()
		server := startServer(t, service.RoleServe, sqliteEnv(t, map[string]string{"MAILER": "none"}))
		require.Equal(t, http.StatusNotFound, get(t, server.URL+"/dev/mail"))
		require.Equal(t, http.StatusNotFound, get(t, server.URL+"/"))
		require.NoError(t, server.stop(t))
	})

	t.Run("Resend", func(t *testing.T) {
		t.Parallel()
		env := resendEnv("", resendfake.New(t, nil))
		server := startServer(t, service.RoleServe, sqliteEnv(t, env))
		require.Equal(t, http.StatusNotFound, get(t, server.URL+"/dev/mail"))
		require.NoError(t, server.stop(t))
	})

	t.Run("PublicAppURL", func(t *testing.T) {
		t.Parallel()
		server := startServer(t, service.RoleServe, sqliteEnv(t, map[string]string{"MAILER": "log", "APP_URL": "https://auth.example.com"}))
		require.Equal(t, http.StatusNotFound, get(t, server.URL+"/dev/mail"))
		require.Equal(t, http.StatusNotFound, get(t, server.URL+"/"))
		require.Contains(t, server.Logs.String(), "/dev/mail is not served: APP_URL is not a loopback address")

		status, body := opsRegister(t, server.URL, "ada@example.com")
		require.Equal(t, http.StatusCreated, status, body)
		require.Eventually(t, func() bool {
			return strings.Contains(server.Logs.String(), "https://auth.example.com/v1/auth/verify-email?token=")
		}, 20*time.Second, 50*time.Millisecond, "whole mail not printed; logs:\n%s", server.Logs.String())
		require.NoError(t, server.stop(t))
	})
}
