// Package resendfake is an in-process fake of Resend's POST /emails, served
// by httptest, for the tests of every package that sends mail (and the load
// and fault tools, which pass a nil testing.TB), and of the webhooks Resend
// sends about the mail it accepted.
//
// It answers like Resend: 200 {"id":"<uuid>"} for an accepted email and
// {"statusCode":…,"name":…,"message":…} errors otherwise, keeps Resend's
// idempotency rules (same key and payload → the same id and no second
// delivery; same key, other payload → 409 invalid_idempotent_request; key
// still in progress → 409 concurrent_idempotent_requests), can be scripted
// with Enqueue, can enforce a per-second rate budget (429 with Retry-After),
// and can delay its answers. It is safe for concurrent use.
//
// For a delivery it accepted, Event builds a webhook event shaped as Resend's
// (delivered, delayed, bounced permanently or transiently, complained,
// suppressed, failed…), and SendWebhook or WebhookRequest delivers it to a URL
// the test gives, signed as Svix signs Resend's: headers svix-id,
// svix-timestamp and svix-signature ("v1," and a base64 HMAC-SHA256), under
// WebhookSecret, or under two secrets after RotateWebhookSecret. The fake signs
// with its own code; the service checks with a library, so the two cannot
// agree by sharing a mistake.
package resendfake

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Resend's error names used by the fake.
const (
	NameConcurrentIdempotentRequests = "concurrent_idempotent_requests"
	NameInvalidAPIKey                = "invalid_api_key"
	NameInvalidIdempotencyKey        = "invalid_idempotency_key"
	NameInvalidIdempotentRequest     = "invalid_idempotent_request"
	NameMethodNotAllowed             = "method_not_allowed"
	NameMissingAPIKey                = "missing_api_key"
	NameMissingRequiredField         = "missing_required_field"
	NameNotFound                     = "not_found"
	NameRateLimitExceeded            = "rate_limit_exceeded"
	NameValidationError              = "validation_error"
)

const (
	// maxIdempotencyKeyLength is Resend's limit on an Idempotency-Key.
	maxIdempotencyKeyLength = 256

	// maxRecipients is Resend's limit on "to".
	maxRecipients = 50
)

// Config configures a Server. The zero value (or nil) accepts every valid
// email at once, without rate limit.
type Config struct {
	// APIKey, when set, is the only key accepted ("Authorization: Bearer
	// <APIKey>"); others get 403 invalid_api_key. A request without an
	// Authorization header always gets 401 missing_api_key.
	APIKey string

	// BeforeAnswerFunc, when set, is called for every POST /emails after the
	// fake has read and recorded it and before it answers: "the fake
	// received the POST". While it runs, an accepted email's idempotency key
	// is in progress (a concurrent request with it gets 409
	// concurrent_idempotent_requests). It runs on the request's goroutine,
	// without the fake's lock held, and may block (a crash test kills the
	// client meanwhile).
	BeforeAnswerFunc func(req *Request)

	// Delay, when positive, is waited before every answer (after
	// BeforeAnswerFunc), e.g. to make a client time out. An email accepted
	// for delivery is delivered even if the client gives up meanwhile, as
	// Resend would. Close cuts the wait short.
	Delay time.Duration

	// RatePerSecond, when positive, is the most requests accepted in any
	// one-second sliding window; beyond it the fake answers 429
	// rate_limit_exceeded with Retry-After (whole seconds, ≥1). Refused
	// requests do not count against the budget. Scripted responses bypass it.
	RatePerSecond int

	// NowFunc returns the current time: when each request arrived
	// (Request.ReceivedAt) and which ones share a rate window, and the
	// default time of webhook events and of their signatures. Defaults to
	// time.Now; a test stubs it to put requests in one window, or in
	// separate ones, whatever the machine's speed.
	NowFunc func() time.Time

	// WebhookSecret signs the webhooks the fake sends, a secret as Resend
	// gives them ("whsec_" and base64). Empty makes a new one; see
	// Server.WebhookSecret.
	WebhookSecret string
}

// Delivery is an email the fake accepted: one per idempotency key (or per
// request without a key).
type Delivery struct {
	// ID is the id answered to the client.
	ID string

	// IdempotencyKey is the request's Idempotency-Key header, if any.
	IdempotencyKey string

	From    string
	To      []string
	Subject string
	HTML    string
	Text    string

	// Headers are the email headers of the JSON body's "headers" field (such
	// as List-Unsubscribe), not the HTTP headers.
	Headers map[string]string

	// ReceivedAt is when the delivering request arrived.
	ReceivedAt time.Time
}

