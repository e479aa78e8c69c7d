// Package api is postguard's HTTP interface: a Gin router with the auth routes of docs/api.md
// (register, verify-email, resend-verification, forgot-password, reset-password, unsubscribe),
// Resend's delivery webhook (each mail's lifecycle and the suppression list), the admin API
// and the limits API (custom rate-limit actions) behind bearer tokens, health and metrics
// routes, the OpenAPI document, and River UI behind basic auth.
//
// Every error leaves through one place (writeError) as an RFC 9457 application/problem+json body,
// or as a small HTML page when the request came from one of the service's own HTML forms.
// Input problems answer:
//
//   - 400 when the body cannot be read as the route's request: malformed JSON, a JSON value of
//     the wrong type, an unknown field, trailing data, a malformed form; and for an invalid,
//     expired or used token;
//   - 422 when the body parses but a field is missing or invalid (email, password length, name);
//     the problem lists each field under "errors" (RFC 9457 §3.2 extension);
//   - 413 when the body exceeds 64 KiB, 415 when its content type is not one the route takes.
//
// None of them touches a rate-limit counter or writes anything.
package api

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"runtime"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/internal/uniform"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/tokens"
)

// MaxBodyBytes is the largest request body accepted; a larger one is answered 413.
const MaxBodyBytes = 64 << 10

// defaultAppURL is APP_URL's default, the base of the built-in pages' links when Config has
// neither a Renderer nor an AppURL.
const defaultAppURL = "http://localhost:8080"

// Config holds a router's dependencies. Store, Limiter and Secret are required by New;
// HealthRouter needs only Store, MetricsRouter nothing. Everything else has a default.
type Config struct {
	// Store is the database (either engine). Its River client must be configured (insert-only is
	// enough) before a request inserts a job.
	Store riverstore.Store

	// Limiter enforces the rate-limit rules of the auth routes, River UI's logins and the custom
	// actions of the limits API.
	Limiter *abuse.Limiter

	// LimitsToken is LIMITS_API_TOKEN, the bearer token of /v1/limits/{action} (at least
	// MinLimitsTokenLen bytes). "" serves no limits API: those routes answer 404.
	LimitsToken string

	// IPResolver finds a request's client IP for the limiter. nil means abuse.NewIPResolver(nil):
	// the TCP peer, no proxy trusted.
	IPResolver *abuse.IPResolver

	// Secret is APP_SECRET, at least tokens.MinSecretLen bytes; it checks unsubscribe tokens.
	Secret []byte

	// AppURL is APP_URL, the public base URL of the service. Its origin is one of the service's
	// own for River UI's cross-site check (behind a proxy that rewrites Host); the HTML pages use
	// relative form actions so that they work behind any path prefix.
	AppURL string

	// AppName is the product name (APP_NAME) in the title and heading of the service's HTML
	// pages, when Renderer is nil. Default mail.DefaultAppName.
	AppName string

	// Renderer renders the service's HTML pages (mail.Pages) in the locales that have templates:
	// the one the mail is rendered with, so that pages and mail share their templates directory,
	// locales and brand. nil means the built-in templates, branded AppName, on AppURL (or APP_URL's
	// default when AppURL is unset).
	Renderer *mail.Renderer

	// Logger receives the access log and error logs; slog.Default() when nil.
	Logger *slog.Logger

	// Registerer receives postguard_http_requests_total and
	// postguard_http_request_duration_seconds. Gatherer is what /metrics serves (HealthRouter
	// and MetricsRouter; New's router has no /metrics). When both are
	// nil a private registry serves as both; when only Registerer is set and it is also a
	// Gatherer (a *prometheus.Registry), it is served.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer

	// RiverUI is River UI's handler, created with the prefix "/riverui". It is mounted at
	// /riverui/ only when RiverUIUsername and RiverUIPassword are both set; nil means not mounted.
	RiverUI         http.Handler
	RiverUIUsername string
	RiverUIPassword string

	// DevMail is the log mailer's outbox (MAILER=log). When set, /dev/mail shows its mails as a
	// person would see them: a development tool, whose pages hold live tokens, so it answers
	// only a request whose TCP peer is a loopback address and whose Host names a loopback host
	// (LoopbackHost); any other gets 404, as when it is not mounted. nil means not mounted.
	DevMail *mail.Outbox

	// HashConcurrency bounds concurrent argon2id hashes (each takes 19 MiB), so a burst of
	// registrations cannot exhaust memory. Default runtime.GOMAXPROCS(0): the CPUs this process may use, a container quota included.
	HashConcurrency int

	// PasswordHasher hashes the passwords of register and reset-password; nil means the
	// service's argon2id hasher, bounded by HashConcurrency.
	PasswordHasher PasswordHasher

	// NowFunc returns the current time for the database writes; time.Now when nil.
	NowFunc func() time.Time

	// ResendWebhookSecret is RESEND_WEBHOOK_SECRET, the signing secret of the Resend webhook
	// ("whsec_…"). POST /v1/webhooks/resend is mounted only when it is set.
	ResendWebhookSecret string

	// AdminToken is ADMIN_TOKEN, the bearer token of the admin API, checked by the caller
	// (cmd/postguard: at least 32 bytes). /v1/admin is mounted only when it is set.
	AdminToken string

	// RequestTimeout bounds the work of each /v1 request, its database work above all: a request
	// still waiting on the database (or on the password hasher) when it passes is answered 503
	// with Retry-After, so an unreachable or stalled database never holds requests open.
	// DefaultRequestTimeout when zero.
	RequestTimeout time.Duration

	// TracerProvider, when set, traces every request but the probes and scrapes (/healthz,
	// /readyz, /metrics) in a span of its own, named by its route pattern, and each webhook event
	// in a span linked to its mail's trace (see traceRequest). nil installs no tracing at all.
	TracerProvider trace.TracerProvider

	// noUniformHold, for this package's benchmarks only, answers forgot-password and
	// resend-verification without their uniform hold, so that ns/op is their work.
	noUniformHold bool
}

