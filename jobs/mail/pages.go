package mail

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	htmltemplate "html/template"
	"io"
	"reflect"
	"strings"
	"time"

	"golang.org/x/net/html"
)

// Page is one of the service's HTML pages: the pages a mail's links open, the forms they hold,
// and the answers and errors of those forms. Its template is page_ and its name
// (page_verify_email.html), rendered inside page_layout.html.
type Page string

// The pages.
const (
	// PageVerifyEmail is the verification link's page: a button that confirms the address.
	PageVerifyEmail Page = "verify_email"
	// PageEmailVerified answers it.
	PageEmailVerified Page = "email_verified"
	// PageForgotPassword is the form that asks for a reset link (GET /v1/auth/forgot-password),
	// also shown again with its error.
	PageForgotPassword Page = "forgot_password"
	// PageResetLinkSent answers it, the same whether or not the address has an account.
	PageResetLinkSent Page = "reset_link_sent"
	// PageResetPassword is the reset link's page: a form for the new password, also shown again
	// with its error.
	PageResetPassword Page = "reset_password"
	// PagePasswordChanged answers it.
	PagePasswordChanged Page = "password_changed"
	// PageUnsubscribe is the unsubscribe link's page: a button that confirms.
	PageUnsubscribe Page = "unsubscribe"
	// PageUnsubscribed answers it.
	PageUnsubscribed Page = "unsubscribed"
	// PageError is every error answered to a page or a form: an invalid link, too many
	// attempts, an outage.
	PageError Page = "error"
	// PageStart is GET / in development (MAILER=log with /dev/mail served): where to begin.
	PageStart Page = "start"
)

// Pages returns every page, in the order a preview lists them.
func Pages() []Page {
	return []Page{
		PageVerifyEmail, PageEmailVerified,
		PageForgotPassword, PageResetLinkSent, PageResetPassword, PagePasswordChanged,
		PageUnsubscribe, PageUnsubscribed,
		PageError, PageStart,
	}
}

// base is the page's template name.
func (p Page) base() string { return pagePrefix + string(p) }

const (
	pagePrefix = "page_"
	// pageLayoutName is the name of the template every page is rendered inside.
	pageLayoutName = "page_layout"
)

var pageFamily = &family{ //nolint:gochecknoglobals // computed once from the types
	layout: pageLayoutName,
	bases: func() []string {
		var bases []string
		for _, page := range Pages() {
			bases = append(bases, page.base())
		}
		return bases
	}(),
	exts:   []string{"html"},
	idents: identsOf(reflect.TypeFor[pageView](), reflect.TypeFor[FieldErrors](), reflect.TypeFor[Expiry]()),
	fields: ".AppName, .AppURL, .LoginURL, .BrandColor, .BrandTextColor, .LogoURL, .Locale, .Title, .Token, .Email, .Errors (.Email, .Password), .MinPassword, .MaxPassword, .Status, .Detail, .RetryAfter (.Days, .Hours, .Minutes) and .Flow",
}

// PageData is what one page shows besides the brand. Each page uses the fields its doc says;
// the others are zero.
type PageData struct {
	// Token is the link's token, which the forms of PageVerifyEmail, PageResetPassword and
	// PageUnsubscribe post back.
	Token string

	// Email is the address PageForgotPassword was sent with, shown again as typed.
	Email string

	// Errors say what is wrong with each field of a form shown again (PageForgotPassword,
	// PageResetPassword); zero when nothing is.
	Errors FieldErrors

	// MinPassword and MaxPassword bound a new password, in characters (PageResetPassword).
	MinPassword, MaxPassword int

	// Status is PageError's HTTP status; Detail says what went wrong, in English (the API's
	// problem detail); RetryAfter is how long to wait before trying again (429), 0 when the
	// answer does not say; Flow is the page whose request failed, "" when none (a request that
	// came from no page of the service).
	Status     int
	Detail     string
	RetryAfter time.Duration
	Flow       Page
}

