package resendfake

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Event types of Resend's email webhooks.
const (
	EventSent            = "email.sent"
	EventDelivered       = "email.delivered"
	EventDeliveryDelayed = "email.delivery_delayed"
	EventBounced         = "email.bounced"
	EventComplained      = "email.complained"
	EventSuppressed      = "email.suppressed"
	EventFailed          = "email.failed"
	EventOpened          = "email.opened"
)

// Bounce types and sub-types Resend reports (after Amazon SES's).
const (
	BouncePermanent   = "Permanent"
	BounceTransient   = "Transient"
	BounceGeneral     = "General"
	BounceMailboxFull = "MailboxFull"
)

// EventOpts shape one webhook event. The zero value is a fresh delivery of an event created now.
type EventOpts struct {
	// ID is the delivery's svix-id, the same on every retry of one event; "" makes a new one.
	ID string
	// At is the event's created_at, the time Resend orders a mail's events by; zero is the
	// fake's now (Config.NowFunc). Resend gives it to the millisecond.
	At time.Time
	// SignedAt is the delivery's svix-timestamp; zero is the fake's now.
	SignedAt time.Time
	// BounceType and BounceSubType classify an email.bounced event; Permanent and General by
	// default.
	BounceType    string
	BounceSubType string
}

// Webhook is one webhook delivery as Resend makes it: its svix-id, the time it is signed at, and
// its JSON body. Change Body after Event to send another body under the same id (a forged
// replay), or SignedAt to sign it at another time (a stale delivery).
type Webhook struct {
	ID       string
	SignedAt time.Time
	Body     []byte
}

// WebhookSecret is the signing secret ("whsec_" and a base64 key) the fake signs webhooks with,
// the newest one after RotateWebhookSecret: RESEND_WEBHOOK_SECRET of the service under test. It
// is Config.WebhookSecret, or one the fake made.
func (s *Server) WebhookSecret() string {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.webhookSecrets[len(s.webhookSecrets)-1]
}

// RotateWebhookSecret makes a new signing secret and returns it. As Svix does for a day after a
// rotation, every webhook is then signed with both the previous secret and the new one (two
// "v1," entries); a second rotation drops the oldest.
func (s *Server) RotateWebhookSecret() string {
	secret := NewWebhookSecret()
	s.mu.Lock()
	defer s.mu.Unlock()

	s.webhookSecrets = append(s.webhookSecrets[len(s.webhookSecrets)-1:], secret)
	return secret
}

// NewWebhookSecret returns a new signing secret in Resend's form: "whsec_" and the base64 of 24
// random bytes.
func NewWebhookSecret() string {
	key := make([]byte, 24)
	_, _ = rand.Read(key) // never fails (crypto/rand documents it)
	return "whsec_" + base64.StdEncoding.EncodeToString(key)
}

