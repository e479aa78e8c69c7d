package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"html/template"
	"io"
	"os"
	"path/filepath"

	"github.com/postguard/postguard/jobs/mail"
)

const mailUsage = `Usage: postguard mail preview --out DIR

Writes every mail kind in every locale that has templates, HTML and text, rendered with sample
data, into DIR/<locale>/<kind>.html and .txt; every page of the service (the pages the mail's
links open, their answers and errors) beside them, into DIR/<locale>/pages/<page>.html; and
DIR/index.html listing them. It reads APP_NAME, APP_URL, APP_LOGIN_URL, APP_BRAND_COLOR,
APP_LOGO_URL, MAIL_TEMPLATES_DIR and DEFAULT_LOCALE, checked as the server checks them, and
needs no database.
`

// mailPreviewCommand writes every kind × locale of the mail, and every page × locale, rendered
// with sample data.
type mailPreviewCommand struct {
	out string
}

// parseMailCommand reads `mail preview --out DIR`; args are those after "mail".
func parseMailCommand(args []string, stderr io.Writer) (*mailPreviewCommand, error) {
	if len(args) == 0 || args[0] != "preview" {
		fmt.Fprint(stderr, mailUsage)
		return nil, errUsage
	}
	cmd := &mailPreviewCommand{}
	flags := flag.NewFlagSet("postguard mail preview", flag.ContinueOnError)
	flags.SetOutput(io.Discard)
	flags.StringVar(&cmd.out, "out", "", "directory to write the previews into (created if missing)")
	if err := flags.Parse(args[1:]); err != nil {
		fmt.Fprintf(stderr, "postguard: %v\n\n%s", err, mailUsage)
		return nil, errUsage
	}
	if err := cmd.Validate(); err != nil || flags.NArg() > 0 {
		if err == nil {
			err = fmt.Errorf("unexpected argument %q", flags.Arg(0))
		}
		fmt.Fprintf(stderr, "postguard: %v\n\n%s", err, mailUsage)
		return nil, errUsage
	}
	return cmd, nil
}

// Validate checks the command's options.
func (c *mailPreviewCommand) Validate() error {
	if c.out == "" {
		return errors.New("--out DIR is required")
	}
	return nil
}

// previewEntry is one mail of the preview's index.
type previewEntry struct {
	Locale, Kind, Subject, HTML, Text string
}

// previewPage is one page of the preview's index.
type previewPage struct {
	Locale, Page, Title, HTML string
}

var previewIndex = template.Must(template.New("index").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{.AppName}} mail and pages preview</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2rem; color: #1f2328; }
table { border-collapse: collapse; }
th, td { text-align: left; padding: .4rem .8rem; border-bottom: 1px solid #d0d7de; }
</style>
</head>
<body>
<h1>{{.AppName}} mail and pages preview</h1>
<p>Every mail kind and every page in every locale that has templates, rendered with sample data.</p>
<h2>Mail</h2>
<table>
<tr><th>locale</th><th>kind</th><th>subject</th><th>parts</th></tr>
{{- range .Entries}}
<tr><td>{{.Locale}}</td><td>{{.Kind}}</td><td>{{.Subject}}</td><td><a href="{{.HTML}}">HTML</a> · <a href="{{.Text}}">text</a></td></tr>
{{- end}}
</table>
<h2>Pages</h2>
<table>
<tr><th>locale</th><th>page</th><th>title</th></tr>
{{- range .Pages}}
<tr><td>{{.Locale}}</td><td>{{.Page}}</td><td><a href="{{.HTML}}">{{.Title}}</a></td></tr>
{{- end}}
</table>
</body>
</html>
`))

func (c *mailPreviewCommand) Run(_ context.Context, env *commandEnv) error {
	cfg, err := loadMailConfig(env.Environ)
	if err != nil {
		return fmt.Errorf("configuration error:\n%w", err)
	}
	renderer := cfg.Renderer
	for _, warning := range renderer.Warnings() {
		fmt.Fprintf(env.Stderr, "postguard: warning: MAIL_TEMPLATES_DIR: %s\n", warning)
	}

	var entries []previewEntry
	var pages []previewPage
	write := func(name, content string) error {
		path := filepath.Join(c.out, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			return fmt.Errorf("error creating preview directory: %w", err)
		}
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			return fmt.Errorf("error writing preview: %w", err)
		}
		_, err := fmt.Fprintln(env.Stdout, path)
		return err
	}
	for _, locale := range renderer.Locales() {
		for _, kind := range mail.Kinds() {
			rendered, err := renderer.RenderSample(kind, locale)
			if err != nil {
				return err
			}
			entry := previewEntry{
				Locale:  locale,
				Kind:    string(kind),
				Subject: rendered.Subject,
				HTML:    locale + "/" + string(kind) + ".html",
				Text:    locale + "/" + string(kind) + ".txt",
			}
			if err := write(entry.HTML, rendered.HTML); err != nil {
				return err
			}
			if err := write(entry.Text, rendered.Text); err != nil {
				return err
			}
			entries = append(entries, entry)
		}
		for _, page := range mail.Pages() {
			rendered, err := renderer.RenderPageSample(page, locale)
			if err != nil {
				return err
			}
			entry := previewPage{Locale: locale, Page: string(page), Title: rendered.Title, HTML: locale + "/pages/" + string(page) + ".html"}
			if err := write(entry.HTML, rendered.HTML); err != nil {
				return err
			}
			pages = append(pages, entry)
		}
	}

	var index bytes.Buffer
	if err := previewIndex.Execute(&index, map[string]any{"AppName": renderer.AppName(), "Entries": entries, "Pages": pages}); err != nil {
		return fmt.Errorf("error rendering the preview's index: %w", err)
	}
	return write("index.html", index.String())
}