// DefaultRequestTimeout is Config.RequestTimeout's default: far above the few milliseconds a
// request's database work takes, even with a queue at the password hasher, and below the HTTP
// server's write timeout (30 s), past which no answer could be written anyway.
const DefaultRequestTimeout = 10 * time.Second

// server is the state behind the handlers of one router.
type server struct {
	store   riverstore.Store
	limiter *abuse.Limiter
	ips     *abuse.IPResolver
	secret  []byte
	appName string
	// renderer renders the pages (New's router only).
	renderer *mail.Renderer
	logger   *slog.Logger
	now      func() time.Time
	hasher   PasswordHasher
	metrics  *httpMetrics

	// webhooks checks the signatures of Resend's webhooks; nil when RESEND_WEBHOOK_SECRET is
	// unset. events counts their events.
	webhooks *mail.ResendWebhookVerifier
	events   *prometheus.CounterVec

	// tracer starts the requests' and the webhook events' spans; a no-op one without
	// Config.TracerProvider.
	tracer trace.Tracer

	gatherer prometheus.Gatherer

	// requestTimeout is Config.RequestTimeout (see requestDeadline).
	requestTimeout time.Duration

	// devMail says /dev/mail is mounted (Config.DevMail).
	devMail bool

	// appOrigin is AppURL's origin (normalizeOrigin), "" when AppURL is unset.
	appOrigin string

	// uniformMin is the least time forgot-password and resend-verification take once the
	// limiter let them through, so the answer's timing does not tell a known email from an
	// unknown one (see uniformAnswer).
	uniformMin time.Duration
}

