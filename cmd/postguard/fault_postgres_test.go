package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/api"
	"github.com/postguard/postguard/cmd/internal/service"
	"github.com/postguard/postguard/internal/dbtest"
)

// startServerCommand is startServer for a command the test builds itself (to set its test
// hooks).
func startServerCommand(t *testing.T, cmd *serverCommand, env map[string]string) *runningServer {
	t.Helper()

	env["HTTP_ADDR"] = "127.0.0.1:0"
	env["METRICS_ADDR"] = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan net.Addr, 1)
	cmd.readyFunc = func(addr net.Addr) { ready <- addr }
	s := &runningServer{Logs: &syncBuffer{}, cancel: cancel, exited: make(chan struct{})}
	go func() {
		defer close(s.exited)
		s.err = cmd.Run(ctx, &commandEnv{Environ: envFunc(env), Stdout: io.Discard, Stderr: s.Logs})
	}()
	t.Cleanup(func() {
		cancel()
		<-s.exited
	})

	select {
	case addr := <-ready:
		s.URL = "http://" + addr.String()
		return s
	case <-s.exited:
		t.Fatalf("server exited before serving: %v\nlogs:\n%s", s.err, s.Logs)
	case <-time.After(60 * time.Second):
		t.Fatalf("server did not start within 60s\nlogs:\n%s", s.Logs)
	}
	return nil
}

// loadResult is one request of a load generator.
type loadResult struct {
	start, end  time.Time
	status      int
	contentType string
	retryAfter  string
	body        []byte
	err         error
	email       string
}

// registerLoad keeps `workers` clients registering fresh emails until stop is called, and
// returns every result.
type registerLoad struct {
	mu      sync.Mutex
	results []loadResult
	stopped atomic.Bool
	wg      sync.WaitGroup
}

func startRegisterLoad(t *testing.T, baseURL string, workers int, client *http.Client) *registerLoad {
	t.Helper()
	load := &registerLoad{}
	var n atomic.Int64
	for range workers {
		load.wg.Go(func() {
			for !load.stopped.Load() {
				email := fmt.Sprintf("load-%d@example.com", n.Add(1))
				r := loadResult{start: time.Now(), email: email}
				req, err := http.NewRequestWithContext(context.Background(),
					http.MethodPost, baseURL+"/v1/auth/register",
					strings.NewReader(`{"email":"`+email+`","password":"correct horse battery"}`))
				if err != nil {
					panic(err) // a constant, valid request
				}
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err == nil {
					r.body, err = io.ReadAll(resp.Body)
					resp.Body.Close()
					r.status = resp.StatusCode
					r.contentType = resp.Header.Get("Content-Type")
					r.retryAfter = resp.Header.Get("Retry-After")
				}
				r.err, r.end = err, time.Now()
				load.mu.Lock()
				load.results = append(load.results, r)
				load.mu.Unlock()
				if r.status != http.StatusCreated {
					time.Sleep(20 * time.Millisecond) // as a client honouring Retry-After would, a little
				}
			}
		})
	}
	return load
}

// snapshot returns the results so far.
func (l *registerLoad) snapshot() []loadResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]loadResult(nil), l.results...)
}

// stop ends the load and returns every result.
func (l *registerLoad) stop() []loadResult {
	l.stopped.Store(true)
	l.wg.Wait()
	return l.snapshot()
}