// Request is one HTTP request the fake received, whatever its answer.
type Request struct {
	Method string
	Path   string

	// Header is the request's HTTP headers (Authorization, Idempotency-Key,
	// User-Agent, ...).
	Header http.Header

	// Body is the raw request body.
	Body []byte

	// ReceivedAt is when the request arrived.
	ReceivedAt time.Time

	// Status is the status the fake answered, or 0 while it has not
	// answered yet (or dropped the connection).
	Status int
}

// Response is a scripted answer, given with Server.Enqueue.
type Response struct {
	// Status is the HTTP status to answer; 2xx answers carry a fresh id.
	Status int

	// Name and Message make the error body {"statusCode","name","message"}.
	// Message defaults to the status text.
	Name    string
	Message string

	// RetryAfter, when positive, is sent as the Retry-After header in whole
	// seconds (rounded up).
	RetryAfter time.Duration

	// Deliver processes the request normally first (validation, idempotency,
	// delivery) and then answers this response instead of the real one: an
	// email delivered whose answer is lost. Without it a scripted response
	// delivers nothing.
	Deliver bool

	// Drop closes the connection without any answer (the client sees a
	// network error). Status, Name, Message and RetryAfter are then unused.
	Drop bool
}

// Server is the fake. Create it with New.
type Server struct {
	config     Config
	httpServer *httptest.Server
	closeOnce  sync.Once
	closed     chan struct{}

	mu         sync.Mutex
	accepted   []time.Time          // start times of requests within the rate budget
	deliveries []Delivery           // accepted emails, in order
	keys       map[string]*keyState // idempotency keys seen
	requests   []*Request           // every request received
	scripted   []Response           // FIFO of scripted answers

	webhookSecrets []string // the secrets webhooks are signed with, newest last
}

// now is the fake's clock (Config.NowFunc).
func (s *Server) now() time.Time {
	if s.config.NowFunc != nil {
		return s.config.NowFunc()
	}
	return time.Now()
}

// keyState is the life of an idempotency key at the fake.
type keyState struct {
	id          string
	inFlight    bool
	payloadHash [32]byte
}

// New starts a fake. When tb is non-nil, Close is registered with tb.Cleanup;
// a nil tb (as the load tool passes) leaves closing to the caller. config may
// be nil.
func New(tb testing.TB, config *Config) *Server {
	if config == nil {
		config = &Config{}
	}

	s := &Server{
		closed: make(chan struct{}),
		config: *config,
		keys:   make(map[string]*keyState),
	}
	s.webhookSecrets = []string{config.WebhookSecret}
	if config.WebhookSecret == "" {
		s.webhookSecrets[0] = NewWebhookSecret()
	}
	s.httpServer = httptest.NewServer(http.HandlerFunc(s.serveHTTP))

	if tb != nil {
		tb.Cleanup(s.Close)
	}
	return s
}

// Close stops the server, cutting short any Delay in progress, and waits for
// running requests to finish. Safe to call more than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.httpServer.CloseClientConnections()
		s.httpServer.Close()
	})
}

// Deliveries returns the emails accepted so far, one per idempotency key, in
// order of acceptance.
func (s *Server) Deliveries() []Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()

	deliveries := make([]Delivery, len(s.deliveries))
	for i, delivery := range s.deliveries {
		delivery.To = slices.Clone(delivery.To)
		delivery.Headers = maps.Clone(delivery.Headers)
		deliveries[i] = delivery
	}
	return deliveries
}

// Enqueue adds scripted answers, used first-in first-out, one per request to
// POST /emails, before any normal handling (authentication, rate budget,
// validation, idempotency).
func (s *Server) Enqueue(responses ...Response) {
	s.mu.Lock()
	defer s.mu.Unlock()

	s.scripted = append(s.scripted, responses...)
}

// Requests returns every request received so far, in order of arrival.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()

	requests := make([]Request, len(s.requests))
	for i, req := range s.requests {
		requests[i] = *req
		requests[i].Header = req.Header.Clone()
		requests[i].Body = slices.Clone(req.Body)
	}
	return requests
}

// URL is the fake's base URL, e.g. "http://127.0.0.1:41234", to use as
// RESEND_BASE_URL.
func (s *Server) URL() string {
	return s.httpServer.URL
}

// answer is the fake's reply to one request.
type answer struct {
	body       any
	drop       bool
	retryAfter time.Duration
	status     int
}

func errorAnswer(status int, name, message string) *answer {
	if message == "" {
		message = http.StatusText(status)
	}
	return &answer{
		body:   map[string]any{"statusCode": status, "name": name, "message": message},
		status: status,
	}
}

