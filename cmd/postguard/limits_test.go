package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/internal/dbtest"
)

// limitsTestToken is LIMITS_API_TOKEN in these tests.
const limitsTestToken = "limits-api-token-of-the-process-tests"

// windowAwayFromItsEdges returns a window size, in whole hours, whose current fixed window
// (aligned on the epoch, as the limiter's are) has at least a quarter of it behind now and a
// quarter ahead: a test that counts in it does not straddle two windows, whenever it runs.
func windowAwayFromItsEdges(now time.Time) time.Duration {
	for hours := 2; ; hours++ {
		size := time.Duration(hours) * time.Hour
		if offset := time.Duration(now.UnixNano() % int64(size)); offset > size/4 && offset < 3*size/4 {
			return size
		}
	}
}

// TestAPI_LimitsExactAcrossProcesses: two `postguard api` processes of the built binary on one
// PostgreSQL database, a custom action with a key rule of 3, and 50 concurrent spends of one key
// spread over both: exactly 3 are admitted, whatever the interleaving, and the one counter holds
// 3 under an HMAC, not the key.
func TestAPI_LimitsExactAcrossProcesses(t *testing.T) {
	t.Parallel()

	schemaURL := dbtest.PostgresURL(t)
	window := windowAwayFromItsEdges(time.Now())
	env := map[string]string{
		"DATABASE_URL":         schemaURL,
		"APP_SECRET":           faultSecret,
		"LIMITS_API_TOKEN":     limitsTestToken,
		"RATE_LIMIT_LOGIN_KEY": fmt.Sprintf("3/%s", window),
		"RATE_LIMIT_LOGIN_IP":  fmt.Sprintf("1000/%s", window),
		"MAILER":               "none",
	}
	first := startProcess(t, "api", maps.Clone(env))
	second := startProcess(t, "api", maps.Clone(env))
	processes := []*process{first, second}
	require.Contains(t, first.Logs.String(), `"custom_rate_limit_actions":"login"`, "the start line names the custom actions")

	client := &http.Client{Timeout: time.Minute}
	spend := func(baseURL, body string) (int, string, error) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, baseURL+"/v1/limits/login", strings.NewReader(body))
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+limitsTestToken)
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("RateLimit-Policy"), nil
	}

	const spends = 50
	statuses := make([]int, spends)
	policies := make([]string, spends)
	errs := make([]error, spends)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range spends {
		body := fmt.Sprintf(`{"ip":"203.0.113.%d","key":"account-secret-42"}`, i)
		wg.Go(func() {
			<-start
			statuses[i], policies[i], errs[i] = spend(processes[i%2].URL, body)
		})
	}
	close(start)
	wg.Wait()

	counts := map[int]int{}
	for i := range spends {
		require.NoError(t, errs[i])
		counts[statuses[i]]++
		if statuses[i] == http.StatusTooManyRequests {
			require.Equal(t, fmt.Sprintf(`"login-key";q=3;w=%d`, int(window.Seconds())), policies[i])
		}
	}
	require.Equal(t, map[int]int{http.StatusOK: 3, http.StatusTooManyRequests: spends - 3}, counts, "first logs:\n%s\nsecond logs:\n%s", first.Logs, second.Logs)

	// One key counter at 3 (and one counter per IP), keyed by HMAC: no raw key or IP stored.
	conn, err := pgx.Connect(t.Context(), schemaURL)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(t.Context()))
	rows, err := conn.Query(t.Context(), `SELECT count, limit_count, concat_ws('|', encode(key_hash, 'escape'), encode(key_hash, 'hex')) FROM rate_limit_counters`)
	require.NoError(t, err)
	type counter struct {
		count, limit int64
		text         string
	}
	counters, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (counter, error) {
		var c counter
		err := row.Scan(&c.count, &c.limit, &c.text)
		return c, err
	})
	require.NoError(t, err)
	keyCounters := 0
	for _, c := range counters {
		require.NotContains(t, c.text, "account-secret")
		require.NotContains(t, c.text, "203.0.113")
		if c.limit == 3 {
			keyCounters++
			require.Equal(t, int64(3), c.count)
		}
	}
	require.Equal(t, 1, keyCounters)
	require.Len(t, counters, spends+1, "one counter per IP, and the key's")

	// The route is the limits API's only with the token: without it, 401; on a process
	// without LIMITS_API_TOKEN, 404.
	require.Equal(t, http.StatusUnauthorized, call(t, first.URL, http.MethodPost, "/v1/limits/login", `{"key":"k","ip":"192.0.2.1"}`).status)
}

func TestAPI_LimitsNotServedWithoutToken(t *testing.T) {
	t.Parallel()

	env := map[string]string{
		"DATABASE_URL":         dbtest.PostgresURL(t),
		"APP_SECRET":           faultSecret,
		"RATE_LIMIT_LOGIN_KEY": "3/15m",
		"MAILER":               "none",
	}
	api := startProcess(t, "api", env)
	a := call(t, api.URL, http.MethodPost, "/v1/limits/login", `{"key":"k","ip":"192.0.2.1"}`)
	require.Equal(t, http.StatusNotFound, a.status)
	require.Equal(t, "application/problem+json", a.contentType)
}
