package mail

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/resend/resend-go/v2"
)

const (
	// DefaultResendBaseURL is Resend's API base, used when
	// ResendConfig.BaseURL is empty.
	DefaultResendBaseURL = "https://api.resend.com/"

	// DefaultResendTimeout bounds one send when ResendConfig.Timeout is zero.
	DefaultResendTimeout = 10 * time.Second

	// errorBodyLimit is how much of an error answer's body is kept to read
	// its name and message; Resend's error bodies are a few hundred bytes.
	errorBodyLimit = 64 << 10
)

// ResendConfig configures a ResendSender.
type ResendConfig struct {
	// APIKey is the Resend API key (RESEND_API_KEY). Required.
	APIKey string

	// BaseURL is the API base (RESEND_BASE_URL), a local fake in tests.
	// Defaults to DefaultResendBaseURL. It is set on the client explicitly:
	// resend-go reads RESEND_BASE_URL only once, at package init.
	BaseURL string

	// From is the sender address, e.g. "App <no-reply@example.com>"
	// (RESEND_FROM_EMAIL). Required.
	From string

	// HTTPClient is the client requests go through. Its Transport is wrapped
	// (the client itself is copied, not modified) to capture error answers.
	// Defaults to a client over http.DefaultTransport.
	HTTPClient *http.Client

	// Timeout bounds one send, answer included. Defaults to
	// DefaultResendTimeout.
	Timeout time.Duration
}

// ResendSender delivers mail through Resend's POST /emails with the official
// resend-go client. Every send carries the message's Idempotency-Key.
//
// resend-go keeps neither the status nor the error name of most error
// answers, so the sender's HTTP transport captures them (per request, through
// the request's context) and Send returns them as a *ProviderError. It is
// safe for concurrent use.
type ResendSender struct {
	client  *resend.Client
	from    string
	timeout time.Duration
}

// NewResendSender returns a sender for config, or an error when the API key,
// the From address or the base URL is missing or invalid.
func NewResendSender(config *ResendConfig) (*ResendSender, error) {
	if config == nil {
		return nil, errors.New("resend config is required")
	}

	apiKey := strings.TrimSpace(config.APIKey)
	if apiKey == "" {
		return nil, errors.New("resend API key is required (RESEND_API_KEY)")
	}
	from := strings.TrimSpace(config.From)
	if from == "" {
		return nil, errors.New("resend from address is required (RESEND_FROM_EMAIL)")
	}

	baseURL, err := parseBaseURL(config.BaseURL)
	if err != nil {
		return nil, err
	}

	if config.Timeout < 0 {
		return nil, fmt.Errorf("resend timeout must not be negative, got %s", config.Timeout)
	}
	timeout := config.Timeout
	if timeout == 0 {
		timeout = DefaultResendTimeout
	}

	var httpClient http.Client
	if config.HTTPClient != nil {
		httpClient = *config.HTTPClient // a copy: the caller's client keeps its own transport
	}
	httpClient.Transport = &captureTransport{base: httpClient.Transport}

	client := resend.NewCustomClient(&httpClient, apiKey)
	client.BaseURL = baseURL

	return &ResendSender{
		client:  client,
		from:    from,
		timeout: timeout,
	}, nil
}

