package api

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/jobs/mail/resendfake"
	"github.com/postguard/postguard/tokens"
)

func TestServer_Health(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		t.Run("Up", func(t *testing.T) {
			t.Parallel()
			bundle := setup(t, newStore(t), nil)

			rec := serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			require.Equal(t, http.StatusOK, rec.Code)
			require.JSONEq(t, `{"status":"ok"}`, rec.Body.String())

			rec = serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			require.Equal(t, http.StatusOK, rec.Code)
			require.JSONEq(t, `{"status":"ready"}`, rec.Body.String())
		})

		t.Run("DatabaseDown", func(t *testing.T) {
			t.Parallel()
			store := closedStore(t, newStore(t).Engine())
			for _, newRouter := range []func(*Config) (*gin.Engine, error){New, HealthRouter} {
				router, err := newRouter(&Config{
					Store:   store,
					Limiter: setup(t, newStore(t), nil).limiter, // any limiter: not used here
					Secret:  testSecret,
					Logger:  slog.New(slog.DiscardHandler),
				})
				require.NoError(t, err)

				rec := serve(t, router, httptest.NewRequest(http.MethodGet, "/readyz", nil))
				problem := decodeProblem(t, rec, http.StatusServiceUnavailable)
				require.Equal(t, "The database is unreachable or cannot be written.", problem["detail"])

				rec = serve(t, router, httptest.NewRequest(http.MethodGet, "/healthz", nil))
				require.Equal(t, http.StatusOK, rec.Code)
			}
		})
	})
}

// closedStore opens a store of engine and closes it, so its Ready fails.
func closedStore(t *testing.T, engine string) riverstore.Store {
	t.Helper()
	var store riverstore.Store
	if engine == "postgres" {
		store = dbtest.NewPostgres(t)
	} else {
		store = dbtest.NewSQLite(t)
	}
	require.NoError(t, store.Ready(t.Context()))
	require.NoError(t, store.Close())
	return store
}

func TestHealthRouter(t *testing.T) {
	t.Parallel()

	registry := prometheus.NewRegistry()
	router, err := HealthRouter(&Config{Store: dbtest.NewSQLite(t), Registerer: registry, Gatherer: registry, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)

	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		rec := serve(t, router, httptest.NewRequest(http.MethodGet, path, nil))
		require.Equal(t, http.StatusOK, rec.Code, path)
	}
	for _, path := range []string{"/openapi.yaml", "/v1/auth/verify-email?token=x"} {
		rec := serve(t, router, httptest.NewRequest(http.MethodGet, path, nil))
		decodeProblem(t, rec, http.StatusNotFound)
	}
	rec := serve(t, router, jsonRequest(t, "/v1/auth/register", `{}`))
	decodeProblem(t, rec, http.StatusNotFound)
}

func TestNew_Config(t *testing.T) {
	t.Parallel()

	store := dbtest.NewSQLite(t)
	limiter := newSQLiteBundle(t, nil).limiter

	// River UI's failed logins need the limiter's rule.
	noLoginRule := newLimiter(t, store, abuse.Rules{}.With(abuse.Rule{Action: abuse.ActionRegister, Scope: abuse.ScopeIP, Limit: 1, Window: time.Minute}), nil)
	for name, config := range map[string]*Config{
		"Nil":                 nil,
		"NoStore":             {Limiter: limiter, Secret: testSecret},
		"NoLimiter":           {Store: store, Secret: testSecret},
		"NoSecret":            {Store: store, Limiter: limiter},
		"ShortSecret":         {Store: store, Limiter: limiter, Secret: testSecret[:tokens.MinSecretLen-1]},
		"AppURLNotAbsolute":   {Store: store, Limiter: limiter, Secret: testSecret, AppURL: "example.com/app"},
		"RiverUIWithoutLimit": {Store: store, Limiter: noLoginRule, Secret: testSecret, RiverUI: http.NotFoundHandler(), RiverUIUsername: "u", RiverUIPassword: "p"},
	} {
		_, err := New(config)
		require.Error(t, err, name)
	}

	// Two routers on one registry (a registry shared with other components) work.
	registry := prometheus.NewRegistry()
	for range 2 {
		_, err := New(&Config{Store: store, Limiter: limiter, Secret: testSecret, Registerer: registry})
		require.NoError(t, err)
	}
}

// ginParam is a parameter of a Gin route's path, such as :id.
var ginParam = regexp.MustCompile(`:([A-Za-z_]+)`)