// FieldErrors say, for each field of the forms, what is wrong with it ("" when nothing is), in
// English. A template in another language words them itself: .Errors.Password says there is
// something to say, .MinPassword and .MaxPassword the bounds.
type FieldErrors struct {
	Email    string
	Password string
}

// RenderedPage is one rendered page.
type RenderedPage struct {
	// Locale is the locale the page was rendered in: one of Renderer.Locales.
	Locale string
	// Title is the page's rendered "title" block.
	Title string
	HTML  string
	// CSP is the Content-Security-Policy the page needs and nothing more: its own <style>
	// elements (by their SHA-256, so no inline style of anyone else's applies), the logo's
	// origin, forms that post to the service itself, and no framing by any other page.
	CSP string
}

// pageView is what the page templates see.
type pageView struct {
	brand
	// Title is the rendered "title" block, for the layout's <title> and <h1>.
	Title                    string
	Token                    string
	Email                    string
	Errors                   FieldErrors
	MinPassword, MaxPassword int
	Status                   int
	Detail                   string
	RetryAfter               Expiry
	Flow                     string
}

type pageKey struct {
	locale string
	page   Page
}

// pageSet is one page's parsed templates in one locale: the layout and the page's own "title"
// and "content", each from the file resolve chose.
type pageSet struct {
	html  *htmltemplate.Template
	files string // the files html was parsed from, for error messages
}

// parsePageSet parses one page's layout and own file.
func parsePageSet(page Page, layout, own source) (*pageSet, error) {
	set := &pageSet{
		html:  htmltemplate.New(page.base()).Option("missingkey=error"),
		files: own.name + " in " + layout.name,
	}
	for _, src := range []source{layout, own} {
		if _, err := set.html.New(src.name).Parse(src.text); err != nil {
			return nil, err
		}
	}
	return set, nil
}

// checkPageSet renders set with each of the page's samples.
func (r *Renderer) checkPageSet(page Page, locale string, set *pageSet) error {
	for _, data := range samplePageData(page) {
		if _, err := r.executePage(page, locale, set, data); err != nil {
			return err
		}
	}
	return nil
}

// samplePageData are the data a page is checked with, the first of them the one it is previewed
// with: each form with and without its errors, the error page for an invalid link, a form that
// does not check, too many attempts and an outage.
func samplePageData(page Page) []*PageData {
	const sampleToken = "c2FtcGxlLXRva2VuLW5vdC1hLXJlYWwtb25lLWV2ZXI" //nolint:gosec // a made-up token of the real form, for samples
	switch page {
	case PageVerifyEmail:
		return []*PageData{{Token: sampleToken}}
	case PageForgotPassword:
		return []*PageData{
			{},
			{Email: "ada@example", Errors: FieldErrors{Email: "Email must be one plain address, like name@example.com."}},
		}
	case PageResetPassword:
		return []*PageData{
			{Token: sampleToken, MinPassword: 8, MaxPassword: 256},
			{Token: sampleToken, MinPassword: 8, MaxPassword: 256, Errors: FieldErrors{Password: "Password must be at least 8 characters long."}},
		}
	case PageUnsubscribe:
		return []*PageData{{Token: "1.c2FtcGxl"}} //nolint:gosec // a made-up unsubscribe token, for samples
	case PageError:
		return []*PageData{
			{Status: 400, Detail: "The link is invalid, has expired or has been used already.", Flow: PageResetPassword},
			{Status: 400, Detail: "The link is invalid, has expired or has been used already.", Flow: PageVerifyEmail},
			{Status: 422, Detail: "Token is required.", Flow: PageUnsubscribe},
			{Status: 429, Detail: "Too many requests; retry in 540 seconds.", RetryAfter: 9 * time.Minute, Flow: PageForgotPassword},
			{Status: 503, Detail: "The service cannot answer right now; retry later.", RetryAfter: 2 * time.Second},
			{Status: 500, Detail: "Internal server error. The details are in the service's log."},
		}
	default:
		return []*PageData{{}}
	}
}

