package resendfake

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type sendResult struct {
	header http.Header
	body   map[string]any
	status int
}

// post sends body to the fake's POST /emails with the test API key and, when
// non-empty, an Idempotency-Key.
func post(t *testing.T, server *Server, key, body string) *sendResult {
	t.Helper()

	result, err := doPost(t.Context(), server, key, body)
	require.NoError(t, err)
	return result
}

// doPost is post for goroutines other than the test's.
func doPost(ctx context.Context, server *Server, key, body string) (*sendResult, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, server.URL()+"/emails", bytes.NewBufferString(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer re_test")
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}

	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()

	result := &sendResult{header: resp.Header, status: resp.StatusCode}
	if err := json.NewDecoder(resp.Body).Decode(&result.body); err != nil {
		return nil, err
	}
	return result, nil
}

func requireError(t *testing.T, result *sendResult, status int, name string) {
	t.Helper()

	require.Equal(t, status, result.status, "body: %v", result.body)
	require.Equal(t, name, result.body["name"])
	require.EqualValues(t, status, result.body["statusCode"])
	require.NotEmpty(t, result.body["message"])
}

const validBody = `{"from":"App <no-reply@example.com>","to":["ada@example.com"],"subject":"Hello","html":"<p>Hi</p>","text":"Hi","headers":{"List-Unsubscribe":"<https://example.com/u>"}}`