func TestServer_OpenAPI(t *testing.T) {
	t.Parallel()

	// Every optional route mounted.
	bundle := newSQLiteBundle(t, &setupOpts{configFunc: func(config *Config) {
		config.RiverUI, config.RiverUIUsername, config.RiverUIPassword = http.NotFoundHandler(), "u", "p"
		config.LimitsToken = limitsToken
		config.ResendWebhookSecret = resendfake.NewWebhookSecret()
		config.AdminToken = testAdminToken
		config.DevMail = mail.NewOutbox(0)
	}})

	t.Run("Served", func(t *testing.T) {
		t.Parallel()
		rec := serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/openapi.yaml", nil))
		require.Equal(t, http.StatusOK, rec.Code)
		require.Equal(t, "application/yaml", rec.Header().Get("Content-Type"))
		require.Equal(t, openAPIDocument, rec.Body.Bytes())
	})

	t.Run("EveryRouteDocumented", func(t *testing.T) {
		t.Parallel()
		doc, err := loadOpenAPI()
		require.NoError(t, err)
		require.Equal(t, "3.1.0", doc.OpenAPI)

		// The public router (River UI and /dev/mail mounted) and the metrics listener's together
		// serve what the document describes.
		metrics, err := MetricsRouter(&Config{Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		var routes, documented []string
		for _, route := range slices.Concat(bundle.router.Routes(), metrics.Routes()) {
			// Gin's parameters (:id) and wildcard (*path) are OpenAPI's templated ones.
			path := ginParam.ReplaceAllString(strings.Replace(route.Path, "/*path", "/{path}", 1), "{$1}")
			if (route.Method == http.MethodConnect || route.Method == http.MethodTrace) && route.Path == "/riverui/*path" {
				continue // Gin's Any; River UI takes neither, and OpenAPI 3.1 has no connect
			}
			routes = append(routes, route.Method+" "+path)
		}
		for path, item := range doc.Paths.Map() {
			for method := range item.Operations() {
				documented = append(documented, method+" "+path)
			}
		}
		slices.Sort(routes)
		slices.Sort(documented)
		require.Equal(t, documented, routes)
	})
}

func TestServer_RiverUI(t *testing.T) {
	t.Parallel()

	stub := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = io.WriteString(w, "river ui stub at "+r.URL.Path)
	})

	t.Run("NotMountedWhenUnset", func(t *testing.T) {
		t.Parallel()
		for _, creds := range [][2]string{{"", ""}, {"admin", ""}, {"", "secret"}} {
			bundle := newSQLiteBundle(t, &setupOpts{configFunc: func(config *Config) {
				config.RiverUI, config.RiverUIUsername, config.RiverUIPassword = stub, creds[0], creds[1]
			}})
			for _, path := range []string{"/riverui/", "/riverui"} {
				req := httptest.NewRequest(http.MethodGet, path, nil)
				req.SetBasicAuth(creds[0], creds[1])
				decodeProblem(t, serve(t, bundle.router, req), http.StatusNotFound)
			}
		}
	})

	t.Run("BasicAuth", func(t *testing.T) {
		t.Parallel()
		bundle := newSQLiteBundle(t, &setupOpts{configFunc: func(config *Config) {
			config.RiverUI, config.RiverUIUsername, config.RiverUIPassword = stub, "admin", "s3cret pass"
		}})

		for name, auth := range map[string]func(*http.Request){
			"None":          func(*http.Request) {},
			"WrongPassword": func(r *http.Request) { r.SetBasicAuth("admin", "s3cret pas") },
			"WrongUser":     func(r *http.Request) { r.SetBasicAuth("Admin", "s3cret pass") },
			"Swapped":       func(r *http.Request) { r.SetBasicAuth("s3cret pass", "admin") },
			"Bearer":        func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cret pass") },
		} {
			req := httptest.NewRequest(http.MethodGet, "/riverui/", nil)
			auth(req)
			rec := serve(t, bundle.router, req)
			decodeProblem(t, rec, http.StatusUnauthorized)
			require.Equal(t, `Basic realm="River UI"`, rec.Header().Get("WWW-Authenticate"), name)
			require.NotContains(t, rec.Body.String(), "river ui stub", name)
		}

		req := httptest.NewRequest(http.MethodGet, "/riverui/", nil)
		req.SetBasicAuth("admin", "s3cret pass")
		rec := serve(t, bundle.router, req)
		require.Equal(t, http.StatusOK, rec.Code)
		require.Equal(t, "river ui stub at /riverui/", rec.Body.String())

		// Deeper paths and other methods reach the handler too, behind the same auth.
		req = httptest.NewRequest(http.MethodPost, "/riverui/api/jobs/cancel", strings.NewReader(`{}`))
		req.SetBasicAuth("admin", "s3cret pass")
		rec = httptest.NewRecorder()
		bundle.router.ServeHTTP(rec, req) // River UI's own API: not in this contract
		require.Equal(t, "river ui stub at /riverui/api/jobs/cancel", rec.Body.String())
		req = httptest.NewRequest(http.MethodPost, "/riverui/api/jobs/cancel", strings.NewReader(`{}`))
		rec = httptest.NewRecorder()
		bundle.router.ServeHTTP(rec, req)
		require.Equal(t, http.StatusUnauthorized, rec.Code)

		rec = serve(t, bundle.router, httptest.NewRequest(http.MethodGet, "/riverui", nil))
		require.Equal(t, http.StatusMovedPermanently, rec.Code)
		require.Equal(t, "/riverui/", rec.Header().Get("Location"))
	})
}