// getStatus GETs url and returns its status (0 on a transport error).
func getStatus(url string) int {
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestServe_PostgresUnreachable runs the API on PostgreSQL through a proxy the test cuts twice
// under concurrent registrations: first blackholed (live connections closed, new ones never
// answered: only deadlines end a wait), then refused (the database down). While cut, every
// request is answered 503 problem+json with Retry-After (never a 500, never a hang: the request
// deadline ends it), /readyz is 503 and /healthz 200. After each restore the same process
// serves again (no restart), and every registration that was answered 201 has its user and its
// two jobs, read directly from PostgreSQL. Each phase lasts until the answers it needs have
// arrived, not for a time guessed long enough.
func TestServe_PostgresUnreachable(t *testing.T) {
	t.Parallel()

	const (
		requestTimeout = 2 * time.Second
		workers        = 6
		// Answers each phase waits for: registrations that began inside it.
		answersPerPhase = 3
	)

	schemaURL := dbtest.PostgresURL(t)
	proxy := dbtest.NewProxy(t, dbtest.PostgresTarget(t))
	env := map[string]string{
		"DATABASE_URL":              proxy.URL(t, schemaURL),
		"APP_SECRET":                faultSecret,
		"LOG_FORMAT":                "json",
		"RATE_LIMIT_REGISTER_IP":    "1000000/1h",
		"RATE_LIMIT_REGISTER_EMAIL": "1000000/1h",
	}
	server := startServerCommand(t, &serverCommand{
		role:          service.RoleAPI,
		apiConfigFunc: func(config *api.Config) { config.RequestTimeout = requestTimeout },
	}, env)

	// A client that waits far longer than the request deadline: a transport error is a hang.
	load := startRegisterLoad(t, server.URL, workers, &http.Client{Timeout: 10 * requestTimeout})
	t.Cleanup(func() { load.stop() })

	// waitReady waits for /readyz to answer want, and returns when it did.
	waitReady := func(want int) time.Time {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			if getStatus(server.URL+"/readyz") == want {
				return time.Now()
			}
			time.Sleep(50 * time.Millisecond) // polling for a state the proxy's change brings
		}
		t.Fatalf("/readyz did not answer %d\nlogs:\n%s", want, server.Logs)
		return time.Time{}
	}
	// waitAnswers waits until n registrations that began after since have been answered (with
	// status want, when it is not 0), and returns when they were.
	waitAnswers := func(since time.Time, want int) time.Time {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			n := 0
			for _, r := range load.snapshot() {
				if r.start.After(since) && (want == 0 || r.status == want) {
					n++
				}
			}
			if n >= answersPerPhase {
				return time.Now()
			}
			time.Sleep(20 * time.Millisecond) // polling for answers the load keeps producing
		}
		t.Fatalf("fewer than %d registrations begun after %s were answered %d\nlogs:\n%s", answersPerPhase, since, want, server.Logs)
		return time.Time{}
	}

	type window struct{ from, to time.Time } // requests started and ended inside it
	var cuts []window

	// Healthy first.
	waitAnswers(waitReady(http.StatusOK), http.StatusCreated)

	for _, mode := range []dbtest.ProxyMode{dbtest.ProxyBlackhole, dbtest.ProxyRefuse} {
		proxy.Cut(mode)
		cutAt := time.Now()
		waitReady(http.StatusServiceUnavailable)
		require.Equal(t, http.StatusOK, getStatus(server.URL+"/healthz"), "liveness does not depend on the database")
		// Requests that began after the cut ran into it, and ended (at the deadline, blackholed).
		cuts = append(cuts, window{cutAt, waitAnswers(cutAt, 0)})

		proxy.Restore()
		// The same process serves again.
		waitAnswers(waitReady(http.StatusOK), http.StatusCreated)
	}

	results := load.stop()
	require.NoError(t, server.stop(t), "SIGTERM exits cleanly")

	inside := func(r loadResult, w window) bool { return !r.start.Before(w.from) && !r.end.After(w.to) }
	users := make(map[int64]string)
	var created, unavailable int
	cutAnswers := make([]int, len(cuts))
	for _, r := range results {
		require.NoError(t, r.err, "request %s: no transport error, no hang", r.email)
		switch r.status {
		case http.StatusCreated:
			var resp struct {
				ID    int64
				Email string
			}
			require.NoError(t, json.Unmarshal(r.body, &resp))
			require.Equal(t, r.email, resp.Email)
			users[resp.ID] = resp.Email
			created++
		case http.StatusServiceUnavailable:
			require.Equal(t, "application/problem+json", r.contentType)
			require.NotEmpty(t, r.retryAfter, "a 503 says when to retry")
			var problem struct {
				Status int
				Title  string
			}
			require.NoError(t, json.Unmarshal(r.body, &problem))
			require.Equal(t, http.StatusServiceUnavailable, problem.Status)
			unavailable++
		default:
			t.Fatalf("request %s: status %d (only 201 or 503 are acceptable): %s\nlog errors:\n%s",
				r.email, r.status, r.body, grepLines(server.Logs.String(), `"level":"ERROR"`))
		}
		for i, w := range cuts {
			if inside(r, w) {
				require.Equal(t, http.StatusServiceUnavailable, r.status, "request %s started and ended while the database was unreachable", r.email)
				cutAnswers[i]++
			}
		}
	}
	for i, n := range cutAnswers {
		require.Positive(t, n, "cut %d saw requests", i)
	}
	t.Logf("%d requests: %d created, %d unavailable; during the cuts: %v", len(results), created, unavailable, cutAnswers)

	conn := directConn(t, schemaURL)
	requireRegistrationsStored(t, conn, users)
}

// grepLines returns the lines of s that contain substr.
func grepLines(s, substr string) string {
	var out []string
	for line := range strings.Lines(s) {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "")
}