// New returns the public router of the `api` and `serve` roles: every route of docs/api.md,
// /openapi.yaml, and River UI when configured. /metrics is not one of them (404): its
// delivery counts by kind would tell anyone which addresses have accounts, so it is served by
// MetricsRouter on a listener of its own. New sets Gin's global mode to release.
func New(config *Config) (*gin.Engine, error) {
	if config == nil {
		return nil, errors.New("api: nil config")
	}
	if config.Store == nil {
		return nil, errors.New("api: Config.Store is required")
	}
	if config.Limiter == nil {
		return nil, errors.New("api: Config.Limiter is required")
	}
	if err := tokens.CheckSecret(config.Secret); err != nil {
		return nil, fmt.Errorf("api: Config.Secret (APP_SECRET): %w", err)
	}
	if config.LimitsToken != "" && len(config.LimitsToken) < MinLimitsTokenLen {
		return nil, fmt.Errorf("api: Config.LimitsToken must be at least %d bytes (LIMITS_API_TOKEN)", MinLimitsTokenLen)
	}
	s, engine, err := newServer(config)
	if err != nil {
		return nil, err
	}
	if config.AppURL != "" {
		u, err := url.Parse(config.AppURL)
		var origin string
		ok := err == nil
		if ok {
			origin, ok = normalizeOrigin(u.Scheme + "://" + u.Host)
		}
		if !ok {
			return nil, fmt.Errorf("api: Config.AppURL %q is not an absolute http(s) URL", config.AppURL)
		}
		s.appOrigin = origin
	}
	s.renderer = config.Renderer
	if s.renderer == nil {
		if s.renderer, err = mail.NewRenderer(&mail.RendererConfig{AppName: config.AppName, AppURL: cmp.Or(config.AppURL, defaultAppURL)}); err != nil {
			return nil, fmt.Errorf("api: the built-in pages: %w", err)
		}
	}
	s.appName = s.renderer.AppName()

	v1 := engine.Group("/v1", s.requestDeadline)
	v1.POST("/auth/register", s.handle(s.register))
	get(v1, "/auth/forgot-password", s.handle(s.forgotPasswordPage))
	v1.POST("/auth/forgot-password", s.handle(s.forgotPassword))
	v1.POST("/auth/resend-verification", s.handle(s.resendVerification))
	get(v1, "/auth/verify-email", s.handle(s.verifyEmailPage))
	v1.POST("/auth/verify-email", s.handle(s.verifyEmail))
	get(v1, "/auth/reset-password", s.handle(s.resetPasswordPage))
	v1.POST("/auth/reset-password", s.handle(s.resetPassword))
	get(v1, "/unsubscribe", s.handle(s.unsubscribePage))
	v1.POST("/unsubscribe", s.handle(s.unsubscribe))
	if config.ResendWebhookSecret != "" {
		if s.webhooks, err = mail.NewResendWebhookVerifier(config.ResendWebhookSecret); err != nil {
			return nil, fmt.Errorf("api: Config.ResendWebhookSecret: %w", err)
		}
		v1.POST("/webhooks/resend", s.handle(s.resendWebhook))
	}
	if config.AdminToken != "" {
		s.mountAdmin(v1, config.AdminToken)
	}
	if config.LimitsToken != "" {
		s.mountLimits(v1, config.LimitsToken)
	}

	s.mountHealth(engine)
	get(engine, "/openapi.yaml", serveOpenAPI)
	if config.DevMail != nil {
		s.mountDevMail(engine, config.DevMail)
	}

	switch {
	case config.RiverUI != nil && config.RiverUIUsername != "" && config.RiverUIPassword != "":
		if _, ok := config.Limiter.Rules().Get(abuse.ActionRiverUILogin, abuse.ScopeIP); !ok {
			return nil, fmt.Errorf("api: River UI needs the limiter's %s rule (per IP) to limit failed logins", abuse.ActionRiverUILogin)
		}
		s.mountRiverUI(engine, config.RiverUI, config.RiverUIUsername, config.RiverUIPassword)
	case config.RiverUI != nil:
		s.logger.WarnContext(context.Background(), "River UI not mounted: RIVERUI_USERNAME and RIVERUI_PASSWORD must both be set")
	}

	return engine, nil
}

// HealthRouter returns the router of the `worker` role, which serves only /healthz, /readyz and
// /metrics. Only config.Store is required.
func HealthRouter(config *Config) (*gin.Engine, error) {
	if config == nil {
		return nil, errors.New("api: nil config")
	}
	if config.Store == nil {
		return nil, errors.New("api: Config.Store is required")
	}
	s, engine, err := newServer(config)
	if err != nil {
		return nil, err
	}
	s.mountHealth(engine)
	s.mountMetrics(engine)
	return engine, nil
}

// MetricsRouter returns the router of the metrics listener (METRICS_ADDR) of the `api` and
// `serve` roles: /metrics and nothing else. It needs no store: a scrape never waits on the
// database.
func MetricsRouter(config *Config) (*gin.Engine, error) {
	if config == nil {
		return nil, errors.New("api: nil config")
	}
	s, engine, err := newServer(config)
	if err != nil {
		return nil, err
	}
	s.mountMetrics(engine)
	return engine, nil
}