func TestServer(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T, config *Config) *Server {
		t.Helper()

		if config == nil {
			config = &Config{}
		}
		config.APIKey = "re_test"
		return New(t, config)
	}

	t.Run("Accepts", func(t *testing.T) {
		t.Parallel()

		server := setup(t, nil)

		result := post(t, server, "welcome:1", validBody)
		require.Equal(t, http.StatusOK, result.status)
		require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, result.body["id"])

		deliveries := server.Deliveries()
		require.Len(t, deliveries, 1)
		delivery := deliveries[0]
		require.Equal(t, result.body["id"], delivery.ID)
		require.Equal(t, "welcome:1", delivery.IdempotencyKey)
		require.Equal(t, "App <no-reply@example.com>", delivery.From)
		require.Equal(t, []string{"ada@example.com"}, delivery.To)
		require.Equal(t, "Hello", delivery.Subject)
		require.Equal(t, "<p>Hi</p>", delivery.HTML)
		require.Equal(t, "Hi", delivery.Text)
		require.Equal(t, map[string]string{"List-Unsubscribe": "<https://example.com/u>"}, delivery.Headers)
		require.False(t, delivery.ReceivedAt.IsZero())
	})

	t.Run("AcceptsToAsString", func(t *testing.T) {
		t.Parallel()

		server := setup(t, nil)

		result := post(t, server, "", `{"from":"a@example.com","to":"ada@example.com","subject":"Hello","text":"Hi"}`)
		require.Equal(t, http.StatusOK, result.status)
		require.Equal(t, []string{"ada@example.com"}, server.Deliveries()[0].To)
	})

	t.Run("Authentication", func(t *testing.T) {
		t.Parallel()

		server := setup(t, nil)

		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, server.URL()+"/emails", bytes.NewBufferString(validBody))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

		req.Header.Set("Authorization", "Bearer re_other")
		req.Body = io.NopCloser(bytes.NewBufferString(validBody))
		resp, err = http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusForbidden, resp.StatusCode)

		require.Empty(t, server.Deliveries())
	})

	t.Run("CloseTwiceWithoutTB", func(t *testing.T) {
		t.Parallel()

		server := New(nil, nil)
		server.Close()
		server.Close()

		_, err := http.Get(server.URL() + "/emails") //nolint:noctx // the server is gone; nothing to cancel
		require.Error(t, err)
	})

	t.Run("DelayAndHook", func(t *testing.T) {
		t.Parallel()

		var (
			mu   sync.Mutex
			seen []string
		)
		server := setup(t, &Config{
			BeforeAnswerFunc: func(req *Request) {
				mu.Lock()
				defer mu.Unlock()
				seen = append(seen, req.Header.Get("Idempotency-Key"))
			},
			Delay: 200 * time.Millisecond,
		})

		start := time.Now()
		result := post(t, server, "k1", validBody)
		require.Equal(t, http.StatusOK, result.status)
		require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)

		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, []string{"k1"}, seen)
	})

	t.Run("EnqueueFIFO", func(t *testing.T) {
		t.Parallel()

		server := setup(t, nil)
		server.Enqueue(
			Response{Status: http.StatusInternalServerError, Name: "internal_server_error"},
			Response{Status: http.StatusTooManyRequests, Name: NameRateLimitExceeded, RetryAfter: 1500 * time.Millisecond},
		)

		result := post(t, server, "k1", validBody)
		requireError(t, result, http.StatusInternalServerError, "internal_server_error")

		result = post(t, server, "k1", validBody)
		requireError(t, result, http.StatusTooManyRequests, NameRateLimitExceeded)
		require.Equal(t, "2", result.header.Get("Retry-After"))

		require.Empty(t, server.Deliveries(), "scripted answers deliver nothing")

		result = post(t, server, "k1", validBody)
		require.Equal(t, http.StatusOK, result.status)
		require.Len(t, server.Deliveries(), 1)
	})

	t.Run("EnqueueDeliverThenDrop", func(t *testing.T) {
		t.Parallel()

		server := setup(t, nil)
		server.Enqueue(Response{Deliver: true, Drop: true})

		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, server.URL()+"/emails", bytes.NewBufferString(validBody))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer re_test")
		req.Header.Set("Idempotency-Key", "k1")
		_, err = http.DefaultClient.Do(req) //nolint:bodyclose // no response
		require.Error(t, err)

		deliveries := server.Deliveries()
		require.Len(t, deliveries, 1, "delivered although the answer was lost")

		// The retry with the same key gets the same id and delivers nothing new.
		result := post(t, server, "k1", validBody)
		require.Equal(t, http.StatusOK, result.status)
		require.Equal(t, deliveries[0].ID, result.body["id"])
		require.Len(t, server.Deliveries(), 1)

		requests := server.Requests()
		require.Len(t, requests, 2)
		require.Zero(t, requests[0].Status)
		require.Equal(t, http.StatusOK, requests[1].Status)
	})

	t.Run("IdempotencyConcurrent", func(t *testing.T) {
		t.Parallel()

		var (
			received = make(chan struct{}, 1)
			release  = make(chan struct{})
		)
		server := setup(t, &Config{
			BeforeAnswerFunc: func(req *Request) {
				if string(req.Body) == validBody {
					received <- struct{}{}
					<-release
				}
			},
		})

		type firstResult struct {
			result *sendResult
			err    error
		}
		first := make(chan firstResult, 1)
		go func() {
			result, err := doPost(t.Context(), server, "k1", validBody)
			first <- firstResult{result, err}
		}()
		<-received

		// Same key while the first is in progress (same payload, written with
		// another spacing so the hook lets it through).
		result := post(t, server, "k1", validBody+" ")
		requireError(t, result, http.StatusConflict, NameConcurrentIdempotentRequests)

		close(release)
		firstRes := <-first
		require.NoError(t, firstRes.err)
		require.Equal(t, http.StatusOK, firstRes.result.status)
		require.Len(t, server.Deliveries(), 1)
	})

	t.Run("IdempotencyOtherPayload", func(t *testing.T) {
		t.Parallel()

		server := setup(t, nil)

		require.Equal(t, http.StatusOK, post(t, server, "k1", validBody).status)

		result := post(t, server, "k1", `{"from":"a@example.com","to":"ada@example.com","subject":"Other","text":"Hi"}`)
		requireError(t, result, http.StatusConflict, NameInvalidIdempotentRequest)
		require.Len(t, server.Deliveries(), 1)
	})

	t.Run("IdempotencySamePayload", func(t *testing.T) {
		t.Parallel()

		server := setup(t, nil)

		first := post(t, server, "k1", validBody)
		require.Equal(t, http.StatusOK, first.status)
		second := post(t, server, "k1", validBody)
		require.Equal(t, http.StatusOK, second.status)
		require.Equal(t, first.body["id"], second.body["id"])

		// Without a key every request is a new email.
		require.Equal(t, http.StatusOK, post(t, server, "", validBody).status)
		require.Equal(t, http.StatusOK, post(t, server, "", validBody).status)

		require.Len(t, server.Deliveries(), 3)
		require.Len(t, server.Requests(), 4)
	})

	t.Run("RateLimit", func(t *testing.T) {
		t.Parallel()

		// The fake's clock stands still, so the three posts share one window however long
		// they take; then it moves past the window.
		var (
			mu  sync.Mutex
			now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		)
		clock := func() time.Time {
			mu.Lock()
			defer mu.Unlock()
			return now
		}
		server := setup(t, &Config{RatePerSecond: 2, NowFunc: clock})

		require.Equal(t, http.StatusOK, post(t, server, "k1", validBody).status)
		require.Equal(t, http.StatusOK, post(t, server, "k2", validBody).status)

		result := post(t, server, "k3", validBody)
		requireError(t, result, http.StatusTooManyRequests, NameRateLimitExceeded)
		require.Equal(t, "1", result.header.Get("Retry-After"))
		require.Len(t, server.Deliveries(), 2)
		require.Equal(t, now, server.Requests()[2].ReceivedAt)

		// Half a second on: still the same window.
		mu.Lock()
		now = now.Add(500 * time.Millisecond)
		mu.Unlock()
		requireError(t, post(t, server, "k3", validBody), http.StatusTooManyRequests, NameRateLimitExceeded)

		// A second after the first two: a new window.
		mu.Lock()
		now = now.Add(500 * time.Millisecond)
		mu.Unlock()
		require.Equal(t, http.StatusOK, post(t, server, "k3", validBody).status)
		require.Equal(t, http.StatusOK, post(t, server, "k4", validBody).status)
		requireError(t, post(t, server, "k5", validBody), http.StatusTooManyRequests, NameRateLimitExceeded)
	})

	t.Run("RequestsRecorded", func(t *testing.T) {
		t.Parallel()

		server := setup(t, nil)
		server.Enqueue(Response{Status: http.StatusBadGateway})

		post(t, server, "k1", validBody)
		post(t, server, "k1", validBody)

		requests := server.Requests()
		require.Len(t, requests, 2)
		for i, status := range []int{http.StatusBadGateway, http.StatusOK} {
			require.Equal(t, http.MethodPost, requests[i].Method)
			require.Equal(t, "/emails", requests[i].Path)
			require.Equal(t, "k1", requests[i].Header.Get("Idempotency-Key"))
			require.JSONEq(t, validBody, string(requests[i].Body))
			require.Equal(t, status, requests[i].Status)
		}
	})

	t.Run("Routes", func(t *testing.T) {
		t.Parallel()

		server := setup(t, nil)

		resp, err := http.Get(server.URL() + "/emails") //nolint:noctx // short test request
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)

		resp, err = http.Post(server.URL()+"/domains", "application/json", bytes.NewBufferString("{}")) //nolint:noctx // short test request
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusNotFound, resp.StatusCode)
	})

	t.Run("Validation", func(t *testing.T) {
		t.Parallel()

		server := setup(t, nil)

		for _, tt := range []struct {
			body string
			name string
		}{
			{`not json`, NameValidationError},
			{`{"from":"a@example.com","to":42,"subject":"s","text":"t"}`, NameValidationError},
			{`{"to":"ada@example.com","subject":"s","text":"t"}`, NameMissingRequiredField},
			{`{"from":"a@example.com","subject":"s","text":"t"}`, NameMissingRequiredField},
			{`{"from":"a@example.com","to":"ada@example.com","text":"t"}`, NameMissingRequiredField},
			{`{"from":"a@example.com","to":"ada@example.com","subject":"s"}`, NameMissingRequiredField},
		} {
			requireError(t, post(t, server, "", tt.body), http.StatusUnprocessableEntity, tt.name)
		}

		long := string(bytes.Repeat([]byte("k"), 257))
		requireError(t, post(t, server, long, validBody), http.StatusBadRequest, NameInvalidIdempotencyKey)

		require.Empty(t, server.Deliveries())
	})
}

func TestParseRecipients(t *testing.T) {
	t.Parallel()

	to, problem := parseRecipients(json.RawMessage(`["a@example.com",""]`))
	require.Empty(t, problem)
	require.Equal(t, []string{"a@example.com"}, to)

	_, problem = parseRecipients(json.RawMessage(`{"a":1}`))
	require.NotEmpty(t, problem)

	_, problem = parseRecipients(json.RawMessage(`[` + strings.Repeat(`"a@example.com",`, 50) + `"b@example.com"]`))
	require.Contains(t, problem, "at most 50")
}
