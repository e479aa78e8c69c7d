package api

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/jobs/mail"
)

func TestServer_DevMail(t *testing.T) {
	t.Parallel()

	type devMailBundle struct {
		*testBundle
		outbox *mail.Outbox
	}
	setupDevMail := func(t *testing.T) *devMailBundle {
		t.Helper()
		outbox := mail.NewOutbox(0)
		bundle := newSQLiteBundle(t, &setupOpts{configFunc: func(config *Config) {
			config.AppName = "Acme"
			config.DevMail = outbox
		}})
		return &devMailBundle{testBundle: bundle, outbox: outbox}
	}
	sentAt := time.Date(2026, 3, 1, 12, 30, 0, 0, time.UTC)
	welcome := &mail.Message{
		To:             "ada@example.com",
		Subject:        "Welcome to Acme",
		HTML:           `<!DOCTYPE html><html><body><p class="x">Hi Ada, "welcome" &amp; more</p></body></html>`,
		Text:           "Hi Ada,\n\nGet started: http://localhost:8080.\nUnsubscribe: http://localhost:8080/v1/unsubscribe?token=1.abc\n",
		Headers:        map[string]string{"List-Unsubscribe-Post": "List-Unsubscribe=One-Click", "List-Unsubscribe": "<http://localhost:8080/v1/unsubscribe?token=1.abc>"},
		IdempotencyKey: "welcome_email:1:0123",
		Kind:           "welcome_email",
	}
	// local is a request from this machine to one of its names: the only kind /dev/mail answers.
	local := func(method, path string) *http.Request {
		req := httptest.NewRequest(method, path, nil)
		req.RemoteAddr, req.Host = "127.0.0.1:50123", "localhost:8080"
		return req
	}
	requireDevMailHeaders := func(t *testing.T, rec *httptest.ResponseRecorder) {
		t.Helper()
		require.Equal(t, "text/html; charset=utf-8", rec.Header().Get("Content-Type"))
		requireTokenPageHeaders(t, rec)
		require.Equal(t, "DENY", rec.Header().Get("X-Frame-Options"))
		require.Contains(t, rec.Header().Get("Content-Security-Policy"), "default-src 'none'")
	}

	t.Run("List", func(t *testing.T) {
		t.Parallel()
		bundle := setupDevMail(t)

		rec := serve(t, bundle.router, local(http.MethodGet, "/dev/mail"))
		require.Equal(t, http.StatusOK, rec.Code)
		requireDevMailHeaders(t, rec)
		require.Contains(t, rec.Body.String(), "No mail yet.")

		bundle.outbox.Add("log_1", sentAt, welcome)
		bundle.outbox.Add("log_2", sentAt.Add(time.Second), &mail.Message{To: "ada@example.com", Subject: "Verify your email address for Acme", Kind: "verification_email"})
		rec = serve(t, bundle.router, local(http.MethodGet, "/dev/mail"))
		require.Equal(t, http.StatusOK, rec.Code)
		requireDevMailHeaders(t, rec)
		body := rec.Body.String()
		require.Contains(t, body, "<title>Mail · Acme</title>")
		verify := strings.Index(body, `<a href="/dev/mail/log_2">Verify your email address for Acme</a>`)
		welcome := strings.Index(body, `<a href="/dev/mail/log_1">Welcome to Acme</a>`)
		require.Positive(t, verify)
		require.Greater(t, welcome, verify, "newest first")
		require.Contains(t, body, "<td>welcome_email</td><td>ada@example.com</td>")
		require.Contains(t, body, "2026-03-01 12:30:00")
	})

	t.Run("Mail", func(t *testing.T) {
		t.Parallel()
		bundle := setupDevMail(t)
		bundle.outbox.Add("log_1", sentAt, welcome)

		rec := serve(t, bundle.router, local(http.MethodGet, "/dev/mail/log_1"))
		require.Equal(t, http.StatusOK, rec.Code)
		requireDevMailHeaders(t, rec)
		body := rec.Body.String()
		require.Contains(t, body, "<h1>Welcome to Acme</h1>")
		// Headers, the mail's own among them, in order.
		require.Contains(t, body, "<tr><th>To</th><td>ada@example.com</td></tr>")
		unsubscribe := strings.Index(body, `<tr><th>List-Unsubscribe</th><td class="mono">&lt;http://localhost:8080/v1/unsubscribe?token=1.abc&gt;</td></tr>`)
		post := strings.Index(body, `<tr><th>List-Unsubscribe-Post</th><td class="mono">List-Unsubscribe=One-Click</td></tr>`)
		require.Positive(t, unsubscribe)
		require.Greater(t, post, unsubscribe)
		require.Contains(t, body, "welcome_email:1:0123")
		// The HTML part, whole, in a sandboxed frame: escaped once, as an attribute.
		require.Contains(t, body, `<iframe title="The mail's HTML part" sandbox srcdoc="&lt;!DOCTYPE html&gt;&lt;html&gt;&lt;body&gt;&lt;p class=&#34;x&#34;&gt;Hi Ada, &#34;welcome&#34; &amp;amp; more&lt;/p&gt;&lt;/body&gt;&lt;/html&gt;"></iframe>`)
		// The text part, its links clickable, the sentence's full stop left out of the link.
		require.Contains(t, body, `Get started: <a href="http://localhost:8080" rel="noreferrer">http://localhost:8080</a>.`)
		require.Contains(t, body, `<a href="http://localhost:8080/v1/unsubscribe?token=1.abc" rel="noreferrer">http://localhost:8080/v1/unsubscribe?token=1.abc</a>`)
	})

	t.Run("EscapesEverything", func(t *testing.T) {
		t.Parallel()
		bundle := setupDevMail(t)
		bundle.outbox.Add("log_1", sentAt, &mail.Message{
			To:      `"<script>"@example.com`,
			Subject: `<script>alert(1)</script>`,
			HTML:    `<script>alert(2)</script><img src="https://tracker.example/p.gif">`,
			Text:    `<script>alert(3)</script> javascript:alert(4)`,
			Headers: map[string]string{"X-<b>": "<b>"},
		})

		for _, path := range []string{"/dev/mail", "/dev/mail/log_1"} {
			rec := serve(t, bundle.router, local(http.MethodGet, path))
			require.Equal(t, http.StatusOK, rec.Code)
			require.NotContains(t, rec.Body.String(), "<script>", path)
			require.NotContains(t, rec.Body.String(), "<b>", path)
		}
	})

	t.Run("UnknownMail", func(t *testing.T) {
		t.Parallel()
		bundle := setupDevMail(t)

		rec := serve(t, bundle.router, local(http.MethodGet, "/dev/mail/log_nope"))
		decodeProblem(t, rec, http.StatusNotFound)
	})

	// /dev/mail answers a request whose TCP peer is a loopback address and whose Host names a
	// loopback host, and nothing else: another client (on the LAN, over IPv6, through a proxy
	// that says the client is local) and a loopback client that a DNS-rebinding page drives
	// (Host: evil.example) get the 404 of an unmounted route, on every path and method.
	t.Run("OnlyFromThisMachine", func(t *testing.T) {
		t.Parallel()
		outbox := mail.NewOutbox(0)
		bundle := newSQLiteBundle(t, &setupOpts{
			trusted:    []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("fd00::/8")},
			configFunc: func(config *Config) { config.DevMail = outbox },
		})
		unmounted := newSQLiteBundle(t, nil)
		outbox.Add("log_1", sentAt, &mail.Message{To: "victim@example.com", Subject: "Reset your password", Text: "http://localhost:8080/v1/auth/reset-password?token=live", Kind: "password_reset_email"})

		for _, tc := range []struct{ remote, host string }{
			{"127.0.0.1:50123", "localhost:8080"},
			{"127.0.0.1:50123", "localhost"},
			{"127.0.0.1:50123", "127.0.0.1:8080"},
			{"127.0.0.2:50123", "app.localhost:8080"},
			{"[::1]:50123", "[::1]:8080"},
			{"[::1]:50123", "[::1]"},
			{"[::ffff:127.0.0.1]:50123", "LOCALHOST:8080"},
		} {
			for _, path := range []string{"/dev/mail", "/dev/mail/log_1"} {
				req := httptest.NewRequest(http.MethodGet, path, nil)
				req.RemoteAddr, req.Host = tc.remote, tc.host
				rec := serve(t, bundle.router, req)
				require.Equal(t, http.StatusOK, rec.Code, "%s from %s, Host %s", path, tc.remote, tc.host)
				require.Contains(t, rec.Body.String(), "Reset your password")
			}
		}

		for _, tc := range []struct {
			name, remote, host, forwarded string
		}{
			{"LANPeer", "192.0.2.7:50123", "localhost:8080", ""},
			{"IPv6Peer", "[fd00::2]:50123", "localhost:8080", ""},
			{"IPv6PeerWithItsOwnHost", "[fd00::2]:50123", "[fd00::2]:8080", ""},
			{"TrustedProxySaysLoopback", "192.0.2.7:50123", "localhost:8080", "127.0.0.1"},
			{"TrustedIPv6ProxySaysLoopback", "[fd00::2]:50123", "localhost:8080", "::1"},
			{"DNSRebinding", "127.0.0.1:50123", "evil.example", ""},
			{"DNSRebindingWithPort", "127.0.0.1:50123", "evil.example:8080", ""},
			{"LookalikeHost", "127.0.0.1:50123", "localhost.evil.example:8080", ""},
			{"HostWithJunkPort", "127.0.0.1:50123", "localhost:8080@evil.example", ""},
			{"NoHost", "[::1]:50123", "", ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodDelete} {
					for _, path := range []string{"/dev/mail", "/dev/mail/log_1", "/dev/mail/log_nope"} {
						request := func() *http.Request {
							req := httptest.NewRequest(method, path, nil)
							req.RemoteAddr, req.Host = tc.remote, tc.host
							if tc.forwarded != "" {
								req.Header.Set("X-Forwarded-For", tc.forwarded)
							}
							return req
						}
						rec := serve(t, bundle.router, request())
						want := serve(t, unmounted.router, request())
						require.Equal(t, http.StatusNotFound, rec.Code, "%s %s from %s, Host %q", method, path, tc.remote, tc.host)
						require.Equal(t, want.Body.String(), rec.Body.String(), "%s %s answers as if unmounted", method, path)
						require.NotContains(t, rec.Body.String(), "Reset")
						require.Empty(t, rec.Header().Get("Allow"))
					}
				}
			})
		}
	})

	// Without an outbox (any mailer but the log mailer, or a public APP_URL) there is no
	// /dev/mail.
	t.Run("NotMounted", func(t *testing.T) {
		t.Parallel()
		bundle := newSQLiteBundle(t, nil)

		for _, path := range []string{"/dev/mail", "/dev/mail/log_1"} {
			rec := serve(t, bundle.router, local(http.MethodGet, path))
			decodeProblem(t, rec, http.StatusNotFound)
		}
	})
}

func TestLinkify(t *testing.T) {
	t.Parallel()

	require.Equal(t, []textSegment{
		{Text: "Go: "}, {Text: "https://a.example/x?y=1", URL: "https://a.example/x?y=1"}, {Text: ". Or ("},
		{Text: "http://b.example", URL: "http://b.example"}, {Text: ")\n"},
	}, linkify("Go: https://a.example/x?y=1. Or (http://b.example)\n"))
	require.Equal(t, []textSegment{{Text: "no links"}}, linkify("no links"))
}