// newServer checks the common config, and builds the server and an engine with its middleware
// (request id, access log and metrics, recover, body limit, security headers) and its 404/405
// problem answers.
func newServer(config *Config) (*server, *gin.Engine, error) {
	registerer, gatherer := config.Registerer, config.Gatherer
	if registerer == nil && gatherer == nil {
		registry := prometheus.NewRegistry()
		registerer, gatherer = registry, registry
	}
	if gatherer == nil {
		if g, ok := registerer.(prometheus.Gatherer); ok {
			gatherer = g
		} else {
			gatherer = prometheus.NewRegistry() // nothing to serve: say so with an empty page
		}
	}
	if registerer == nil {
		registerer = prometheus.NewRegistry() // counted, but only the given Gatherer is served
	}
	metrics, err := newHTTPMetrics(registerer)
	if err != nil {
		return nil, nil, err
	}
	events, err := registerOrReuse(registerer, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "postguard_email_events_total",
		Help: "Resend webhook events by type (the followed email.* types, else other) and outcome (applied, out_of_order, replayed, unknown_email, unknown_type).",
	}, []string{"type", "outcome"}))
	if err != nil {
		return nil, nil, err
	}

	s := &server{
		store:      config.Store,
		limiter:    config.Limiter,
		ips:        config.IPResolver,
		secret:     config.Secret,
		appName:    cmp.Or(config.AppName, mail.DefaultAppName),
		logger:     cmp.Or(config.Logger, slog.Default()),
		now:        config.NowFunc,
		hasher:     config.PasswordHasher,
		metrics:    metrics,
		events:     events,
		gatherer:   gatherer,
		uniformMin: uniform.AnswerMin,

		requestTimeout: cmp.Or(config.RequestTimeout, DefaultRequestTimeout),
	}
	if s.ips == nil {
		s.ips = abuse.NewIPResolver(nil)
	}
	if config.noUniformHold {
		s.uniformMin = 0
	}
	if s.hasher == nil {
		s.hasher = newPasswordHasher(cmp.Or(config.HashConcurrency, runtime.GOMAXPROCS(0)))
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.tracer = noop.NewTracerProvider().Tracer(tracerScope)
	if config.TracerProvider != nil {
		s.tracer = config.TracerProvider.Tracer(tracerScope)
	}

	gin.SetMode(gin.ReleaseMode)
	engine := gin.New() // never gin.Default(): its logger prints raw query strings (tokens)
	// Client IPs come only from abuse.IPResolver; Gin must not believe forwarding headers.
	if err := engine.SetTrustedProxies(nil); err != nil {
		return nil, nil, fmt.Errorf("error configuring trusted proxies: %w", err)
	}
	engine.ForwardedByClientIP = false
	// Routes match the path as the client sent it (its escaped form), never a decoded or
	// cleaned one: a proxy in front that keeps /v1/admin/ or /dev/mail private by matching raw
	// paths sees the path the router sees. An encoded slash stays inside its segment, as data
	// (a/b@example.com is an address), and no dot segment or doubled slash is resolved into
	// another route (refuseDotSegments). Parameters are decoded by pathParam, since Gin's
	// unescaping is a query's and would read "+" as a space.
	engine.UseEscapedPath = true
	engine.UnescapePathValues = false
	engine.RemoveExtraSlash = false
	// A redirect would turn a one-click unsubscribe POST into a GET, and a redirect answer is
	// not part of the contract: a path that does not match is a 404 problem.
	engine.RedirectTrailingSlash = false
	engine.RedirectFixedPath = false
	engine.HandleMethodNotAllowed = true

	if config.TracerProvider != nil {
		engine.Use(s.traceRequest) // first, so that its span holds the whole request
	}
	engine.Use(
		s.requestID,
		s.observe,
		s.recoverer,
		headWithoutBody,
		s.refuseDotSegments,
		s.limitBody,
		securityHeaders,
	)
	engine.NoRoute(s.handle(func(*gin.Context) error { return errNotFound }))
	engine.NoMethod(s.handle(s.methodNotAllowed))

	return s, engine, nil
}

// methodNotAllowed answers a request whose path has routes of other methods only: 405, with
// the Allow header the router set; but a request for /dev/mail that is not local gets the 404
// of an unknown path, as every other method does (see mountDevMail).
func (s *server) methodNotAllowed(c *gin.Context) error {
	if s.devMail && isDevMailPath(c.Request) && !localRequest(c.Request) {
		c.Writer.Header().Del("Allow")
		return errNotFound
	}
	return errMethodNotAllowed
}

// get adds a GET route and its HEAD twin, which answers what the GET would, without the body
// (headWithoutBody): load balancers and uptime checks probe with HEAD.
func get(routes gin.IRoutes, path string, handlers ...gin.HandlerFunc) {
	routes.Match([]string{http.MethodGet, http.MethodHead}, path, handlers...)
}

// mountHealth adds /healthz and /readyz.
func (s *server) mountHealth(engine *gin.Engine) {
	get(engine, "/healthz", s.healthz)
	get(engine, "/readyz", s.handle(s.readyz))
}

// mountMetrics adds /metrics.
func (s *server) mountMetrics(engine *gin.Engine) {
	metrics := promhttp.HandlerFor(s.gatherer, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(s.logger.Handler(), slog.LevelError),
		ErrorHandling: promhttp.ContinueOnError,
	})
	get(engine, "/metrics", gin.WrapH(metrics))
}
