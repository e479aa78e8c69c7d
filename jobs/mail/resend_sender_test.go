package mail

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/jobs/mail/resendfake"
)

const testAPIKey = "re_test_key"

func testMessage(key string) *Message {
	return &Message{
		Headers: map[string]string{
			"List-Unsubscribe":      "<http://localhost:8080/v1/unsubscribe?token=dW5zdWI>",
			"List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
		},
		HTML:           "<p>Hi Ada</p>",
		IdempotencyKey: key,
		Kind:           "welcome_email",
		Subject:        "Welcome aboard",
		Text:           "Hi Ada",
		To:             "ada@example.com",
	}
}

func TestResendSender_Send(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		fake   *resendfake.Server
		sender *ResendSender
	}

	setup := func(t *testing.T, fakeConfig *resendfake.Config, config *ResendConfig) *testBundle {
		t.Helper()

		if fakeConfig == nil {
			fakeConfig = &resendfake.Config{}
		}
		fakeConfig.APIKey = testAPIKey
		fake := resendfake.New(t, fakeConfig)

		if config == nil {
			config = &ResendConfig{}
		}
		config.APIKey = testAPIKey
		config.BaseURL = fake.URL()
		config.From = "Postguard <no-reply@example.com>"
		sender, err := NewResendSender(config)
		require.NoError(t, err)

		return &testBundle{fake: fake, sender: sender}
	}

	requireProviderError := func(t *testing.T, err error, status int, name string) *ProviderError {
		t.Helper()

		providerErr, ok := errors.AsType[*ProviderError](err)
		require.True(t, ok, "want a *ProviderError, got %T: %v", err, err)
		require.Equal(t, status, providerErr.StatusCode)
		require.Equal(t, name, providerErr.Name)
		require.NotEmpty(t, providerErr.Message)
		return providerErr
	}

	t.Run("Delivers", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, nil, nil)

		id, err := bundle.sender.Send(t.Context(), testMessage("welcome:42"))
		require.NoError(t, err)

		requests := bundle.fake.Requests()
		require.Len(t, requests, 1)
		req := requests[0]
		require.Equal(t, http.MethodPost, req.Method)
		require.Equal(t, "/emails", req.Path)
		require.Equal(t, "Bearer "+testAPIKey, req.Header.Get("Authorization"))
		require.Equal(t, "welcome:42", req.Header.Get("Idempotency-Key"))
		require.Contains(t, req.Header.Get("User-Agent"), "resend-go/", "sent by the real resend-go client")

		var body struct {
			From    string            `json:"from"`
			To      []string          `json:"to"`
			Subject string            `json:"subject"`
			HTML    string            `json:"html"`
			Text    string            `json:"text"`
			Headers map[string]string `json:"headers"`
		}
		require.NoError(t, json.Unmarshal(req.Body, &body))
		require.Equal(t, "Postguard <no-reply@example.com>", body.From)
		require.Equal(t, []string{"ada@example.com"}, body.To)
		require.Equal(t, "Welcome aboard", body.Subject)
		require.Equal(t, "<p>Hi Ada</p>", body.HTML)
		require.Equal(t, "Hi Ada", body.Text)
		require.Equal(t, "<http://localhost:8080/v1/unsubscribe?token=dW5zdWI>", body.Headers["List-Unsubscribe"])
		require.Equal(t, "List-Unsubscribe=One-Click", body.Headers["List-Unsubscribe-Post"])

		deliveries := bundle.fake.Deliveries()
		require.Len(t, deliveries, 1)
		require.Equal(t, "welcome:42", deliveries[0].IdempotencyKey)
		require.Equal(t, deliveries[0].ID, id, "Send returns Resend's id of the email")
		require.Equal(t, "List-Unsubscribe=One-Click", deliveries[0].Headers["List-Unsubscribe-Post"])
	})

	t.Run("Classification", func(t *testing.T) {
		t.Parallel()

		for _, tt := range []struct {
			name           string
			response       resendfake.Response
			wantOutcome    Outcome
			wantRetryAfter time.Duration
		}{
			{
				name:        "ValidationError",
				response:    resendfake.Response{Status: 422, Name: "validation_error", Message: "Invalid `to` field."},
				wantOutcome: Outcome{Action: ActionCancel},
			},
			{
				name:           "RateLimited",
				response:       resendfake.Response{Status: 429, Name: "rate_limit_exceeded", RetryAfter: 3 * time.Second},
				wantOutcome:    Outcome{Action: ActionSnooze, SnoozeFor: 3 * time.Second, Outage: true},
				wantRetryAfter: 3 * time.Second,
			},
			{
				name:        "ConcurrentIdempotentRequests",
				response:    resendfake.Response{Status: 409, Name: "concurrent_idempotent_requests"},
				wantOutcome: Outcome{Action: ActionSnooze, SnoozeFor: ConcurrentIdempotencySnooze, MaybeAccepted: true},
			},
			{
				name:        "InvalidIdempotentRequest",
				response:    resendfake.Response{Status: 409, Name: "invalid_idempotent_request"},
				wantOutcome: Outcome{Action: ActionCancel},
			},
			{
				name:        "Forbidden",
				response:    resendfake.Response{Status: 403, Name: "invalid_api_key"},
				wantOutcome: Outcome{Action: ActionCancel},
			},
			{
				name:        "InternalServerError",
				response:    resendfake.Response{Status: 500, Name: "internal_server_error"},
				wantOutcome: Outcome{Action: ActionRetry, Outage: true},
			},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()

				bundle := setup(t, nil, nil)
				bundle.fake.Enqueue(tt.response)

				_, err := bundle.sender.Send(t.Context(), testMessage("k1"))
				providerErr := requireProviderError(t, err, tt.response.Status, tt.response.Name)
				require.Equal(t, tt.wantRetryAfter, providerErr.RetryAfter)
				if tt.response.Message != "" {
					require.Equal(t, tt.response.Message, providerErr.Message)
				}
				require.Equal(t, tt.wantOutcome, Classify(err))
				require.Empty(t, bundle.fake.Deliveries())
			})
		}
	})

	t.Run("ConcurrentIdempotentRequestsFromFake", func(t *testing.T) {
		t.Parallel()

		var (
			first    atomic.Bool
			received = make(chan struct{})
			release  = make(chan struct{})
		)
		bundle := setup(t, &resendfake.Config{
			// Hold the first request in progress; let the others answer.
			BeforeAnswerFunc: func(*resendfake.Request) {
				if first.CompareAndSwap(false, true) {
					close(received)
					<-release
				}
			},
		}, nil)

		firstErr := make(chan error, 1)
		go func() { _, err := bundle.sender.Send(context.Background(), testMessage("k1")); firstErr <- err }()
		<-received

		_, err := bundle.sender.Send(t.Context(), testMessage("k1"))
		_ = requireProviderError(t, err, http.StatusConflict, "concurrent_idempotent_requests")
		require.Equal(t, Outcome{Action: ActionSnooze, SnoozeFor: ConcurrentIdempotencySnooze, MaybeAccepted: true}, Classify(err))

		close(release)
		require.NoError(t, <-firstErr)
		require.Len(t, bundle.fake.Deliveries(), 1)
	})

	t.Run("ContextCanceled", func(t *testing.T) {
		t.Parallel()

		ctx, cancel := context.WithCancel(t.Context())
		bundle := setup(t, &resendfake.Config{
			BeforeAnswerFunc: func(*resendfake.Request) { cancel() },
			Delay:            time.Second,
		}, nil)

		_, err := bundle.sender.Send(ctx, testMessage("k1"))
		require.ErrorIs(t, err, context.Canceled, "shutdown must stay recognisable")
		_, isProviderErr := errors.AsType[*ProviderError](err)
		require.False(t, isProviderErr)
		require.Equal(t, Outcome{Action: ActionRetry, Outage: true, MaybeAccepted: true}, Classify(err), "the request reached the provider")
	})

	t.Run("IdempotentRetry", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, nil, nil)
		// The first attempt is delivered but its answer is lost.
		bundle.fake.Enqueue(resendfake.Response{Deliver: true, Drop: true})

		_, err := bundle.sender.Send(t.Context(), testMessage("k1"))
		require.Error(t, err)
		require.NotErrorIs(t, err, ErrUnsent)
		require.Equal(t, Outcome{Action: ActionRetry, Outage: true, MaybeAccepted: true}, Classify(err), "the answer was lost")

		_, err = bundle.sender.Send(t.Context(), testMessage("k1"))
		require.NoError(t, err)
		require.Len(t, bundle.fake.Requests(), 2)
		require.Len(t, bundle.fake.Deliveries(), 1, "the retry is not delivered twice")
	})

	t.Run("InvalidIdempotentRequestFromFake", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, nil, nil)

		_, err := bundle.sender.Send(t.Context(), testMessage("k1"))
		require.NoError(t, err)

		other := testMessage("k1")
		other.Subject = "Another subject"
		_, err = bundle.sender.Send(t.Context(), other)
		_ = requireProviderError(t, err, http.StatusConflict, "invalid_idempotent_request")
		require.Equal(t, Outcome{Action: ActionCancel}, Classify(err))
	})

	t.Run("InvalidMessage", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, nil, nil)

		noRecipient := testMessage("k1")
		noRecipient.To = " "
		_, err := bundle.sender.Send(t.Context(), noRecipient)
		require.ErrorIs(t, err, ErrInvalidMessage)
		require.Equal(t, Outcome{Action: ActionCancel}, Classify(err))

		_, err = bundle.sender.Send(t.Context(), testMessage(""))
		require.ErrorIs(t, err, ErrInvalidMessage)
		require.Empty(t, bundle.fake.Requests())
	})

	t.Run("MissingFieldFromFake", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, nil, nil)

		msg := testMessage("k1")
		msg.Subject = ""
		_, err := bundle.sender.Send(t.Context(), msg)
		_ = requireProviderError(t, err, http.StatusUnprocessableEntity, "missing_required_field")
		require.Equal(t, Outcome{Action: ActionCancel}, Classify(err))
	})

	t.Run("NetworkError", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, nil, nil)
		bundle.fake.Close()

		_, err := bundle.sender.Send(t.Context(), testMessage("k1"))
		require.Error(t, err)
		_, isProviderErr := errors.AsType[*ProviderError](err)
		require.False(t, isProviderErr, "a network error is not a provider answer")
		// The connection was refused: nothing reached the provider, so another may take the mail.
		require.ErrorIs(t, err, ErrUnsent)
		require.Equal(t, Outcome{Action: ActionRetry, Outage: true}, Classify(err))
	})

	t.Run("NonJSONErrorBody", func(t *testing.T) {
		t.Parallel()

		server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = fmt.Fprint(w, "<html>bad gateway</html>")
		}))
		t.Cleanup(server.Close)

		sender, err := NewResendSender(&ResendConfig{APIKey: testAPIKey, BaseURL: server.URL, From: "a@example.com"})
		require.NoError(t, err)

		_, err = sender.Send(t.Context(), testMessage("k1"))
		providerErr, ok := errors.AsType[*ProviderError](err)
		require.True(t, ok)
		require.Equal(t, &ProviderError{StatusCode: http.StatusBadGateway, Message: "Bad Gateway"}, providerErr)
		require.Equal(t, Outcome{Action: ActionRetry, Outage: true}, Classify(err))
	})

	t.Run("RateLimitFromFake", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, &resendfake.Config{RatePerSecond: 1}, nil)

		_, err := bundle.sender.Send(t.Context(), testMessage("k1"))
		require.NoError(t, err)
		_, err = bundle.sender.Send(t.Context(), testMessage("k2"))
		providerErr := requireProviderError(t, err, http.StatusTooManyRequests, "rate_limit_exceeded")
		require.Equal(t, time.Second, providerErr.RetryAfter)
		require.Equal(t, Outcome{Action: ActionSnooze, SnoozeFor: time.Second, Outage: true}, Classify(err))
	})

	t.Run("Timeout", func(t *testing.T) {
		t.Parallel()

		// The fake holds its answer until the test ends: only the sender's timeout can end the
		// send, so Send returning at all is the timeout working.
		release := make(chan struct{})
		bundle := setup(t, &resendfake.Config{BeforeAnswerFunc: func(*resendfake.Request) { <-release }}, &ResendConfig{Timeout: 50 * time.Millisecond})
		t.Cleanup(func() { close(release) }) // before the fake's Close, which waits for its handlers

		_, err := bundle.sender.Send(t.Context(), testMessage("k1"))
		require.ErrorIs(t, err, context.DeadlineExceeded)
		_, isProviderErr := errors.AsType[*ProviderError](err)
		require.False(t, isProviderErr)
		require.Equal(t, Outcome{Action: ActionRetry, Outage: true, MaybeAccepted: true}, Classify(err))
	})

	t.Run("ConcurrentSendsGetOwnAnswers", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t, nil, nil)
		_, err := bundle.sender.Send(t.Context(), testMessage("taken"))
		require.NoError(t, err)

		const n = 30
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				msg := testMessage(fmt.Sprintf("k%d", i))
				switch i % 3 {
				case 1: // rejected by validation
					msg.Subject = ""
				case 2: // reuses a key with another payload
					msg.IdempotencyKey = "taken"
					msg.Text = fmt.Sprintf("other %d", i)
				}
				_, errs[i] = bundle.sender.Send(context.Background(), msg)
			})
		}
		wg.Wait()

		for i, err := range errs {
			switch i % 3 {
			case 0:
				require.NoError(t, err, "send %d", i)
			case 1:
				_ = requireProviderError(t, err, http.StatusUnprocessableEntity, "missing_required_field")
			case 2:
				_ = requireProviderError(t, err, http.StatusConflict, "invalid_idempotent_request")
			}
		}
		require.Len(t, bundle.fake.Deliveries(), 1+n/3)
	})
}

