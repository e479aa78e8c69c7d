package api

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/postguard/postguard/jobs/mail"
)

// devMailHTML holds the pages of /dev/mail: the list of mails and one mail.
//
//go:embed devmail.html
var devMailHTML string

var devMailTemplates = template.Must(template.New("devmail").Parse(devMailHTML))

// devMailCSP is the Content-Security-Policy of /dev/mail. The mail's HTML is shown in an iframe
// of the page (srcdoc, sandboxed: no script, no form, an origin of its own) and inherits this
// policy: no script anywhere, no request to any other site but APP_LOGO_URL's (a mail's other
// images do not load), and no framing of the page itself. %s is the logo's origin, or nothing.
const devMailCSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:%s; frame-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// mountDevMail adds /dev/mail: the log mailer's outbox as a person would see it.
func (s *server) mountDevMail(engine *gin.Engine, outbox *mail.Outbox) {
	logo := ""
	if u, err := url.Parse(s.renderer.LogoURL()); err == nil && u.Host != "" {
		logo = " " + u.Scheme + "://" + strings.ToLower(u.Host) // checked by the renderer
	}
	csp := fmt.Sprintf(devMailCSP, logo)
	engine.GET("/dev/mail", s.handle(func(c *gin.Context) error {
		return s.renderDevMail(c, csp, "list", map[string]any{"Title": "Mail", "Mails": outbox.List()})
	}))
	engine.GET("/dev/mail/:id", s.handle(func(c *gin.Context) error {
		m, ok := outbox.Get(c.Param("id"))
		if !ok {
			return newError(http.StatusNotFound, "No mail with this id among the last ones the log mailer kept.")
		}
		headers := make([]devMailHeader, 0, len(m.Message.Headers))
		for _, name := range slices.Sorted(maps.Keys(m.Message.Headers)) {
			headers = append(headers, devMailHeader{Name: name, Value: m.Message.Headers[name]})
		}
		return s.renderDevMail(c, csp, "mail", map[string]any{
			"Title":   m.Message.Subject,
			"Mail":    m,
			"Headers": headers,
			"Text":    linkify(m.Message.Text),
		})
	}))
}

// devMailHeader is one header of a mail, for the page.
type devMailHeader struct{ Name, Value string }

// renderDevMail answers a page of /dev/mail. Its mails hold live tokens: the page is not cached,
// sends no referrer, and may not be framed.
func (s *server) renderDevMail(c *gin.Context, csp, name string, data map[string]any) error {
	data["AppName"] = s.appName
	data["Size"] = mail.DefaultOutboxSize
	var buf bytes.Buffer
	if err := devMailTemplates.ExecuteTemplate(&buf, name, data); err != nil {
		return fmt.Errorf("error rendering /dev/mail: %w", err)
	}
	h := c.Writer.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Content-Security-Policy", csp)
	c.Data(http.StatusOK, "text/html; charset=utf-8", buf.Bytes())
	return nil
}

// textSegment is a piece of a plain-text body: a link (URL set) or text.
type textSegment struct{ Text, URL string }

// textLinkPattern finds http(s) links in a plain-text body.
var textLinkPattern = regexp.MustCompile(`https?://[^\s<>"]+`)

// linkify cuts text into text and links, so that the page can make the links clickable; sentence
// punctuation after a link ("… https://example.com.") stays text.
func linkify(text string) []textSegment {
	var segments []textSegment
	last := 0
	for _, loc := range textLinkPattern.FindAllStringIndex(text, -1) {
		link := strings.TrimRight(text[loc[0]:loc[1]], ".,;:!?)")
		segments = append(segments, textSegment{Text: text[last:loc[0]]}, textSegment{Text: link, URL: link})
		last = loc[0] + len(link)
	}
	return append(segments, textSegment{Text: text[last:]})
}