// RenderPage renders page for a visitor whose locale is locale (see Match), with data.
func (r *Renderer) RenderPage(page Page, locale string, data *PageData) (*RenderedPage, error) {
	if data == nil {
		data = &PageData{}
	}
	locale = r.Match(locale)
	set, ok := r.pages[pageKey{locale, page}]
	if !ok {
		return nil, fmt.Errorf("error rendering page: unknown page %q", page)
	}
	return r.executePage(page, locale, set, data)
}

// RenderPageSample renders page in locale (see Match) with the sample data the templates are
// checked with first: what `postguard mail preview` writes.
func (r *Renderer) RenderPageSample(page Page, locale string) (*RenderedPage, error) {
	return r.RenderPage(page, locale, samplePageData(page)[0])
}

func (r *Renderer) executePage(page Page, locale string, set *pageSet, data *PageData) (*RenderedPage, error) {
	v := &pageView{
		brand:       r.brand,
		Token:       data.Token,
		Email:       data.Email,
		Errors:      data.Errors,
		MinPassword: data.MinPassword,
		MaxPassword: data.MaxPassword,
		Status:      data.Status,
		Detail:      data.Detail,
		RetryAfter:  Expiry(data.RetryAfter),
		Flow:        string(data.Flow),
	}
	v.Locale = locale
	var buf bytes.Buffer
	if err := set.html.ExecuteTemplate(&buf, "title", v); err != nil {
		return nil, fmt.Errorf("error rendering page %s's title, locale %s, from %s: %w", page, locale, set.files, err)
	}
	// The title block is HTML (escaped); the layout prints it as text, so it is read back as
	// the text it shows.
	v.Title = strings.Join(strings.Fields(html.UnescapeString(buf.String())), " ")
	if v.Title == "" {
		return nil, fmt.Errorf("error rendering page %s, locale %s, from %s: the title block must render some text", page, locale, set.files)
	}

	buf.Reset()
	if err := set.html.ExecuteTemplate(&buf, layoutName, v); err != nil {
		return nil, fmt.Errorf("error rendering page %s, locale %s, from %s: %w", page, locale, set.files, err)
	}
	csp, err := r.pageCSP(buf.Bytes())
	if err != nil {
		return nil, fmt.Errorf("error rendering page %s, locale %s, from %s: %w", page, locale, set.files, err)
	}
	return &RenderedPage{Locale: locale, Title: v.Title, HTML: buf.String(), CSP: csp}, nil
}

// pageCSP is the Content-Security-Policy of a rendered page: default-src 'none', so nothing
// loads but what it names; style-src the SHA-256 of each <style> element of the page (a hash
// rather than a nonce keeps the page deterministic, so that answers which must not differ do not);
// img-src the logo's origin; forms posting to the service only; no <base>; no framing.
func (r *Renderer) pageCSP(page []byte) (string, error) {
	directives := []string{"default-src 'none'"}
	var styles []string
	z := html.NewTokenizer(bytes.NewReader(page))
	inStyle := false
	for {
		switch z.Next() {
		case html.ErrorToken:
			if !errors.Is(z.Err(), io.EOF) {
				return "", fmt.Errorf("error reading the page for its styles: %w", z.Err())
			}
			if len(styles) > 0 {
				directives = append(directives, "style-src "+strings.Join(styles, " "))
			}
			if r.logoOrigin != "" {
				directives = append(directives, "img-src "+r.logoOrigin)
			}
			directives = append(directives, "form-action 'self'", "base-uri 'none'", "frame-ancestors 'none'")
			return strings.Join(directives, "; "), nil
		case html.StartTagToken:
			name, _ := z.TagName()
			inStyle = string(name) == "style"
		case html.TextToken:
			if inStyle {
				sum := sha256.Sum256(z.Text())
				styles = append(styles, "'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'")
			}
		case html.EndTagToken:
			inStyle = false
		}
	}
}