// sendRequest is the JSON body of POST /emails. "to" may be a string or an
// array of strings.
type sendRequest struct {
	From    string            `json:"from"`
	To      json.RawMessage   `json:"to"`
	Subject string            `json:"subject"`
	HTML    string            `json:"html"`
	Text    string            `json:"text"`
	Headers map[string]string `json:"headers"`
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "error reading body", http.StatusBadRequest)
		return
	}

	now := s.now()
	req := &Request{
		Body:       body,
		Header:     r.Header.Clone(),
		Method:     r.Method,
		Path:       r.URL.Path,
		ReceivedAt: now,
	}

	s.mu.Lock()
	s.requests = append(s.requests, req)
	s.mu.Unlock()

	var ans *answer
	switch {
	case r.URL.Path != "/emails":
		ans = errorAnswer(http.StatusNotFound, NameNotFound, "The requested endpoint does not exist.")
	case r.Method != http.MethodPost:
		ans = errorAnswer(http.StatusMethodNotAllowed, NameMethodNotAllowed, "Method is not allowed for the requested path.")
	default:
		ans = s.handleSend(req, now)
	}

	s.mu.Lock()
	if !ans.drop {
		req.Status = ans.status
	}
	s.mu.Unlock()

	s.write(w, ans)
}

// handleSend answers a POST /emails, running the hook and the delay.
func (s *Server) handleSend(req *Request, now time.Time) *answer {
	s.mu.Lock()
	var scripted *Response
	if len(s.scripted) > 0 {
		scripted = &s.scripted[0]
		s.scripted = s.scripted[1:]
	}

	var (
		ans    *answer
		commit func() // finishes an accepted delivery after the wait
	)
	if scripted == nil || scripted.Deliver {
		ans, commit = s.processLocked(req, now, scripted != nil)
	}
	s.mu.Unlock()

	if s.config.BeforeAnswerFunc != nil {
		reqCopy := *req
		reqCopy.Header = req.Header.Clone()
		reqCopy.Body = slices.Clone(req.Body)
		s.config.BeforeAnswerFunc(&reqCopy)
	}
	if s.config.Delay > 0 {
		timer := time.NewTimer(s.config.Delay)
		select {
		case <-timer.C:
		case <-s.closed:
			timer.Stop()
		}
	}

	if commit != nil {
		s.mu.Lock()
		commit()
		s.mu.Unlock()
	}

	if scripted != nil {
		if scripted.Drop {
			return &answer{drop: true}
		}
		if scripted.Status >= 200 && scripted.Status < 300 {
			if ans != nil && ans.status == http.StatusOK {
				return ans // a delivered email keeps its id
			}
			return &answer{body: map[string]string{"id": newUUID()}, status: scripted.Status}
		}
		scriptedAns := errorAnswer(scripted.Status, scripted.Name, scripted.Message)
		scriptedAns.retryAfter = scripted.RetryAfter
		return scriptedAns
	}
	return ans
}

