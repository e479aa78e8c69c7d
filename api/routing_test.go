package api

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/email"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/jobs/mail"
)

// rawRequest sends a request line and headers exactly as written (what curl --path-as-is
// sends) to addr, and returns the answer with its body read.
func rawRequest(t *testing.T, addr, method, target string, header http.Header) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))

	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n", method, target)
	require.NoError(t, header.Write(&b))
	b.WriteString("\r\n")
	_, err = io.WriteString(conn, b.String())
	require.NoError(t, err)

	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(body)
}

// TestRouter_RawPath: routes match the path as the client sent it. An encoded slash is part of
// the segment it is in, and no dot segment (., .., literal or percent-encoded) or doubled slash
// is resolved into another route, so a proxy that keeps /v1/admin/ or /dev/mail private by
// matching raw paths cannot be walked around. The paths are sent as hand-built requests and as
// request lines written on a TCP connection by hand.
func TestRouter_RawPath(t *testing.T) {
	t.Parallel()

	outbox := mail.NewOutbox(0)
	outbox.Add("log_1", time.Now(), &mail.Message{To: "victim@example.com", Subject: "Reset your password", Kind: "password_reset_email"})
	riverUI := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = io.WriteString(w, "river ui stub at "+r.URL.Path)
	})
	bundle := newSQLiteBundle(t, &setupOpts{configFunc: func(config *Config) {
		adminConfig(config)
		config.DevMail = outbox
		config.RiverUI, config.RiverUIUsername, config.RiverUIPassword = riverUI, "admin", "s3cret pass"
	}})
	auth := http.Header{"Authorization": {"Bearer " + testAdminToken}}
	riverUIAuth := http.Header{"Authorization": {"Basic YWRtaW46czNjcmV0IHBhc3M="}} // admin:s3cret pass

	// Each would reach GET /v1/admin/suppressions or /dev/mail once decoded and cleaned.
	tricks := []string{
		"/v1/auth/..%2Fadmin/suppressions",
		"/v1/auth/..%2fadmin/suppressions",
		"/v1/auth/%2e%2e/admin/suppressions",
		"/v1/auth/%2E%2E%2Fadmin%2Fsuppressions",
		"/v1/auth/.%2e/admin/suppressions",
		"/v1/auth/../admin/suppressions",
		"/v1/auth/./../admin/suppressions",
		"/v1/admin/./suppressions",
		"/v1/admin/%2e/suppressions",
		"/v1/admin/suppressions/.",
		"/v1/admin/suppressions/%2e",
		"/v1/admin/suppressions/",
		"/v1//admin/suppressions",
		"//v1/admin/suppressions",
		"/v1/admin%2Fsuppressions",
		"/v1%2Fadmin%2Fsuppressions",
		"/x/..%2Fdev%2Fmail",
		"/x/..%2Fdev/mail",
		"/x/../dev/mail",
		"/x/%2e%2e/dev/mail",
		"/dev%2Fmail",
		"/dev/./mail",
		"/dev//mail",
		"//dev/mail",
		"/dev/mail/.",
		"/dev/mail/%2E",
		"/dev/mail/log_1/..",
		"/dev/mail/..%2Fmail",
		"/v1/admin/users/../suppressions",
	}
	// Each would hand River UI (behind its basic auth) a path out of its prefix.
	riverUITricks := []string{
		"/riverui/../v1/admin/suppressions",
		"/riverui/%2e%2e/dev/mail",
		"/riverui/api/./..",
	}
	requireRefused := func(t *testing.T, target string, status int, contentType, body string) {
		t.Helper()
		require.Contains(t, []int{http.StatusBadRequest, http.StatusNotFound}, status, "%s answered %d: %s", target, status, truncate(body, 300))
		require.Equal(t, problemContentType, contentType, target)
		require.NotContains(t, body, "suppressions\":", target)
		require.NotContains(t, body, "Reset your password", target)
		require.NotContains(t, body, "river ui stub", target)
	}

	t.Run("HandBuilt", func(t *testing.T) {
		t.Parallel()
		for _, target := range tricks {
			req := httptest.NewRequest(http.MethodGet, target, nil)
			req.RemoteAddr, req.Host = "127.0.0.1:50123", "localhost"
			req.Header = auth.Clone()
			require.Equal(t, target, req.URL.EscapedPath(), "the request keeps its raw path")
			rec := serve(t, bundle.router, req)
			requireRefused(t, target, rec.Code, rec.Header().Get("Content-Type"), rec.Body.String())
		}
		for _, target := range riverUITricks {
			req := httptest.NewRequest(http.MethodGet, target, nil)
			req.Header = riverUIAuth.Clone()
			rec := serve(t, bundle.router, req)
			requireRefused(t, target, rec.Code, rec.Header().Get("Content-Type"), rec.Body.String())
		}
	})

	t.Run("OnTheWire", func(t *testing.T) {
		t.Parallel()
		server := httptest.NewServer(bundle.router)
		t.Cleanup(server.Close)
		addr := strings.TrimPrefix(server.URL, "http://")

		// The routes themselves, for the comparison: the same client reaches them.
		resp, _ := rawRequest(t, addr, http.MethodGet, "/v1/admin/suppressions", auth)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		resp, _ = rawRequest(t, addr, http.MethodGet, "/dev/mail", nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		resp, _ = rawRequest(t, addr, http.MethodGet, "/riverui/api/jobs", riverUIAuth)
		require.Equal(t, http.StatusOK, resp.StatusCode)

		for _, target := range tricks {
			resp, body := rawRequest(t, addr, http.MethodGet, target, auth)
			requireRefused(t, target, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		for _, target := range riverUITricks {
			resp, body := rawRequest(t, addr, http.MethodGet, target, riverUIAuth)
			requireRefused(t, target, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	})
}

// TestAdmin_DeleteSuppressionEncodedSlash: an address with a slash in it (a/b@example.com is a
// valid address) registers, and, once suppressed, comes off the list through the admin API
// with its slash encoded, on the wire as in a hand-built request. An encoded slash is data.
func TestAdmin_DeleteSuppressionEncodedSlash(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		bundle := setup(t, newStore(t), &setupOpts{configFunc: adminConfig})
		server := httptest.NewServer(bundle.router)
		t.Cleanup(server.Close)
		addr := strings.TrimPrefix(server.URL, "http://")
		auth := http.Header{"Authorization": {"Bearer " + testAdminToken}}

		suppress := func(t *testing.T, address string) []byte {
			t.Helper()
			key := email.SuppressionKey(testSecret, address)
			now := time.Now()
			require.NoError(t, bundle.store.EmailSuppressionInsert(t.Context(), &db.EmailSuppressionInsertParams{
				AddressHash: key, Reason: email.ReasonComplained, EmailID: "re_1", SuppressedAt: now, Now: now,
			}))
			_, err := bundle.store.EmailSuppressionGet(t.Context(), key)
			require.NoError(t, err)
			return key
		}

		for _, tc := range []struct{ address, path string }{
			{"a/b@example.com", "/v1/admin/suppressions/a%2Fb@example.com"},
			{"c/d/e@example.com", "/v1/admin/suppressions/c%2fd%2Fe%40example.com"},
			// A plus stays a plus in a path (query unescaping would make it a space).
			{"ada+news@example.com", "/v1/admin/suppressions/ada+news@example.com"},
			{"bob+x@example.com", "/v1/admin/suppressions/bob%2Bx@example.com"},
		} {
			register(t, bundle.router, tc.address)

			key := suppress(t, tc.address)
			req := adminRequest(http.MethodDelete, tc.path)
			rec := serve(t, bundle.router, req)
			require.Equal(t, http.StatusNoContent, rec.Code, "%s: %s", tc.path, rec.Body.String())
			_, err := bundle.store.EmailSuppressionGet(t.Context(), key)
			require.ErrorIs(t, err, db.ErrNotFound, tc.path)

			key = suppress(t, tc.address)
			resp, body := rawRequest(t, addr, http.MethodDelete, tc.path, auth)
			require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s on the wire: %s", tc.path, body)
			_, err = bundle.store.EmailSuppressionGet(t.Context(), key)
			require.ErrorIs(t, err, db.ErrNotFound, tc.path)
		}

		// A slash that is not encoded separates segments: no route has that many.
		decodeProblem(t, serve(t, bundle.router, adminRequest(http.MethodDelete, "/v1/admin/suppressions/a/b@example.com")), http.StatusNotFound)
		// Dot segments name no address.
		for _, path := range []string{"/v1/admin/suppressions/..", "/v1/admin/suppressions/%2e%2E"} {
			rec := serve(t, bundle.router, adminRequest(http.MethodDelete, path))
			require.Contains(t, []int{http.StatusBadRequest, http.StatusNotFound}, rec.Code, path)
		}
	})
}
