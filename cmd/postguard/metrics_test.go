package main

import (
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/cmd/internal/service"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/jobs/mail/resendfake"
)

// opsMetrics is one scrape of /metrics, parsed.
type opsMetrics struct {
	raw      string
	families map[string]*dto.MetricFamily
}

// opsScrape GETs /metrics and parses its Prometheus text.
func opsScrape(t *testing.T, baseURL string) *opsMetrics {
	t.Helper()

	resp, body := opsGet(t, baseURL+"/metrics", "", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Contains(t, resp.Header.Get("Content-Type"), "text/plain")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	require.NoError(t, err, body)
	return &opsMetrics{raw: body, families: families}
}

// value returns the value of the counter or gauge name whose labels include labels, and whether
// there is one.
func (m *opsMetrics) value(name string, labels map[string]string) (float64, bool) {
	family, ok := m.families[name]
	if !ok {
		return 0, false
	}
next:
	for _, metric := range family.GetMetric() {
		have := make(map[string]string, len(metric.GetLabel()))
		for _, pair := range metric.GetLabel() {
			have[pair.GetName()] = pair.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case metric.GetCounter() != nil:
			return metric.GetCounter().GetValue(), true
		case metric.GetGauge() != nil:
			return metric.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// count is value for a counter that may not exist yet (a label set never counted is 0).
func (m *opsMetrics) count(name string, labels map[string]string) float64 {
	v, _ := m.value(name, labels)
	return v
}

// labelValues lists every label value of the scrape's postguard_ metrics.
func (m *opsMetrics) labelValues() []string {
	var values []string
	for name, family := range m.families {
		if !strings.HasPrefix(name, "postguard_") {
			continue
		}
		for _, metric := range family.GetMetric() {
			for _, pair := range metric.GetLabel() {
				values = append(values, pair.GetName()+"="+pair.GetValue())
			}
		}
	}
	sort.Strings(values)
	return values
}

func TestServe_Metrics(t *testing.T) {
	t.Parallel()

	opsEngines(t, func(t *testing.T, env map[string]string) {
		fake := resendfake.New(t, &resendfake.Config{APIKey: "re_test_key"})
		env["MAILER"] = "resend"
		env["RESEND_API_KEY"] = "re_test_key"
		env["RESEND_FROM_EMAIL"] = "postguard@example.org"
		env["RESEND_BASE_URL"] = fake.URL()
		env["RESEND_MAX_RPS"] = "0"
		env["JOB_FETCH_COOLDOWN"] = "10ms"
		env["JOB_FETCH_POLL_INTERVAL"] = "50ms"
		env["RATE_LIMIT_REGISTER_IP"] = "1/1m" // the second registration from this IP is refused
		server := startServer(t, service.RoleServe, env)

		registerIPRefused := map[string]string{"action": "register", "scope": "ip", "outcome": "refused"}
		registerIPAllowed := map[string]string{"action": "register", "scope": "ip", "outcome": "allowed"}
		register201 := map[string]string{"route": "/v1/auth/register", "method": "POST", "status": "201"}
		register429 := map[string]string{"route": "/v1/auth/register", "method": "POST", "status": "429"}
		welcomeSent := map[string]string{"kind": "welcome_email", "outcome": "sent"}
		verificationSent := map[string]string{"kind": "verification_email", "outcome": "sent"}

		require.NotEmpty(t, server.MetricsURL, "serve has a metrics listener")
		requirePublicMetricsHidden(t, server.URL)
		before := opsScrape(t, server.MetricsURL)
		require.Zero(t, before.count("postguard_rate_limit_decisions_total", registerIPRefused))
		require.Zero(t, before.count("postguard_http_requests_total", register201))
		require.Zero(t, before.count("postguard_email_deliveries_total", welcomeSent))

		status, body := opsRegister(t, server.URL, "first.user@example.com")
		require.Equal(t, http.StatusCreated, status, body)
		status, body = opsRegister(t, server.URL, "second.user@example.com")
		require.Equal(t, http.StatusTooManyRequests, status, body)

		after := opsScrape(t, server.MetricsURL)
		require.InDelta(t, 1, after.count("postguard_rate_limit_decisions_total", registerIPAllowed), 0, after.raw)
		require.InDelta(t, 1, after.count("postguard_rate_limit_decisions_total", registerIPRefused), 0, after.raw)
		require.InDelta(t, 1, after.count("postguard_http_requests_total", register201), 0, after.raw)
		require.InDelta(t, 1, after.count("postguard_http_requests_total", register429), 0, after.raw)
		// /metrics counts itself under its route (the scrape before this one).
		require.GreaterOrEqual(t, after.count("postguard_http_requests_total",
			map[string]string{"route": "/metrics", "method": "GET", "status": "200"}), 1.0)

		// The worker delivers both mails of the registration through the (fake) Resend API.
		require.Eventually(t, func() bool { return len(fake.Deliveries()) == 2 }, 20*time.Second, 50*time.Millisecond,
			"mail not delivered; logs:\n%s", server.Logs.String())
		var delivered *opsMetrics
		require.Eventually(t, func() bool {
			delivered = opsScrape(t, server.MetricsURL)
			// The queue is drained too: the prune job, inserted when the client becomes leader,
			// may still wait its turn on a loaded machine when both mails are out.
			depth, _ := delivered.value("postguard_jobs", map[string]string{"state": "available"})
			return delivered.count("postguard_email_deliveries_total", welcomeSent) == 1 &&
				delivered.count("postguard_email_deliveries_total", verificationSent) == 1 && depth == 0
		}, 10*time.Second, 50*time.Millisecond, "delivery counters did not move, or the queue did not drain")
		for _, outcome := range []string{"retried", "snoozed", "cancelled", "discarded"} {
			require.Zero(t, delivered.count("postguard_email_deliveries_total", map[string]string{"outcome": outcome}), "%s\n%s", outcome, server.Logs.String())
		}

		// Queue depth: nothing left to send once both mails went out.
		depth, ok := delivered.value("postguard_jobs", map[string]string{"state": "available"})
		require.True(t, ok, "no postguard_jobs{state=available} gauge:\n%s", delivered.raw)
		require.Zero(t, depth)

		// No label carries a raw email or IP (never in counters).
		for _, label := range delivered.labelValues() {
			require.NotContains(t, label, "@", label)
			require.NotContains(t, label, "127.0.0.1", label)
		}
		require.NotContains(t, delivered.raw, "example.com")

		// A reset mail for a known address moves its delivery counter: on the metrics listener,
		// which is not the public one.
		resetSent := map[string]string{"kind": "password_reset_email", "outcome": "sent"}
		status, body = opsPost(t, server.URL+"/v1/auth/forgot-password", `{"email":"first.user@example.com"}`)
		require.Equal(t, http.StatusAccepted, status, body)
		require.Eventually(t, func() bool {
			return opsScrape(t, server.MetricsURL).count("postguard_email_deliveries_total", resetSent) == 1
		}, 20*time.Second, 50*time.Millisecond, "reset mail not counted; logs:\n%s", server.Logs.String())
		requirePublicMetricsHidden(t, server.URL)

		require.NoError(t, server.stop(t))
		_, err := http.Get(server.MetricsURL + "/metrics")
		require.Error(t, err, "the metrics listener stops with the server")
	})
}

// requirePublicMetricsHidden checks that the public listener has no /metrics.
func requirePublicMetricsHidden(t *testing.T, baseURL string) {
	t.Helper()
	resp, body := opsGet(t, baseURL+"/metrics", "", "", nil)
	require.Equal(t, http.StatusNotFound, resp.StatusCode, body)
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	require.NotContains(t, body, "postguard_")
}

// opsPost POSTs a JSON body and returns the answer's status and body.
func opsPost(t *testing.T, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func TestServe_MetricsListener(t *testing.T) {
	t.Parallel()

	sqliteEnv := func(t *testing.T) map[string]string {
		return map[string]string{"DATABASE_URL": "sqlite://" + filepath.Join(t.TempDir(), "postguard.db"), "MAILER": "none"}
	}

	t.Run("Off", func(t *testing.T) {
		t.Parallel()

		env := sqliteEnv(t)
		env["METRICS_ADDR"] = "off"
		server := startServer(t, service.RoleServe, env)
		require.Empty(t, server.MetricsURL, "METRICS_ADDR=off serves no metrics listener")
		requirePublicMetricsHidden(t, server.URL)
		require.NoError(t, server.stop(t))
	})

	t.Run("BusyAddressStopsStart", func(t *testing.T) {
		t.Parallel()

		busy, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer busy.Close()
		env := sqliteEnv(t)
		env["HTTP_ADDR"], env["METRICS_ADDR"] = "127.0.0.1:0", busy.Addr().String()
		_, err = runCommand(t, []string{"serve"}, env)
		require.ErrorContains(t, err, "METRICS_ADDR "+busy.Addr().String())
	})

	t.Run("WorkerServesMetricsOnHTTPAddr", func(t *testing.T) {
		t.Parallel()

		env := map[string]string{"DATABASE_URL": dbtest.PostgresURL(t), "APP_SECRET": strings.Repeat("s", 32), "MAILER": "none"}
		server := startServer(t, service.RoleWorker, env)
		require.Empty(t, server.MetricsURL, "a worker has no second listener")
		scrape := opsScrape(t, server.URL)
		_, ok := scrape.value("postguard_jobs", map[string]string{"state": "available"})
		require.True(t, ok, scrape.raw)
		require.NoError(t, server.stop(t))
	})
}
