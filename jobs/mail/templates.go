package mail

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	htmltemplate "html/template"
	"strconv"
	"strings"
	texttemplate "text/template"
	"time"
)

const (
	// DefaultVerificationExpiry is the verification link's life shown in the
	// mail when VerificationData.ExpiresIn is zero.
	DefaultVerificationExpiry = 24 * time.Hour

	// DefaultPasswordResetExpiry is the reset link's life shown in the mail
	// when PasswordResetData.ExpiresIn is zero.
	DefaultPasswordResetExpiry = time.Hour
)

// WelcomeData is the input of RenderWelcome.
type WelcomeData struct {
	// Name is the user's name; the greeting says "there" when it is empty.
	Name string

	// AppURL is the app's base URL (APP_URL), the target of the mail's
	// button. Required.
	AppURL string

	// UnsubscribeURL is the one-click unsubscribe link shown in the footer
	// (and sent in the List-Unsubscribe header by the caller). Required.
	UnsubscribeURL string
}

// VerificationData is the input of RenderVerification.
type VerificationData struct {
	// Name is the user's name; the greeting says "there" when it is empty.
	Name string

	// VerifyURL is the link that verifies the address. Required.
	VerifyURL string

	// ExpiresIn is the link's life, shown in the mail. Defaults to
	// DefaultVerificationExpiry.
	ExpiresIn time.Duration
}

// PasswordResetData is the input of RenderPasswordReset.
type PasswordResetData struct {
	// Name is the user's name; the greeting says "there" when it is empty.
	Name string

	// ResetURL is the link to the reset form. Required.
	ResetURL string

	// ExpiresIn is the link's life, shown in the mail. Defaults to
	// DefaultPasswordResetExpiry.
	ExpiresIn time.Duration
}

//go:embed templates/*.html templates/*.txt
var templateFS embed.FS

// mailTemplates is one mail's parsed templates: each set holds the shared
// layout plus the mail's own "content" and "footer" (and "subject" in text).
type mailTemplates struct {
	html *htmltemplate.Template
	text *texttemplate.Template
}

func mustParseMail(name string) *mailTemplates {
	return &mailTemplates{
		html: htmltemplate.Must(htmltemplate.New(name).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")),
		text: texttemplate.Must(texttemplate.New(name).ParseFS(templateFS, "templates/layout.txt", "templates/"+name+".txt")),
	}
}

var (
	passwordResetTemplates = mustParseMail("password_reset")
	verificationTemplates  = mustParseMail("verification")
	welcomeTemplates       = mustParseMail("welcome")
)

// templateView is what the templates see. html/template escapes every field
// for its context (text, attribute, URL); text/template prints them as is.
type templateView struct {
	ActionURL      string
	AppURL         string
	ExpiresIn      string
	Name           string
	Subject        string
	UnsubscribeURL string
}

// RenderWelcome renders the welcome mail: a greeting, a button to the app and
// a footer with the unsubscribe link.
func RenderWelcome(data *WelcomeData) (subject, html, text string, err error) {
	if data == nil {
		return "", "", "", errors.New("error rendering welcome email: no data")
	}
	if data.AppURL == "" || data.UnsubscribeURL == "" {
		return "", "", "", errors.New("error rendering welcome email: AppURL and UnsubscribeURL are required")
	}
	return render(welcomeTemplates, &templateView{
		ActionURL:      data.AppURL,
		AppURL:         data.AppURL,
		Name:           greetingName(data.Name),
		UnsubscribeURL: data.UnsubscribeURL,
	})
}

// RenderVerification renders the mail that asks a user to verify their
// address, with the link and its expiry.
func RenderVerification(data *VerificationData) (subject, html, text string, err error) {
	if data == nil {
		return "", "", "", errors.New("error rendering verification email: no data")
	}
	if data.VerifyURL == "" {
		return "", "", "", errors.New("error rendering verification email: VerifyURL is required")
	}
	return render(verificationTemplates, &templateView{
		ActionURL: data.VerifyURL,
		ExpiresIn: formatExpiry(durationOr(data.ExpiresIn, DefaultVerificationExpiry)),
		Name:      greetingName(data.Name),
	})
}

// RenderPasswordReset renders the mail with a password reset link and its
// expiry.
func RenderPasswordReset(data *PasswordResetData) (subject, html, text string, err error) {
	if data == nil {
		return "", "", "", errors.New("error rendering password reset email: no data")
	}
	if data.ResetURL == "" {
		return "", "", "", errors.New("error rendering password reset email: ResetURL is required")
	}
	return render(passwordResetTemplates, &templateView{
		ActionURL: data.ResetURL,
		ExpiresIn: formatExpiry(durationOr(data.ExpiresIn, DefaultPasswordResetExpiry)),
		Name:      greetingName(data.Name),
	})
}

func render(tmpls *mailTemplates, view *templateView) (subject, html, text string, err error) {
	var buf bytes.Buffer
	if err := tmpls.text.ExecuteTemplate(&buf, "subject", view); err != nil {
		return "", "", "", fmt.Errorf("error rendering %s subject: %w", tmpls.text.Name(), err)
	}
	view.Subject = strings.TrimSpace(buf.String())

	buf.Reset()
	if err := tmpls.html.ExecuteTemplate(&buf, "layout", view); err != nil {
		return "", "", "", fmt.Errorf("error rendering %s HTML: %w", tmpls.html.Name(), err)
	}
	html = buf.String()

	buf.Reset()
	if err := tmpls.text.ExecuteTemplate(&buf, "layout", view); err != nil {
		return "", "", "", fmt.Errorf("error rendering %s text: %w", tmpls.text.Name(), err)
	}
	return view.Subject, html, buf.String(), nil
}

func greetingName(name string) string {
	if name = strings.TrimSpace(name); name != "" {
		return name
	}
	return "there"
}

func durationOr(d, fallback time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return fallback
}

// formatExpiry says a link's life in words: "24 hours", "1 hour",
// "30 minutes", "3 days". Odd durations are rounded up to the minute.
func formatExpiry(d time.Duration) string {
	plural := func(n int64, unit string) string {
		if n == 1 {
			return "1 " + unit
		}
		return strconv.FormatInt(n, 10) + " " + unit + "s"
	}

	const day = 24 * time.Hour
	switch {
	case d >= 2*day && d%day == 0:
		return plural(int64(d/day), "day")
	case d >= time.Hour && d%time.Hour == 0:
		return plural(int64(d/time.Hour), "hour")
	}
	return plural(int64((d+time.Minute-1)/time.Minute), "minute")
}