// Send delivers msg with its Idempotency-Key, within the configured timeout,
// and returns Resend's id of the email.
//
// An error answer is returned as a *ProviderError; a network error or timeout
// is returned wrapped as the HTTP client reported it (so a cancelled ctx stays
// recognisable with errors.Is(err, context.Canceled)), with ErrUnsent when it
// came before the request's headers were written. A message without a
// recipient or idempotency key gives ErrInvalidMessage, nothing sent.
func (s *ResendSender) Send(ctx context.Context, msg *Message) (string, error) {
	if msg == nil || strings.TrimSpace(msg.To) == "" {
		return "", fmt.Errorf("error sending email: %w: no recipient", ErrInvalidMessage)
	}
	if msg.IdempotencyKey == "" {
		return "", fmt.Errorf("error sending email: %w: no idempotency key", ErrInvalidMessage)
	}

	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()

	capture := &responseCapture{}
	ctx = context.WithValue(ctx, captureContextKey{}, capture)
	// From the moment the request's headers are written, Resend may act on it: a failure before
	// then sent nothing (ErrUnsent), and another provider may take the mail.
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { capture.wrote.Store(true) }})

	params := &resend.SendEmailRequest{
		From:    s.from,
		To:      []string{msg.To},
		Subject: msg.Subject,
		Html:    msg.HTML,
		Text:    msg.Text,
		Headers: msg.Headers,
	}
	resp, err := s.client.Emails.SendWithOptions(ctx, params, &resend.SendEmailOptions{IdempotencyKey: msg.IdempotencyKey})
	if err == nil {
		return resp.Id, nil
	}

	if capture.statusCode != 0 && (capture.statusCode < 200 || capture.statusCode >= 300) {
		return "", capture.providerError(time.Now())
	}
	if !capture.wrote.Load() {
		return "", fmt.Errorf("error sending email through Resend: %w: %w", ErrUnsent, err)
	}
	return "", fmt.Errorf("error sending email through Resend: %w", err)
}

func parseBaseURL(raw string) (*url.URL, error) {
	if raw == "" {
		raw = DefaultResendBaseURL
	}
	baseURL, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("invalid resend base URL %q: %w", raw, err)
	}
	if (baseURL.Scheme != "http" && baseURL.Scheme != "https") || baseURL.Host == "" {
		return nil, fmt.Errorf("invalid resend base URL %q: want http(s)://host[/path/]", raw)
	}
	// resend-go resolves "emails" against the base, so a base path without a
	// trailing slash would lose its last segment.
	if !strings.HasSuffix(baseURL.Path, "/") {
		baseURL.Path += "/"
	}
	return baseURL, nil
}

// captureContextKey carries a *responseCapture in a request's context.
type captureContextKey struct{}

// responseCapture is what captureTransport records of one send's answer. It
// belongs to one Send call: written by the transport before Do returns, read
// by Send after, so it needs no lock; wrote is set by the transport's writer.
type responseCapture struct {
	body       []byte
	retryAfter string
	statusCode int
	wrote      atomic.Bool
}

func (c *responseCapture) providerError(now time.Time) *ProviderError {
	var body struct {
		Message string `json:"message"`
		Name    string `json:"name"`
	}
	_ = json.Unmarshal(c.body, &body) // a non-JSON body leaves name and message empty

	message := body.Message
	if message == "" {
		message = http.StatusText(c.statusCode)
	}
	return &ProviderError{
		Message:    message,
		Name:       body.Name,
		RetryAfter: parseRetryAfter(c.retryAfter, now),
		StatusCode: c.statusCode,
	}
}

// captureTransport records the status, Retry-After and error body of each
// answer into the responseCapture of the request's context, leaving the
// response readable for resend-go. State lives per request, never on the
// transport, so concurrent sends cannot see each other's answers.
type captureTransport struct {
	base http.RoundTripper
}

func (t *captureTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.base
	if base == nil {
		base = http.DefaultTransport
	}

	resp, err := base.RoundTrip(req)
	if err != nil {
		return nil, err
	}

	capture, _ := req.Context().Value(captureContextKey{}).(*responseCapture)
	if capture == nil {
		return resp, nil
	}

	capture.statusCode = resp.StatusCode
	capture.retryAfter = resp.Header.Get("Retry-After")
	capture.body = nil
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}

	// Keep the head of the error body for its name and message, and give
	// resend-go the whole body back. A read error here shows up again when
	// resend-go reads on, and the status is captured already.
	body, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyLimit))
	capture.body = body
	resp.Body = &replayBody{Reader: io.MultiReader(bytes.NewReader(body), resp.Body), closer: resp.Body}
	return resp, nil
}

// replayBody reads a captured prefix and then the rest of the original body,
// and closes the original.
type replayBody struct {
	io.Reader
	closer io.Closer
}

func (b *replayBody) Close() error { return b.closer.Close() }