// processLocked handles a send as Resend would. For an email accepted for
// delivery it marks the idempotency key in progress and returns a commit
// func, to be called under s.mu after the hook and delay, that records the
// delivery. bypassRate skips the rate budget (scripted responses).
func (s *Server) processLocked(req *Request, now time.Time, bypassRate bool) (*answer, func()) {
	auth := req.Header.Get("Authorization")
	if auth == "" {
		return errorAnswer(http.StatusUnauthorized, NameMissingAPIKey, "Missing API key in the authorization header."), nil
	}
	if s.config.APIKey != "" && auth != "Bearer "+s.config.APIKey {
		return errorAnswer(http.StatusForbidden, NameInvalidAPIKey, "API key is invalid."), nil
	}

	if s.config.RatePerSecond > 0 && !bypassRate {
		windowStart := now.Add(-time.Second)
		s.accepted = slices.DeleteFunc(s.accepted, func(t time.Time) bool { return !t.After(windowStart) })
		if len(s.accepted) >= s.config.RatePerSecond {
			retryAfter := s.accepted[0].Add(time.Second).Sub(now)
			ans := errorAnswer(http.StatusTooManyRequests, NameRateLimitExceeded,
				"Too many requests. You can only make "+strconv.Itoa(s.config.RatePerSecond)+" requests per second.")
			ans.retryAfter = max(retryAfter, time.Second)
			return ans, nil
		}
		s.accepted = append(s.accepted, now)
	}

	key := req.Header.Get("Idempotency-Key")
	if len(key) > maxIdempotencyKeyLength {
		return errorAnswer(http.StatusBadRequest, NameInvalidIdempotencyKey, "The key must be between 1-256 chars."), nil
	}

	var params sendRequest
	if err := json.Unmarshal(req.Body, &params); err != nil {
		return errorAnswer(http.StatusUnprocessableEntity, NameValidationError, "Invalid JSON body: "+err.Error()), nil
	}
	to, problem := parseRecipients(params.To)
	if problem != "" {
		return errorAnswer(http.StatusUnprocessableEntity, NameValidationError, problem), nil
	}
	switch {
	case params.From == "":
		return errorAnswer(http.StatusUnprocessableEntity, NameMissingRequiredField, "Missing `from` field."), nil
	case len(to) == 0:
		return errorAnswer(http.StatusUnprocessableEntity, NameMissingRequiredField, "Missing `to` field."), nil
	case params.Subject == "":
		return errorAnswer(http.StatusUnprocessableEntity, NameMissingRequiredField, "Missing `subject` field."), nil
	case params.HTML == "" && params.Text == "":
		return errorAnswer(http.StatusUnprocessableEntity, NameMissingRequiredField, "Missing `html` or `text` field."), nil
	}

	hash := payloadHash(req.Body)
	if key != "" {
		if state, ok := s.keys[key]; ok {
			switch {
			case state.payloadHash != hash:
				return errorAnswer(http.StatusConflict, NameInvalidIdempotentRequest, "Same idempotency key used with a different request payload."), nil
			case state.inFlight:
				return errorAnswer(http.StatusConflict, NameConcurrentIdempotentRequests, "Same idempotency key used while original request is still in progress."), nil
			}
			return &answer{body: map[string]string{"id": state.id}, status: http.StatusOK}, nil
		}
	}

	id := newUUID()
	var state *keyState
	if key != "" {
		state = &keyState{id: id, inFlight: true, payloadHash: hash}
		s.keys[key] = state
	}
	commit := func() {
		if state != nil {
			state.inFlight = false
		}
		s.deliveries = append(s.deliveries, Delivery{
			From:           params.From,
			HTML:           params.HTML,
			Headers:        params.Headers,
			ID:             id,
			IdempotencyKey: key,
			ReceivedAt:     req.ReceivedAt,
			Subject:        params.Subject,
			Text:           params.Text,
			To:             to,
		})
	}
	return &answer{body: map[string]string{"id": id}, status: http.StatusOK}, commit
}

func (s *Server) write(w http.ResponseWriter, ans *answer) {
	if ans.drop {
		if hijacker, ok := w.(http.Hijacker); ok {
			if conn, _, err := hijacker.Hijack(); err == nil {
				_ = conn.Close()
				return
			}
		}
		panic(http.ErrAbortHandler) // closes the connection without an answer
	}

	if ans.retryAfter > 0 {
		seconds := int64((ans.retryAfter + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.FormatInt(seconds, 10))
		if ans.status == http.StatusTooManyRequests && s.config.RatePerSecond > 0 {
			w.Header().Set("Ratelimit-Limit", strconv.Itoa(s.config.RatePerSecond))
			w.Header().Set("Ratelimit-Remaining", "0")
			w.Header().Set("Ratelimit-Reset", strconv.FormatInt(seconds, 10))
		}
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(ans.status)
	_ = json.NewEncoder(w).Encode(ans.body)
}

// parseRecipients reads "to" as a string or an array of strings; problem is
// Resend's validation message when it is neither.
func parseRecipients(raw json.RawMessage) (to []string, problem string) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, ""
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		if strings.TrimSpace(one) == "" {
			return nil, ""
		}
		return []string{one}, ""
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, "Invalid `to` field: expected a string or an array of strings."
	}
	if len(many) > maxRecipients {
		return nil, "Invalid `to` field: at most " + strconv.Itoa(maxRecipients) + " recipients."
	}
	return slices.DeleteFunc(many, func(s string) bool { return strings.TrimSpace(s) == "" }), ""
}

// payloadHash hashes the body's JSON in a canonical form (keys sorted, no
// insignificant space), so the same payload encoded differently compares
// equal; a body that is not JSON is hashed as is.
func payloadHash(body []byte) [32]byte {
	var value any
	if err := json.Unmarshal(body, &value); err == nil {
		if canonical, err := json.Marshal(value); err == nil {
			body = canonical
		}
	}
	return sha256.Sum256(bytes.TrimSpace(body))
}

// newUUID returns a random (version 4) UUID, the form of Resend's ids.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand documents it)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
