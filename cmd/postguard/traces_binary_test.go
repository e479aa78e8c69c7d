package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// consoleSpan is what this test reads of a span the console exporter writes.
type consoleSpan struct {
	Name        string
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct{ TraceID, SpanID string }
	Resource    []struct {
		Key   string
		Value struct{ Value any }
	}
}

// TestBinary_ConsoleTraces runs the built binary with OTEL_TRACES_EXPORTER=console: its standard
// output is the spans of what it did, as a stream of JSON objects (the log stays on standard
// error), written by the flush at SIGTERM (the batch delay is set far past the test, so nothing
// else could have written them). With no OTEL_ variable, it writes nothing there, and the start
// line names no exporter. A bad OTEL_ value stops the start, named with every other bad variable
// (checked where the configuration is read, so that case runs in-process).
func TestBinary_ConsoleTraces(t *testing.T) {
	t.Parallel()

	run := func(t *testing.T, otel map[string]string) *process {
		t.Helper()
		env := map[string]string{
			"DATABASE_URL":            "sqlite://" + filepath.Join(t.TempDir(), "postguard.db"),
			"JOB_FETCH_COOLDOWN":      "10ms",
			"JOB_FETCH_POLL_INTERVAL": "50ms",
		}
		for k, v := range otel {
			env[k] = v
		}
		p := startProcess(t, "serve", env)
		resp, err := http.Post(p.URL+"/v1/auth/register", "application/json",
			strings.NewReader(`{"email":"ada@example.com","password":"correct horse battery"}`))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		require.Eventually(t, func() bool { return strings.Count(p.Logs.String(), `"msg":"email sent"`) == 2 },
			30*time.Second, 20*time.Millisecond, "logs:\n%s", p.Logs)
		p.signal(t, syscall.SIGTERM)
		require.NoError(t, p.wait(t, 30*time.Second))
		return p
	}

	t.Run("Console", func(t *testing.T) {
		t.Parallel()

		p := run(t, map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "3600000"})
		require.Contains(t, p.Logs.String(), `"traces":"console"`, "the start line names the exporter")

		byName := map[string][]consoleSpan{}
		decoder := json.NewDecoder(strings.NewReader(p.Stdout.String()))
		for {
			var span consoleSpan
			err := decoder.Decode(&span)
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, "standard output is a stream of JSON spans:\n%s", p.Stdout)
			byName[span.Name] = append(byName[span.Name], span)
		}
		require.Len(t, byName["POST /v1/auth/register"], 1, "spans: %v", byName)
		request := byName["POST /v1/auth/register"][0]
		for _, name := range []string{"rate_limit allow", "UserInsert", "river.insert_many", "river.work/welcome_email", "river.work/verification_email", "mail.send log"} {
			require.NotEmpty(t, byName[name], name)
			var inTrace bool
			for _, span := range byName[name] {
				inTrace = inTrace || span.SpanContext.TraceID == request.SpanContext.TraceID
			}
			require.True(t, inTrace, "%s is in the registration's trace", name)
		}
		var service string
		for _, kv := range request.Resource {
			if kv.Key == "service.name" {
				service, _ = kv.Value.Value.(string)
			}
		}
		require.Equal(t, "postguard", service)
		require.False(t, bytes.Contains([]byte(p.Stdout.String()), []byte(`"msg":`)), "no log line among the spans")
	})

	t.Run("NothingSet", func(t *testing.T) {
		t.Parallel()

		p := run(t, nil)
		require.Empty(t, p.Stdout.String(), "no exporter runs")
		require.NotContains(t, p.Logs.String(), `"traces":`)
	})

	t.Run("InvalidVariable", func(t *testing.T) {
		t.Parallel()

		out, err := runCommand(t, []string{"serve"}, map[string]string{
			"DATABASE_URL":         "sqlite://" + filepath.Join(t.TempDir(), "postguard.db"),
			"OTEL_TRACES_EXPORTER": "jaeger",
			"OTEL_TRACES_SAMPLER":  "sometimes",
		})
		require.Error(t, err, out)
		require.ErrorContains(t, err, "invalid OTEL_TRACES_EXPORTER")
		require.ErrorContains(t, err, "invalid OTEL_TRACES_SAMPLER")
	})
}
