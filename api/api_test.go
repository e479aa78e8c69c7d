package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/api/abuse/abuseprom"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
)

// The OpenAPI document, loaded and validated once.
var openAPI struct {
	once sync.Once
	doc  *openapi3.T
	err  error
}

func loadOpenAPI() (*openapi3.T, error) {
	openAPI.once.Do(func() {
		// kin-openapi has no decoder for HTML; the pages are validated as strings.
		openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.PlainBodyDecoder)
		loader := openapi3.NewLoader()
		doc, err := loader.LoadFromData(openAPIDocument)
		if err != nil {
			openAPI.err = err
			return
		}
		if err := doc.Validate(loader.Context); err != nil {
			openAPI.err = err
			return
		}
		openAPI.doc = doc
	})
	return openAPI.doc, openAPI.err
}

// serve is the one way tests send a request: through the real router, then every answer is
// checked against api/openapi.yaml (its status, headers and body must be documented), so the
// document cannot drift from the code. A request whose path or method the document does not
// know must be a documented 404 or 405 problem. It reports with t.Errorf, so goroutines may
// call it.
func serve(t testing.TB, router http.Handler, req *http.Request) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	router.ServeHTTP(rec, req)
	if err := checkOpenAPI(t, req, rec); err != nil {
		t.Errorf("answer of %s %s (%d) does not match openapi.yaml: %v\nbody: %s",
			req.Method, req.URL.Path, rec.Code, err, truncate(rec.Body.String(), 2000))
	}
	return rec
}

func checkOpenAPI(t testing.TB, req *http.Request, rec *httptest.ResponseRecorder) error {
	t.Helper()
	doc, err := loadOpenAPI()
	if err != nil {
		return fmt.Errorf("error loading openapi.yaml: %w", err)
	}
	if rec.Header().Get(requestIDHeader) == "" {
		return errString("no X-Request-Id header")
	}

	// A HEAD is answered as its GET, without a body.
	head := req.Method == http.MethodHead
	if head && rec.Body.Len() > 0 {
		return fmt.Errorf("HEAD answered a body of %d bytes", rec.Body.Len())
	}

	// The router answers 404 and 405 itself, for any path: those must be problems (the
	// document's NotFound answer), whatever the path.
	if rec.Code == http.StatusNotFound || rec.Code == http.StatusMethodNotAllowed {
		if ct := rec.Header().Get("Content-Type"); ct != problemContentType {
			return errString("404/405 content type " + ct)
		}
		if head {
			return nil
		}
		var body any
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			return err
		}
		return doc.Components.Schemas["Problem"].Value.VisitJSON(body, openapi3.EnableJSONSchema2020())
	}

	// The operation is found by exact path (kin-openapi's routers treat "/riverui" and
	// "/riverui/" as one), everything under /riverui/ being River UI's. The router matches the
	// escaped path, as sent; so does the lookup.
	path, params := matchPath(doc, req.URL.EscapedPath())
	item := doc.Paths.Value(path)
	if item == nil || item.GetOperation(req.Method) == nil {
		return fmt.Errorf("no operation %s %s in openapi.yaml", req.Method, path)
	}
	route := &routers.Route{Spec: doc, Path: path, PathItem: item, Method: req.Method, Operation: item.GetOperation(req.Method)}
	options := &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}
	if head {
		// kin-openapi checks nothing of a HEAD's answer: its status and headers are checked as
		// a GET's would be, against the HEAD operation, and its (empty) body is not.
		req = req.Clone(req.Context())
		req.Method = http.MethodGet
		options.ExcludeResponseBody = true
	}

	return openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request:    req,
			PathParams: params,
			Route:      route,
		},
		Status:  rec.Code,
		Header:  rec.Header(),
		Body:    io.NopCloser(bytes.NewReader(rec.Body.Bytes())),
		Options: options,
	})
}

