package main

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Routes the load sends.
const (
	routeRegister           = "/v1/auth/register"
	routeForgotPassword     = "/v1/auth/forgot-password" //nolint:gosec // G101: a route, not a credential
	routeResendVerification = "/v1/auth/resend-verification"
)

// answer is one request of the soak and what came back.
type answer struct {
	route      string
	api        int // index of the api process
	status     int // 0 on a transport error
	retryAfter string
	transport  error
	start, end time.Time
}

// registration is an accepted (201) registration.
type registration struct {
	id    int64
	email string
}

// burst is one limit check: many forgot-password requests from one IP, spread over every api
// process at once.
type burst struct {
	at         time.Time
	sent       int
	admitted   int // 202
	refused    int // 429
	unknown    int // 503 or a transport error: spent or not, no one can tell
	straddles  bool
	limit      int
	windowSize time.Duration
}

// clean says every request of the burst got a definite answer: then exactly the limit passed.
func (b *burst) clean() bool { return b.unknown == 0 && !b.straddles }

// recorder collects answers, registrations and bursts from every goroutine.
type recorder struct {
	mu            sync.Mutex
	answers       []answer
	registrations []registration
	bursts        []burst
}

func (r *recorder) add(a answer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answers = append(r.answers, a)
}

func (r *recorder) addRegistration(reg registration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.registrations = append(r.registrations, reg)
}

func (r *recorder) addBurst(b burst) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.bursts = append(r.bursts, b)
}

// knownEmail returns an accepted registration's email, or "" before the first.
func (r *recorder) knownEmail(rng *rand.Rand) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.registrations) == 0 {
		return ""
	}
	return r.registrations[rng.IntN(len(r.registrations))].email
}

// loader drives the api processes over HTTP, as clients behind a trusted proxy: each request
// carries its own client IP in X-Forwarded-For.
type loader struct {
	apis     []*process
	client   *http.Client
	recorder *recorder
	runID    string
	emails   atomic.Int64
	ips      atomic.Uint32
}

func newLoader(apis []*process, clients int, recorder *recorder) *loader {
	var id [4]byte
	_, _ = crand.Read(id[:]) // never fails, per crypto/rand
	return &loader{
		apis: apis,
		client: &http.Client{
			// Far above the service's request deadline (10 s): a transport error is a process
			// going away, not a slow answer.
			Timeout:   time.Minute,
			Transport: &http.Transport{MaxIdleConnsPerHost: clients + 64},
		},
		recorder: recorder,
		runID:    fmt.Sprintf("%x", id),
	}
}

// freshIP returns a client IP no request of the run used before (10.0.0.0/8, then onwards).
func (l *loader) freshIP() string {
	var ip [4]byte
	binary.BigEndian.PutUint32(ip[:], 10<<24+l.ips.Add(1))
	return fmt.Sprintf("%d.%d.%d.%d", ip[0], ip[1], ip[2], ip[3])
}

func (l *loader) freshEmail() string {
	return fmt.Sprintf("soak-%s-%d@example.com", l.runID, l.emails.Add(1))
}

// send posts body to route on api i from ip, records the answer, and returns it with the body.
func (l *loader) send(ctx context.Context, i int, route, ip, body string) (answer, []byte) {
	a := answer{route: route, api: i, start: time.Now()}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.apis[i].URL()+route, strings.NewReader(body))
	if err != nil {
		panic(err) // a constant method and a valid URL
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-For", ip)
	var data []byte
	resp, err := l.client.Do(req)
	if err == nil {
		data, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		a.status = resp.StatusCode
		a.retryAfter = resp.Header.Get("Retry-After")
	}
	if a.status == 0 {
		a.transport = err
	}
	a.end = time.Now()
	if ctx.Err() == nil { // a request the soak itself cut short says nothing of the service
		l.recorder.add(a)
	}
	return a, data
}

// runClient runs one load client until ctx ends: mostly registrations (each a welcome and a
// verification mail), and forgot-password and resend-verification for known and unknown emails.
func (l *loader) runClient(ctx context.Context, n int) {
	rng := rand.New(rand.NewPCG(uint64(n), uint64(time.Now().UnixNano()))) //nolint:gosec // load mix, not secrets
	for i := n; ctx.Err() == nil; i++ {
		api := i % len(l.apis)
		ip := l.freshIP()
		var a answer
		switch pick := rng.IntN(10); {
		case pick < 6:
			email := l.freshEmail()
			var body []byte
			a, body = l.send(ctx, api, routeRegister, ip, `{"email":"`+email+`","password":"correct horse battery"}`)
			if a.status == http.StatusCreated {
				var created struct {
					ID int64 `json:"id"`
				}
				if json.Unmarshal(body, &created) == nil {
					l.recorder.addRegistration(registration{id: created.ID, email: email})
				}
			}
		case pick < 8:
			email := l.recorder.knownEmail(rng)
			if email == "" || rng.IntN(2) == 0 {
				email = l.freshEmail() // unknown: no account
			}
			a, _ = l.send(ctx, api, routeForgotPassword, ip, `{"email":"`+email+`"}`)
		default:
			email := l.recorder.knownEmail(rng)
			if email == "" {
				email = l.freshEmail()
			}
			a, _ = l.send(ctx, api, routeResendVerification, ip, `{"email":"`+email+`"}`)
		}
		if a.status != http.StatusCreated && a.status != http.StatusAccepted {
			// As a client honouring Retry-After would, a little: an outage is not hammered.
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// burst spends one IP's forgot-password limit from every api process at once: 3 × limit
// requests, round-robin, for unknown emails (no mail), all in flight together.
func (l *loader) burst(ctx context.Context, limit int, window time.Duration) burst {
	ip := l.freshIP()
	b := burst{at: time.Now(), sent: 3 * limit, limit: limit, windowSize: window}
	answers := make([]answer, b.sent)
	var wg sync.WaitGroup
	for i := range b.sent {
		wg.Go(func() {
			answers[i], _ = l.send(ctx, i%len(l.apis), routeForgotPassword, ip, `{"email":"`+l.freshEmail()+`"}`)
		})
	}
	wg.Wait()
	end := time.Now()
	// Fixed windows: a burst across a window's end may pass the limit in each.
	b.straddles = b.at.Truncate(window) != end.Truncate(window)
	for _, a := range answers {
		switch a.status {
		case http.StatusAccepted:
			b.admitted++
		case http.StatusTooManyRequests:
			b.refused++
		default:
			b.unknown++
		}
	}
	return b
}
