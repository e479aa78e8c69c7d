package api

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/jobs/mail"
)

// TestRouter_Head: every GET route also answers HEAD, with the GET's status and headers and no
// body (load balancers and uptime checks probe with HEAD), on each router: the public one with
// every optional route mounted, a worker's and the metrics listener's. It also holds on the
// wire, where net/http writes the HEAD's headers itself.
func TestRouter_Head(t *testing.T) {
	t.Parallel()

	outbox := mail.NewOutbox(0)
	outbox.Add("log_1", time.Now(), &mail.Message{To: "ada@example.com", Subject: "Welcome", HTML: "<p>Hi</p>", Text: "Hi", Kind: "welcome_email"})
	riverUI := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = io.WriteString(w, "river ui stub at "+r.URL.Path)
	})
	bundle := newSQLiteBundle(t, &setupOpts{configFunc: func(config *Config) {
		adminConfig(config)
		config.DevMail = outbox
		config.RiverUI, config.RiverUIUsername, config.RiverUIPassword = riverUI, "admin", "s3cret pass"
		config.LimitsToken = limitsToken
	}})
	user := insertUser(t, bundle.store, uniqueEmail("head"), false)
	health, err := HealthRouter(&Config{Store: bundle.store, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	metrics, err := MetricsRouter(&Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)

	// A request for each route's path, with what the route needs to answer 200.
	requestFor := func(method, route string) *http.Request {
		path := strings.NewReplacer(":id/messages", strconv.FormatInt(user.ID, 10)+"/messages", "/dev/mail/:id", "/dev/mail/log_1", "*path", "").Replace(route)
		switch route {
		case "/v1/auth/verify-email", "/v1/auth/reset-password", "/v1/unsubscribe":
			path += "?token=not-a-token" // the 400 page: the GET's status, whatever it is
		}
		req := httptest.NewRequest(method, path, nil)
		req.RemoteAddr, req.Host = "127.0.0.1:50123", "localhost:8080"
		switch {
		case strings.HasPrefix(route, "/v1/admin/"):
			req.Header.Set("Authorization", "Bearer "+testAdminToken)
		case strings.HasPrefix(route, "/riverui"):
			req.SetBasicAuth("admin", "s3cret pass")
		}
		return req
	}
	// The headers a GET and its HEAD share: all but the request's own id (and Content-Length,
	// which the HEAD carries and a GET leaves to net/http).
	shared := func(h http.Header) http.Header {
		h = h.Clone()
		h.Del(requestIDHeader)
		h.Del("Content-Length")
		return h
	}

	for name, router := range map[string]*gin.Engine{"Public": bundle.router, "Worker": health, "Metrics": metrics} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			heads := map[string]bool{}
			for _, route := range router.Routes() {
				if route.Method == http.MethodHead {
					heads[route.Path] = true
				}
			}
			var gets int
			for _, route := range router.Routes() {
				if route.Method != http.MethodGet {
					continue
				}
				gets++
				require.True(t, heads[route.Path], "HEAD %s", route.Path)

				get := serve(t, router, requestFor(http.MethodGet, route.Path))
				head := serve(t, router, requestFor(http.MethodHead, route.Path))
				require.Less(t, get.Code, 500, "GET %s: %s", route.Path, get.Body.String())
				require.Equal(t, get.Code, head.Code, "HEAD %s", route.Path)
				require.Equal(t, shared(get.Header()), shared(head.Header()), "HEAD %s", route.Path)
				require.Empty(t, head.Body.String(), "HEAD %s", route.Path)
				switch {
				case route.Path == "/metrics": // its body changes from one scrape to the next
					require.NotEmpty(t, head.Header().Get("Content-Length"))
				case route.Path == "/riverui": // http.Redirect writes its little page for a GET only
					require.Empty(t, head.Header().Get("Content-Length"))
				case get.Body.Len() > 0:
					require.Equal(t, strconv.Itoa(get.Body.Len()), head.Header().Get("Content-Length"), "HEAD %s", route.Path)
				}
			}
			require.Positive(t, gets)
		})
	}

	t.Run("OnTheWire", func(t *testing.T) {
		t.Parallel()
		server := httptest.NewServer(bundle.router)
		t.Cleanup(server.Close)
		for _, path := range []string{"/healthz", "/readyz", "/openapi.yaml", "/dev/mail"} {
			get, err := http.Get(server.URL + path)
			require.NoError(t, err)
			body, err := io.ReadAll(get.Body)
			require.NoError(t, err)
			get.Body.Close()

			head, err := http.Head(server.URL + path)
			require.NoError(t, err)
			headBody, err := io.ReadAll(head.Body)
			require.NoError(t, err)
			head.Body.Close()

			require.Equal(t, http.StatusOK, get.StatusCode, path)
			require.Equal(t, get.StatusCode, head.StatusCode, path)
			require.Empty(t, headBody, path)
			require.Equal(t, int64(len(body)), head.ContentLength, path)
			require.Equal(t, get.Header.Get("Content-Type"), head.Header.Get("Content-Type"), path)
		}
	})

	// A route that takes no GET takes no HEAD either.
	t.Run("NoGetNoHead", func(t *testing.T) {
		t.Parallel()
		rec := serve(t, bundle.router, httptest.NewRequest(http.MethodHead, "/v1/auth/register", nil))
		require.Equal(t, http.StatusMethodNotAllowed, rec.Code)
		require.Equal(t, "POST", rec.Header().Get("Allow"))
		require.Empty(t, rec.Body.String())
	})
}
