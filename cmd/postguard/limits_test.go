package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/api"
	"github.com/postguard/postguard/cmd/internal/service"
	"github.com/postguard/postguard/internal/bursttest"
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

// limitsClient calls the limits API of postguard processes as a host app would.
type limitsClient struct {
	t      *testing.T
	client *http.Client
}

// do sends body (marshalled to JSON) to path of baseURL and returns the status and the body.
func (c *limitsClient) do(baseURL, method, path string, body any) (int, []byte, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequestWithContext(c.t.Context(), method, baseURL+path, bytes.NewReader(data))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+limitsTestToken)
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	return resp.StatusCode, answer, err
}

// login is README's login over the limits API of baseURL: spend first (a 429 checks nothing),
// check the password through check, and on the right one clear the account, refund the IP and
// issue a device. It returns the login's status and, on a success, the new device.
func (c *limitsClient) login(baseURL, ip, key, password, right, device string, check func(string)) (int, string, error) {
	status, _, err := c.do(baseURL, http.MethodPost, "/v1/limits/login", map[string]string{"ip": ip, "key": key, "device": device})
	if err != nil || status != http.StatusOK {
		return status, "", err
	}
	if check != nil {
		check(password)
	}
	if password != right {
		return http.StatusUnauthorized, "", nil
	}
	if status, _, err := c.do(baseURL, http.MethodDelete, "/v1/limits/login", map[string]string{"key": key, "device": device}); err != nil || status != http.StatusNoContent {
		return status, "", errors.Join(err, fmt.Errorf("clear answered %d", status))
	}
	if status, _, err := c.do(baseURL, http.MethodPost, "/v1/limits/login/refund", map[string]string{"ip": ip}); err != nil || status != http.StatusNoContent {
		return status, "", errors.Join(err, fmt.Errorf("refund answered %d", status))
	}
	status, body, err := c.do(baseURL, http.MethodPost, "/v1/limits/login/devices", map[string]string{"key": key})
	if err != nil || status != http.StatusCreated {
		return status, "", errors.Join(err, fmt.Errorf("issuing a device answered %d", status))
	}
	var issued struct{ Device string }
	if err := json.Unmarshal(body, &issued); err != nil {
		return 0, "", err
	}
	return http.StatusOK, issued.Device, nil
}

// TestAPI_LoginAcrossProcesses: two `postguard api` processes of the built binary on one
// PostgreSQL database, a login action of 5 per account, and README's login pattern run by a host
// against both at once. A burst of 200 guesses at one account, spread over both processes, checks
// at most 5 passwords and never finds the right one (at position 137); the owner's device, issued
// by one process, logs in through the other while the account is locked, until one process
// revokes it: then the other treats it as no device at once.
func TestAPI_LoginAcrossProcesses(t *testing.T) {
	t.Parallel()

	window := windowAwayFromItsEdges(time.Now())
	env := map[string]string{
		"DATABASE_URL":         dbtest.PostgresURL(t),
		"APP_SECRET":           faultSecret,
		"LIMITS_API_TOKEN":     limitsTestToken,
		"RATE_LIMIT_LOGIN_KEY": fmt.Sprintf("5/%s", window),
		"RATE_LIMIT_LOGIN_IP":  fmt.Sprintf("1000/%s", window),
		"MAILER":               "none",
	}
	processes := []*process{startProcess(t, "api", maps.Clone(env)), startProcess(t, "api", maps.Clone(env))}
	host := &limitsClient{t: t, client: &http.Client{Timeout: time.Minute}}

	t.Run("Burst", func(t *testing.T) {
		checker := bursttest.NewChecker()
		burst := bursttest.Burst{Attempts: 200, Right: 137, Limit: 5}
		errs := make([]error, burst.Attempts)
		result := checker.Run(t, burst, func(i int, password string) int {
			status, _, err := host.login(processes[i%2].URL, fmt.Sprintf("203.0.%d.%d", i/250, i%250+1), "account-burst", password, bursttest.Password(burst.Right), "", checker.Check)
			errs[i] = err
			return status
		})
		for _, err := range errs {
			require.NoError(t, err)
		}
		require.LessOrEqual(t, result.Checks, burst.Limit, "passwords checked")
		require.False(t, result.Found, "the right password was found")
		require.Equal(t, map[int]int{http.StatusUnauthorized: burst.Limit, http.StatusTooManyRequests: burst.Attempts - burst.Limit}, result.Counts())
	})

	t.Run("DevicesAcrossProcesses", func(t *testing.T) {
		first, second := processes[0].URL, processes[1].URL
		status, device, err := host.login(first, "198.51.100.7", "account-owner", "right", "right", "", nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status)
		for i := range 20 {
			status, _, err := host.login(processes[i%2].URL, fmt.Sprintf("203.0.113.%d", i), "account-owner", "guess", "right", "", nil)
			require.NoError(t, err)
			require.Equal(t, i < 5, status == http.StatusUnauthorized, "guess %d answered %d", i, status)
		}
		status, _, err = host.login(second, "198.51.100.8", "account-owner", "right", "right", "", nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusTooManyRequests, status, "an untrusted client is refused")

		// The device the first process issued stands on the second.
		status, _, err = host.do(second, http.MethodPost, "/v1/limits/login?peek=true", map[string]string{"ip": "198.51.100.7", "key": "account-owner", "device": device})
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status)

		// Revoked by the second, refused by the first at once.
		status, _, err = host.do(second, http.MethodDelete, "/v1/limits/login/devices", map[string]string{"key": "account-owner"})
		require.NoError(t, err)
		require.Equal(t, http.StatusNoContent, status)
		status, _, err = host.login(first, "198.51.100.7", "account-owner", "right", "right", device, nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusTooManyRequests, status, "a revoked device is no device")
	})

	// The counters and revocations hold HMACs only.
	conn, err := pgx.Connect(t.Context(), env["DATABASE_URL"])
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(t.Context()))
	var text string
	require.NoError(t, conn.QueryRow(t.Context(), `
		SELECT concat_ws('|', (SELECT string_agg(encode(key_hash, 'escape'), '|') FROM rate_limit_counters),
		                      (SELECT string_agg(encode(key_hash, 'escape'), '|') FROM rate_limit_device_revocations))`).Scan(&text))
	require.NotEmpty(t, text)
	require.NotContains(t, text, "account-")
	require.NotContains(t, text, "203.0.")
}

// TestServe_DeviceTokenTTL: DEVICE_TOKEN_TTL is the life the limiter gives trusted devices (a
// device cookie's Max-Age).
func TestServe_DeviceTokenTTL(t *testing.T) {
	t.Parallel()

	ttls := make(chan time.Duration, 1)
	startServerCommand(t, &serverCommand{
		role:          service.RoleServe,
		apiConfigFunc: func(config *api.Config) { ttls <- config.Limiter.DeviceTokenTTL() },
	}, map[string]string{
		"DATABASE_URL":     "sqlite://" + filepath.Join(t.TempDir(), "postguard.db"),
		"MAILER":           "none",
		"DEVICE_TOKEN_TTL": "720h",
	})
	require.Equal(t, 720*time.Hour, <-ttls)
}