// Event returns the webhook of an event of eventType about delivery (one the fake accepted, or
// one made up to name an email id the service does not know), its body shaped as Resend's:
//
//	{"type": "email.bounced", "created_at": "2026-03-01T12:00:00.123Z",
//	 "data": {"created_at": "…", "email_id": "…", "from": "…", "to": ["…"], "subject": "…",
//	          "bounce": {"message": "…", "subType": "General", "type": "Permanent"}}}
//
// email.bounced carries "bounce", email.suppressed "suppressed" and email.failed "failed"; their
// messages quote the recipient, as real ones may. Any other type gets the common data only.
func (s *Server) Event(delivery Delivery, eventType string, opts *EventOpts) *Webhook {
	if opts == nil {
		opts = &EventOpts{}
	}
	now := s.now()
	at, signedAt, id := opts.At, opts.SignedAt, opts.ID
	if at.IsZero() {
		at = now
	}
	if signedAt.IsZero() {
		signedAt = now
	}
	if id == "" {
		id = newWebhookID()
	}

	recipient := strings.Join(delivery.To, ", ")
	data := map[string]any{
		"created_at": delivery.ReceivedAt.UTC().Format("2006-01-02T15:04:05.999999-07:00"),
		"email_id":   delivery.ID,
		"from":       delivery.From,
		"to":         append([]string{}, delivery.To...),
		"subject":    delivery.Subject,
	}
	switch eventType {
	case EventBounced:
		bounceType, subType := opts.BounceType, opts.BounceSubType
		if bounceType == "" {
			bounceType = BouncePermanent
		}
		if subType == "" {
			subType = BounceGeneral
		}
		data["bounce"] = map[string]string{
			"message": "smtp; 550 5.1.1 <" + recipient + ">: Recipient address rejected: User unknown",
			"subType": subType,
			"type":    bounceType,
		}
	case EventSuppressed:
		data["suppressed"] = map[string]string{
			"message": "The address " + recipient + " is on the account's suppression list.",
			"type":    "OnAccountSuppressionList",
		}
	case EventFailed:
		data["failed"] = map[string]string{"reason": "reached_daily_quota"}
	}
	body, err := json.Marshal(map[string]any{
		"type":       eventType,
		"created_at": at.UTC().Format("2006-01-02T15:04:05.000Z"),
		"data":       data,
	})
	if err != nil {
		panic(err) // maps of strings always marshal
	}
	return &Webhook{ID: id, SignedAt: signedAt, Body: body}
}

// Signature returns the svix-signature of webhook: a "v1," entry per current secret (two after
// RotateWebhookSecret), separated by spaces.
func (s *Server) Signature(webhook *Webhook) string {
	s.mu.Lock()
	secrets := append([]string(nil), s.webhookSecrets...)
	s.mu.Unlock()

	entries := make([]string, 0, len(secrets))
	for _, secret := range secrets {
		entry, err := SignWebhook(secret, webhook.ID, webhook.SignedAt.Unix(), webhook.Body)
		if err != nil {
			panic(err) // the fake's secrets are well formed
		}
		entries = append(entries, entry)
	}
	return strings.Join(entries, " ")
}

// SignWebhook is one signature as Svix makes it for Resend: "v1," and the base64 of
// HMAC-SHA256(key, id + "." + timestamp + "." + body), where key is the base64 after the secret's
// "whsec_".
func SignWebhook(secret, id string, timestamp int64, body []byte) (string, error) {
	return SignWebhookHeader(secret, id, strconv.FormatInt(timestamp, 10), body)
}

// SignWebhookHeader is SignWebhook over a svix-timestamp header as written, whatever it holds
// ("+1700000000", "01700000000"): what a sender would sign to see whether a verifier reads the
// header as Svix defines it (decimal seconds) or more leniently.
func SignWebhookHeader(secret, id, timestamp string, body []byte) (string, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil || !strings.HasPrefix(secret, "whsec_") {
		return "", errors.New(`resendfake: a signing secret is "whsec_" and base64`)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + timestamp + "."))
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)), nil
}

// WebhookRequest returns webhook as Resend posts it to url (an absolute URL, or a path for a
// handler called directly): its body, Content-Type application/json and the headers svix-id,
// svix-timestamp and svix-signature.
func (s *Server) WebhookRequest(ctx context.Context, url string, webhook *Webhook) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(webhook.Body))
	if err != nil {
		return nil, fmt.Errorf("resendfake: error making webhook request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "Svix-Webhooks/1.0")
	req.Header.Set("svix-id", webhook.ID)
	req.Header.Set("svix-timestamp", strconv.FormatInt(webhook.SignedAt.Unix(), 10))
	req.Header.Set("svix-signature", s.Signature(webhook))
	return req, nil
}

// SendWebhook posts webhook to url, an absolute URL, and returns the answer's status.
func (s *Server) SendWebhook(ctx context.Context, url string, webhook *Webhook) (int, error) {
	req, err := s.WebhookRequest(ctx, url, webhook)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("resendfake: error sending webhook: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// newWebhookID returns a new svix-id in Svix's form, "msg_" and random characters.
func newWebhookID() string {
	return "msg_" + strings.ToLower(rand.Text())
}