// matchPath finds the document's path for a request's escaped path: the literal one when there
// is one, else the template whose segments match, each `{name}` one non-empty segment (an
// encoded slash is part of it), and River UI's `/riverui/{path}` everything under /riverui/. It
// returns the path as the document has it (the request's own when none matches) and the
// template's parameters, decoded.
func matchPath(doc *openapi3.T, path string) (string, map[string]string) {
	params := map[string]string{}
	if doc.Paths.Value(path) != nil {
		return path, params
	}
	if rest, ok := strings.CutPrefix(path, "/riverui/"); ok {
		params["path"] = rest
		return "/riverui/{path}", params
	}
	segments := strings.Split(path, "/")
	for template := range doc.Paths.Map() {
		want := strings.Split(template, "/")
		if len(want) != len(segments) || !strings.Contains(template, "{") {
			continue
		}
		matched := map[string]string{}
		for i, seg := range want {
			if name, ok := strings.CutPrefix(seg, "{"); ok && strings.HasSuffix(name, "}") && segments[i] != "" {
				value, err := url.PathUnescape(segments[i])
				if err != nil {
					value = segments[i]
				}
				matched[strings.TrimSuffix(name, "}")] = value
			} else if seg != segments[i] {
				matched = nil
				break
			}
		}
		if matched != nil {
			return template, matched
		}
	}
	return path, params
}

type errString string

func (e errString) Error() string { return string(e) }

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// testSecret is APP_SECRET in tests.
var testSecret = []byte("0123456789abcdef0123456789abcdef-test-secret")

// generousRules lets every test through but those about limits.
func generousRules() abuse.Rules {
	rules := abuse.DefaultRules()
	for _, rule := range rules.All() {
		rule.Limit, rule.Window = 1_000_000, time.Hour
		rules = rules.With(rule)
	}
	return rules
}

// countingConsumer counts the limiter's round trips to its counters, to show a request touched
// none or how many it took: calls those that spend (a request's chain of checks), peeks those
// that only read; windows counts the windows the calls asked to spend.
type countingConsumer struct {
	abuse.Consumer
	calls   atomic.Int64
	windows atomic.Int64
	peeks   atomic.Int64
}

func (c *countingConsumer) RateLimitCounterGetMany(ctx context.Context, params *db.RateLimitCounterWindowsParams) (*db.RateLimitCounterGetManyResult, error) {
	c.peeks.Add(1)
	return c.Consumer.RateLimitCounterGetMany(ctx, params)
}

