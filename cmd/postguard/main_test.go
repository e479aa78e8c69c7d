package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/cmd/internal/service"
	"github.com/postguard/postguard/internal/dbtest"
)

// syncBuffer is a bytes.Buffer safe for the server's goroutines to write while a test reads.
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

// runningServer is a server command started by startServer.
type runningServer struct {
	URL    string
	Logs   *syncBuffer
	cancel context.CancelFunc
	exited chan struct{} // closed once the command returned err
	err    error

	// MetricsURL is http://METRICS_ADDR; "" when the server has no metrics listener.
	MetricsURL string
}

// stop sends the equivalent of SIGTERM and returns what the command returned.
func (s *runningServer) stop(t *testing.T) error {
	t.Helper()
	s.cancel()
	select {
	case <-s.exited:
		return s.err
	case <-time.After(30 * time.Second):
		t.Fatal("server did not stop within 30s of SIGTERM")
		return nil
	}
}

func startServer(t *testing.T, r service.Role, env map[string]string) *runningServer {
	t.Helper()

	if _, ok := env["HTTP_ADDR"]; !ok {
		env["HTTP_ADDR"] = "127.0.0.1:0"
	}
	s, err := tryStartServer(t, r, env)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tryStartServer starts the server command of role r on env (HTTP_ADDR as env says) and waits
// until it serves; an error when it exits first, or does not serve within 60 s.
func tryStartServer(t *testing.T, r service.Role, env map[string]string) (*runningServer, error) {
	t.Helper()

	if _, ok := env["METRICS_ADDR"]; !ok {
		env["METRICS_ADDR"] = "127.0.0.1:0" // never the default port, which tests running at once would share
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan net.Addr, 1)
	logs := &syncBuffer{}
	s := &runningServer{Logs: logs, cancel: cancel, exited: make(chan struct{})}
	cmd := &serverCommand{
		role:             r,
		readyFunc:        func(addr net.Addr) { ready <- addr },
		metricsReadyFunc: func(addr net.Addr) { s.MetricsURL = "http://" + addr.String() },
	}
	go func() {
		defer close(s.exited)
		s.err = cmd.Run(ctx, &commandEnv{Environ: envFunc(env), Stdout: io.Discard, Stderr: logs})
	}()
	t.Cleanup(func() {
		cancel()
		<-s.exited
	})

	select {
	case addr := <-ready:
		s.URL = "http://" + addr.String()
		return s, nil
	case <-s.exited:
		return nil, fmt.Errorf("server exited before serving: %w\nlogs:\n%s", s.err, logs.String())
	case <-time.After(60 * time.Second):
		return nil, fmt.Errorf("server did not start within 60s\nlogs:\n%s", logs.String())
	}
}

func runCommand(t *testing.T, args []string, env map[string]string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), args, envFunc(env), &stdout, &stderr)
	return stdout.String() + stderr.String(), err
}

func TestRun(t *testing.T) {
	t.Parallel()

	t.Run("Usage", func(t *testing.T) {
		t.Parallel()

		out, err := runCommand(t, nil, nil)
		require.ErrorIs(t, err, errUsage)
		require.Contains(t, out, "Usage: postguard <command>")

		out, err = runCommand(t, []string{"bogus"}, nil)
		require.ErrorIs(t, err, errUsage)
		require.Contains(t, out, `unknown command "bogus"`)
	})

	t.Run("Version", func(t *testing.T) {
		t.Parallel()

		out, err := runCommand(t, []string{"version"}, nil)
		require.NoError(t, err)
		require.Contains(t, out, "postguard dev")
	})

	t.Run("BadConfigNamesVariable", func(t *testing.T) {
		t.Parallel()

		_, err := runCommand(t, []string{"serve"}, map[string]string{"RATE_LIMIT_REGISTER_IP": "abc"})
		require.ErrorContains(t, err, "RATE_LIMIT_REGISTER_IP")
	})

	t.Run("APIAndWorkerNeedPostgres", func(t *testing.T) {
		t.Parallel()

		for _, cmd := range []string{"api", "worker"} {
			_, err := runCommand(t, []string{cmd}, map[string]string{"DATABASE_URL": "sqlite://" + filepath.Join(t.TempDir(), "x.db")})
			require.ErrorContains(t, err, "use `postguard serve`")
		}
	})
}