// countingTransport counts the requests it carries.
type countingTransport struct {
	count atomic.Int64
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.count.Add(1)
	return http.DefaultTransport.RoundTrip(req)
}

func TestNewResendSender(t *testing.T) {
	t.Parallel()

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()

		sender, err := NewResendSender(&ResendConfig{APIKey: " re_x ", From: "a@example.com"})
		require.NoError(t, err)
		require.Equal(t, DefaultResendBaseURL, sender.client.BaseURL.String())
		require.Equal(t, "re_x", sender.client.ApiKey)
		require.Equal(t, DefaultResendTimeout, sender.timeout)
	})

	t.Run("BaseURLGetsTrailingSlash", func(t *testing.T) {
		t.Parallel()

		sender, err := NewResendSender(&ResendConfig{APIKey: "re_x", BaseURL: "http://127.0.0.1:9/resend", From: "a@example.com"})
		require.NoError(t, err)
		require.Equal(t, "http://127.0.0.1:9/resend/", sender.client.BaseURL.String())
	})

	t.Run("CustomHTTPClient", func(t *testing.T) {
		t.Parallel()

		fake := resendfake.New(t, nil)
		transport := &countingTransport{}
		httpClient := &http.Client{Transport: transport}

		sender, err := NewResendSender(&ResendConfig{APIKey: "re_x", BaseURL: fake.URL(), From: "a@example.com", HTTPClient: httpClient})
		require.NoError(t, err)
		require.Same(t, transport, httpClient.Transport, "the caller's client is not modified")

		fake.Enqueue(resendfake.Response{Status: 422, Name: "validation_error"})
		_, err = sender.Send(t.Context(), testMessage("k1"))
		require.Equal(t, int64(1), transport.count.Load())
		providerErr, ok := errors.AsType[*ProviderError](err)
		require.True(t, ok, "errors are still captured through a custom client")
		require.Equal(t, "validation_error", providerErr.Name)
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()

		for _, tt := range []struct {
			config  *ResendConfig
			wantErr string
		}{
			{nil, "config is required"},
			{&ResendConfig{From: "a@example.com"}, "RESEND_API_KEY"},
			{&ResendConfig{APIKey: "re_x"}, "RESEND_FROM_EMAIL"},
			{&ResendConfig{APIKey: "re_x", From: "a@example.com", BaseURL: "api.resend.com"}, "invalid resend base URL"},
			{&ResendConfig{APIKey: "re_x", From: "a@example.com", BaseURL: "ftp://example.com/"}, "invalid resend base URL"},
			{&ResendConfig{APIKey: "re_x", From: "a@example.com", BaseURL: "http://a b/"}, "invalid resend base URL"},
			{&ResendConfig{APIKey: "re_x", From: "a@example.com", Timeout: -time.Second}, "timeout"},
		} {
			_, err := NewResendSender(tt.config)
			require.ErrorContains(t, err, tt.wantErr)
		}
	})
}