func (c *countingConsumer) RateLimitCounterConsumeChain(ctx context.Context, params *db.RateLimitCounterChainParams) (*db.RateLimitCounterChainResult, error) {
	c.calls.Add(1)
	c.windows.Add(int64(len(params.Windows)))
	return c.Consumer.RateLimitCounterConsumeChain(ctx, params)
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type testBundle struct {
	store    riverstore.Store
	consumer *countingConsumer
	limiter  *abuse.Limiter
	router   *gin.Engine
	registry *prometheus.Registry
	logs     *syncBuffer
}

type setupOpts struct {
	rules      *abuse.Rules
	trusted    []netip.Prefix
	ipHeader   abuse.ClientIPHeader // CLIENT_IP_HEADER; "" is X-Forwarded-For
	limiterNow func() time.Time
	configFunc func(config *Config) // last changes to the config
}

// newLimiter is abuse.NewLimiter with testSecret, failing tb on an error.
func newLimiter(tb testing.TB, store abuse.Consumer, rules abuse.Rules, config *abuse.LimiterConfig) *abuse.Limiter {
	tb.Helper()
	limiter, err := abuse.NewLimiter(store, testSecret, rules, config)
	require.NoError(tb, err)
	return limiter
}

// setup builds a router on store (an insert-only River client is enough) with generous
// rate limits unless opts says otherwise, logging at debug level into bundle.logs.
func setup(t testing.TB, store riverstore.Store, opts *setupOpts) *testBundle {
	t.Helper()
	if opts == nil {
		opts = &setupOpts{}
	}
	rules := generousRules()
	if opts.rules != nil {
		rules = *opts.rules
	}
	consumer := &countingConsumer{Consumer: store}
	registry := prometheus.NewRegistry()
	metrics, err := abuseprom.Register(registry)
	require.NoError(t, err)
	limiter := newLimiter(t, consumer, rules, &abuse.LimiterConfig{NowFunc: opts.limiterNow, Metrics: metrics})
	logs := &syncBuffer{}
	config := &Config{
		Store:           store,
		Limiter:         limiter,
		IPResolver:      abuse.NewIPResolver(opts.trusted).WithHeader(opts.ipHeader),
		Secret:          testSecret,
		AppURL:          "http://localhost:8080",
		Logger:          slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registerer:      registry,
		Gatherer:        registry,
		HashConcurrency: 2,
	}
	if opts.configFunc != nil {
		opts.configFunc(config)
	}
	router, err := New(config)
	require.NoError(t, err)
	return &testBundle{store: store, consumer: consumer, limiter: limiter, router: router, registry: registry, logs: logs}
}

// newSQLiteBundle is setup on a fresh SQLite store, for tests that are about HTTP rather than
// about the database.
func newSQLiteBundle(t *testing.T, opts *setupOpts) *testBundle {
	t.Helper()
	return setup(t, dbtest.NewSQLite(t), opts)
}

// jsonRequest is a POST of body (a string, or a value marshalled to JSON) as application/json,
// from 192.0.2.1.
func jsonRequest(t testing.TB, path string, body any) *http.Request {
	t.Helper()
	var data []byte
	if s, ok := body.(string); ok {
		data = []byte(s)
	} else {
		var err error
		data, err = json.Marshal(body)
		require.NoError(t, err)
	}
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(data))
	req.Header.Set("Content-Type", mediaJSON)
	return req
}

// formRequest is a POST of fields, urlencoded.
func formRequest(path string, fields url.Values) *http.Request {
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(fields.Encode()))
	req.Header.Set("Content-Type", mediaURLEncoded)
	return req
}

// multipartRequest is a POST of fields as multipart/form-data.
func multipartRequest(t testing.TB, path string, fields url.Values) *http.Request {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	for k, vs := range fields {
		for _, v := range vs {
			require.NoError(t, w.WriteField(k, v))
		}
	}
	require.NoError(t, w.Close())
	req := httptest.NewRequest(http.MethodPost, path, &buf)
	req.Header.Set("Content-Type", w.FormDataContentType())
	return req
}

// decodeProblem checks rec is a problem of status and returns its members.
func decodeProblem(t testing.TB, rec *httptest.ResponseRecorder, status int) map[string]any {
	t.Helper()
	require.Equal(t, status, rec.Code, "body: %s", rec.Body.String())
	require.Equal(t, problemContentType, rec.Header().Get("Content-Type"))
	var problem map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &problem))
	require.Equal(t, "about:blank", problem["type"])
	require.Equal(t, http.StatusText(status), problem["title"])
	require.EqualValues(t, status, problem["status"])
	require.NotEmpty(t, problem["detail"])
	return problem
}

// uniqueEmail returns a fresh address.
func uniqueEmail(prefix string) string {
	return prefix + "-" + rand.Text()[:12] + "@example.com"
}

// register registers email with a valid password and returns the new user's id.
func register(t testing.TB, router http.Handler, email string) int64 {
	t.Helper()
	rec := serve(t, router, jsonRequest(t, "/v1/auth/register", map[string]string{"email": email, "password": "correct horse battery"}))
	require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body.String())
	var resp registerResponse
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &resp))
	return resp.ID
}

// jobCount counts the jobs of kind (all kinds when "") in store.
func jobCount(t testing.TB, store riverstore.Store, kind string) int {
	t.Helper()
	params := river.NewJobListParams().First(10_000)
	if kind != "" {
		params = params.Kinds(kind)
	}
	result, err := store.Jobs().JobList(context.Background(), params)
	require.NoError(t, err)
	return len(result.Jobs)
}