func TestServe_Postgres(t *testing.T) {
	t.Parallel()

	t.Run("RefusesSchemaBehind", func(t *testing.T) {
		t.Parallel()

		env := map[string]string{"DATABASE_URL": dbtest.PostgresEmptyURL(t), "APP_SECRET": strings.Repeat("k", 32)}
		_, err := runCommand(t, []string{"serve"}, env)
		require.ErrorContains(t, err, "postguard migrate")
	})

	t.Run("MigrateTwiceThenServe", func(t *testing.T) {
		t.Parallel()

		env := map[string]string{"DATABASE_URL": dbtest.PostgresEmptyURL(t), "APP_SECRET": strings.Repeat("k", 32)}
		for range 2 {
			out, err := runCommand(t, []string{"migrate"}, env)
			require.NoError(t, err, out)
			require.Contains(t, out, "up to date")
		}

		server := startServer(t, service.RoleServe, env)
		resp, err := http.Get(server.URL + "/healthz")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.NoError(t, server.stop(t), "SIGTERM exits cleanly")
	})
}

func TestServe_SQLite(t *testing.T) {
	t.Parallel()

	dbPath := filepath.Join(t.TempDir(), "postguard.db")
	env := map[string]string{"DATABASE_URL": "sqlite://" + dbPath, "JOB_FETCH_COOLDOWN": "10ms", "JOB_FETCH_POLL_INTERVAL": "50ms"}

	server := startServer(t, service.RoleServe, env)
	resp, err := http.Post(server.URL+"/v1/auth/register", "application/json",
		strings.NewReader(`{"email":"Ada@Example.com","password":"correct horse battery","name":"Ada"}`))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode, string(body))

	// The log mailer logs a short line for each mail of a registration, with its /dev/mail link
	// (on APP_URL, whose default is localhost:8080); /dev/mail shows the mail whole.
	devMailLink := regexp.MustCompile(`url=http://localhost:8080(/dev/mail/log_[A-Z0-9]+)`)
	require.Eventually(t, func() bool {
		return len(devMailLink.FindAllString(server.Logs.String(), -1)) == 2
	}, 20*time.Second, 50*time.Millisecond, "mail not kept; logs:\n%s", server.Logs.String())
	logs := server.Logs.String()
	require.Contains(t, logs, `subject="Verify your email address for postguard"`)
	require.NotContains(t, logs, "/v1/auth/verify-email?token=", "the log line carries no token")
	var pages string
	for _, match := range devMailLink.FindAllStringSubmatch(logs, -1) {
		resp, err := http.Get(server.URL + match[1])
		require.NoError(t, err)
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		pages += string(page)
	}
	require.Contains(t, pages, "http://localhost:8080/v1/auth/verify-email?token=")
	require.Contains(t, pages, "http://localhost:8080/v1/unsubscribe?token=")
	require.NoError(t, server.stop(t))

	// Data survives a restart: the same email is taken.
	server = startServer(t, service.RoleServe, env)
	resp, err = http.Post(server.URL+"/v1/auth/register", "application/json",
		strings.NewReader(`{"email":"ada@example.com","password":"another good password"}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	require.NoError(t, server.stop(t))
}

// TestServe_ClientIPHeader is the nginx case through the real wiring: a trusted proxy sets
// X-Real-IP and passes the client's own X-Forwarded-For through. With CLIENT_IP_HEADER=X-Real-IP
// the client's X-Forwarded-For does not choose its bucket.
func TestServe_ClientIPHeader(t *testing.T) {
	t.Parallel()

	server := startServer(t, service.RoleServe, map[string]string{
		"DATABASE_URL":                  "sqlite://" + filepath.Join(t.TempDir(), "postguard.db"),
		"MAILER":                        "none",
		"TRUSTED_PROXIES":               "127.0.0.1",
		"CLIENT_IP_HEADER":              "X-Real-IP",
		"RATE_LIMIT_FORGOT_PASSWORD_IP": "2/15m",
	})
	for i, want := range []int{http.StatusAccepted, http.StatusAccepted, http.StatusTooManyRequests} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, server.URL+"/v1/auth/forgot-password",
			strings.NewReader(`{"email":"someone@example.com"}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Real-IP", "203.0.113.50")
		req.Header.Set("X-Forwarded-For", "198.51.100."+strconv.Itoa(i+1)) // the client's own, a new one each time
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, want, resp.StatusCode, "request %d", i)
	}
	require.NoError(t, server.stop(t))
}
