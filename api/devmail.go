package api

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
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

// mountDevMail adds /dev/mail: the log mailer's outbox as a person would see it, and the start
// page at / that links it. Its pages hold live reset links, so every path under it, and /,
// answers only a request from this machine (localRequest): any other gets the 404 of an
// unmounted route, whatever its method (methodNotAllowed keeps that for the methods the pages do
// not take), so that nobody else can even tell it is there.
func (s *server) mountDevMail(engine *gin.Engine, outbox *mail.Outbox) {
	s.devMail = true
	logo := ""
	if u, err := url.Parse(s.renderer.LogoURL()); err == nil && u.Host != "" {
		logo = " " + u.Scheme + "://" + strings.ToLower(u.Host) // checked by the renderer
	}
	csp := fmt.Sprintf(devMailCSP, logo)
	get(engine, "/dev/mail", s.handle(devMailOnly(func(c *gin.Context) error {
		return s.renderDevMail(c, csp, "list", map[string]any{"Title": "Mail", "Mails": outbox.List()})
	})))
	get(engine, "/dev/mail/:id", s.handle(devMailOnly(func(c *gin.Context) error {
		m, ok := outbox.Get(pathParam(c, "id"))
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
	})))
	get(engine, "/", s.handle(devMailOnly(s.startPage)))
}

// devMailOnly is a page of /dev/mail behind its gate: a request that is not local answers
// errNotFound, as the router does for a path it does not know.
func devMailOnly(page handlerFunc) handlerFunc {
	return func(c *gin.Context) error {
		if !localRequest(c.Request) {
			return errNotFound
		}
		return page(c)
	}
}

// isDevMailPath says r's path is one of /dev/mail's routes, or the start page's (the router has
// matched it to one already, for another method; see methodNotAllowed).
func isDevMailPath(r *http.Request) bool {
	path := r.URL.EscapedPath()
	return path == "/" || path == "/dev/mail" || strings.HasPrefix(path, "/dev/mail/")
}

// localRequest says r came from this machine and was addressed to it by a loopback name: its
// TCP peer (RemoteAddr, never a forwarded header, whatever TRUSTED_PROXIES says) is a loopback
// address, and its Host names a loopback host (LoopbackHost), with or without a port. The peer
// alone would not do: a page on another site that rebinds its DNS name to 127.0.0.1 makes the
// browser on this machine a loopback client, but its requests carry that site's Host.
func localRequest(r *http.Request) bool {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil || !peer.Addr().Unmap().IsLoopback() {
		return false
	}
	host := r.Host
	if h, port, err := net.SplitHostPort(r.Host); err == nil {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return false
		}
		host = h
	} else if inner, ok := strings.CutPrefix(r.Host, "["); ok {
		if host, ok = strings.CutSuffix(inner, "]"); !ok {
			return false
		}
	}
	return LoopbackHost(host)
}

// LoopbackHost says host (a name or an address, without port or brackets) is this machine's by
// definition: localhost or a name under it (RFC 6761), or a loopback address (127.0.0.0/8, ::1).
// /dev/mail is served only on a loopback APP_URL, and answers only requests that name such a
// host.
func LoopbackHost(host string) bool {
	host = strings.ToLower(host)
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	addr, err := netip.ParseAddr(host)
	return err == nil && addr.Unmap().IsLoopback()
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
