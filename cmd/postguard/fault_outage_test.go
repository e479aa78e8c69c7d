package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/cmd/internal/service"
	"github.com/postguard/postguard/internal/dbtest"
)

// answer is what the outage tests read of an HTTP answer.
type answer struct {
	status      int
	contentType string
	retryAfter  string
	body        string
}

// call sends method path (with a JSON body when body is not empty) to baseURL.
func call(t *testing.T, baseURL, method, path, body string) answer {
	t.Helper()

	req, err := http.NewRequestWithContext(t.Context(), method, baseURL+path, strings.NewReader(body))
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{
		status:      resp.StatusCode,
		contentType: resp.Header.Get("Content-Type"),
		retryAfter:  resp.Header.Get("Retry-After"),
		body:        string(data),
	}
}

// registerBody is a registration of a fresh email.
func registerBody(prefix string) string {
	return fmt.Sprintf(`{"email":"%s-%d@example.com","password":"correct horse battery"}`, prefix, time.Now().UnixNano())
}

// requireOutage checks a is the answer to an outage: 503 problem+json with Retry-After, and no
// request so far was answered as an internal error (500).
func requireOutage(t *testing.T, a answer, logs fmt.Stringer) {
	t.Helper()

	require.Equal(t, http.StatusServiceUnavailable, a.status, "body: %s\nlog errors:\n%s", a.body, grepLines(logs.String(), `"level":"ERROR"`))
	require.NotContains(t, logs.String(), `"msg":"internal error"`)
	require.Equal(t, "application/problem+json", a.contentType)
	require.Equal(t, "5", a.retryAfter, "a 503 says when to retry")
	var problem struct{ Status int }
	require.NoError(t, json.Unmarshal([]byte(a.body), &problem))
	require.Equal(t, http.StatusServiceUnavailable, problem.Status)
}

// startOutageAPI runs `postguard api` on a database of the test's own (so that taking it down
// disturbs no other test), with generous limits and a request deadline long enough that no
// answer below comes from it: each 503 is an error the store classified.
func startOutageAPI(t *testing.T) (*dbtest.PostgresDatabase, *runningServer) {
	t.Helper()

	database := dbtest.NewPostgresDatabase(t)
	server := startServerCommand(t, &serverCommand{
		role: service.RoleAPI,
	}, map[string]string{
		"DATABASE_URL":              database.URL,
		"APP_SECRET":                faultSecret,
		"LOG_FORMAT":                "json",
		"RATE_LIMIT_REGISTER_IP":    "1000000/1h",
		"RATE_LIMIT_REGISTER_EMAIL": "1000000/1h",
	})
	// Connections in both pools, idle now: the case where a server-side close goes unseen
	// until the next statement.
	require.Equal(t, http.StatusCreated, call(t, server.URL, http.MethodPost, "/v1/auth/register", registerBody("warm")).status)
	require.Equal(t, http.StatusOK, call(t, server.URL, http.MethodGet, "/readyz", "").status)
	return database, server
}

// TestServe_PostgresRefusesConnections: the database refuses new connections (ALLOW_CONNECTIONS
// false: SQLSTATE 55000 at connect, as during maintenance or a failover) and the connections the
// API had are gone. Every route that needs the database answers 503 with Retry-After, not 500,
// and /readyz 503; once connections are allowed again, the same process serves.
func TestServe_PostgresRefusesConnections(t *testing.T) {
	t.Parallel()

	database, server := startOutageAPI(t)

	database.AllowConnections(t, false)
	database.TerminateBackends(t)

	requireOutage(t, call(t, server.URL, http.MethodPost, "/v1/auth/register", registerBody("refused")), server.Logs)
	requireOutage(t, call(t, server.URL, http.MethodPost, "/v1/auth/forgot-password", `{"email":"refused@example.com"}`), server.Logs)
	requireOutage(t, call(t, server.URL, http.MethodGet, "/readyz", ""), server.Logs)
	require.Equal(t, http.StatusOK, call(t, server.URL, http.MethodGet, "/healthz", "").status)
	require.Contains(t, server.Logs.String(), "SQLSTATE 55000")
	require.NotContains(t, server.Logs.String(), `"level":"ERROR"`)

	database.AllowConnections(t, true)
	require.Equal(t, http.StatusCreated, call(t, server.URL, http.MethodPost, "/v1/auth/register", registerBody("allowed")).status)
	require.Equal(t, http.StatusOK, call(t, server.URL, http.MethodGet, "/readyz", "").status)
}

// TestServe_PostgresReadOnly: the database turns read-only for new sessions
// (default_transaction_read_only, as a primary demoted after a failover) and the API's
// connections are replaced. Writes answer 503 with Retry-After (SQLSTATE 25006), not 500, and
// /readyz says 503 though the database answers every read; back to read-write, the same process
// serves.
func TestServe_PostgresReadOnly(t *testing.T) {
	t.Parallel()

	database, server := startOutageAPI(t)

	database.SetReadOnly(t, true)
	database.TerminateBackends(t)

	requireOutage(t, call(t, server.URL, http.MethodPost, "/v1/auth/register", registerBody("readonly")), server.Logs)
	requireOutage(t, call(t, server.URL, http.MethodGet, "/readyz", ""), server.Logs)
	require.Contains(t, server.Logs.String(), "SQLSTATE 25006")
	require.NotContains(t, server.Logs.String(), `"level":"ERROR"`)

	database.SetReadOnly(t, false)
	database.TerminateBackends(t)
	require.Equal(t, http.StatusCreated, call(t, server.URL, http.MethodPost, "/v1/auth/register", registerBody("readwrite")).status)
	require.Equal(t, http.StatusOK, call(t, server.URL, http.MethodGet, "/readyz", "").status)
}

// TestServe_PostgresBackendsTerminated: every backend of the database is terminated (what a
// restart of PostgreSQL, or a pooler recycling its connections, does to the API's pooled
// connections) right before requests arrive. The server closed those connections before the
// requests were sent, so they ran nothing: the requests succeed on fresh connections instead of
// answering 503, registrations concurrent with each other included, and /readyz agrees.
func TestServe_PostgresBackendsTerminated(t *testing.T) {
	t.Parallel()

	const concurrent = 6 // more than either pool holds, so every pooled connection is used
	database, server := startOutageAPI(t)

	registerAll := func(prefix string) []answer {
		answers := make([]answer, concurrent)
		var wg sync.WaitGroup
		for i := range concurrent {
			wg.Go(func() {
				answers[i] = call(t, server.URL, http.MethodPost, "/v1/auth/register", registerBody(fmt.Sprintf("%s-%d", prefix, i)))
			})
		}
		wg.Wait()
		return answers
	}
	for _, a := range registerAll("warm") {
		require.Equal(t, http.StatusCreated, a.status, "body: %s", a.body)
	}

	for round := range 3 {
		database.TerminateBackends(t)
		for _, a := range registerAll(fmt.Sprintf("after-%d", round)) {
			require.Equal(t, http.StatusCreated, a.status, "round %d: body: %s\nlogs:\n%s", round, a.body, server.Logs)
		}
		database.TerminateBackends(t)
		require.Equal(t, http.StatusOK, call(t, server.URL, http.MethodGet, "/readyz", "").status)
		database.TerminateBackends(t)
		require.Equal(t, http.StatusAccepted, call(t, server.URL, http.MethodPost, "/v1/auth/forgot-password", `{"email":"nobody@example.com"}`).status)
	}
	require.NotContains(t, server.Logs.String(), `"level":"ERROR"`)
}
