package mail

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/resend/resend-go/v2"
)

// The types of Resend's email events that postguard follows. Any other type (email.opened,
// email.clicked, contact.*, domain.*…) is read but changes nothing.
const (
	ResendEventSent            = "email.sent"
	ResendEventDelivered       = "email.delivered"
	ResendEventDeliveryDelayed = "email.delivery_delayed"
	ResendEventBounced         = "email.bounced"
	ResendEventComplained      = "email.complained"
	ResendEventSuppressed      = "email.suppressed"
	ResendEventFailed          = "email.failed"
)

// BounceTypePermanent is the bounce type of an address that will never take mail (Resend's,
// after Amazon SES's: Permanent, Transient or Undetermined).
const BounceTypePermanent = "Permanent"

const (
	// webhookSecretPrefix starts every Svix signing secret; the rest is its key in base64.
	webhookSecretPrefix = "whsec_"
	// minWebhookKeyBytes is the shortest key accepted: Svix's own are 24 bytes.
	minWebhookKeyBytes = 16
	// maxWebhookIDBytes bounds a svix-id, which postguard stores (Svix's are about 30 bytes).
	maxWebhookIDBytes = 256
)

// ErrWebhookSignature is returned (wrapped) by ResendWebhookVerifier.Verify for a delivery whose
// signature is missing, does not match, or whose timestamp is more than five minutes away.
var ErrWebhookSignature = errors.New("webhook signature missing, invalid or stale")

// ErrMalformedEvent is returned (wrapped) by ParseResendEvent for a body that is not a Resend
// event.
var ErrMalformedEvent = errors.New("malformed webhook event")

// CheckResendWebhookSecret says whether secret is a webhook signing secret as Resend gives them
// (RESEND_WEBHOOK_SECRET): "whsec_" then the base64 of a key of at least 16 bytes.
func CheckResendWebhookSecret(secret string) error {
	encoded, ok := strings.CutPrefix(secret, webhookSecretPrefix)
	if !ok {
		return errors.New(`a webhook signing secret starts with "whsec_" (copy it from the webhook's page in Resend)`)
	}
	key, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		return errors.New(`what follows "whsec_" is not base64`)
	}
	if len(key) < minWebhookKeyBytes {
		return fmt.Errorf("the key is %d bytes; a webhook signing secret holds at least %d", len(key), minWebhookKeyBytes)
	}
	return nil
}

// ResendWebhookVerifier checks that a webhook delivery comes from Resend: its Svix signature
// (headers svix-id, svix-timestamp, svix-signature) over the raw body, with resend-go's own
// verifier. A delivery passes when any of the signature's "v1," entries matches (Svix signs with
// the old and the new secret for a while after a rotation) and its timestamp is within five
// minutes of this machine's clock, so a captured delivery cannot be replayed later. The headers
// must have Svix's syntax, which resend-go reads more leniently: only "v1," entries are handed
// to it (it would compare whatever follows the first comma of "v1a,", "v2," or ","), and
// svix-timestamp must be decimal seconds as Svix writes them (it would take "+1700000000" or
// "01700000000"). It is safe for concurrent use.
type ResendWebhookVerifier struct {
	secret   string
	webhooks resend.WebhooksSvc
}

// NewResendWebhookVerifier returns a verifier for secret, which CheckResendWebhookSecret must
// accept.
func NewResendWebhookVerifier(secret string) (*ResendWebhookVerifier, error) {
	if err := CheckResendWebhookSecret(secret); err != nil {
		return nil, fmt.Errorf("invalid webhook signing secret: %w", err)
	}
	// Verify makes no request: the client is only what resend-go hangs its verifier on.
	return &ResendWebhookVerifier{secret: secret, webhooks: resend.NewClient("").Webhooks}, nil
}

// Verify checks the signature of a delivery with header and body, and returns its svix-id, the
// delivery's id (the same on every retry of one event). Every refusal wraps
// ErrWebhookSignature.
func (v *ResendWebhookVerifier) Verify(header http.Header, body []byte) (string, error) {
	id := header.Get("svix-id")
	if len(id) > maxWebhookIDBytes {
		return "", fmt.Errorf("%w: svix-id longer than %d bytes", ErrWebhookSignature, maxWebhookIDBytes)
	}
	timestamp := header.Get("svix-timestamp")
	if !decimalSeconds(timestamp) {
		return "", fmt.Errorf("%w: svix-timestamp is not decimal seconds", ErrWebhookSignature)
	}
	signatures := v1Signatures(header.Get("svix-signature"))
	if signatures == "" {
		return "", fmt.Errorf(`%w: svix-signature has no "v1," entry`, ErrWebhookSignature)
	}
	err := v.webhooks.Verify(&resend.VerifyWebhookOptions{
		Payload: string(body),
		Headers: resend.WebhookHeaders{
			Id:        id,
			Timestamp: timestamp,
			Signature: signatures,
		},
		WebhookSecret: v.secret,
	})
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrWebhookSignature, err)
	}
	return id, nil
}

// decimalSeconds says s is a svix-timestamp as Svix writes it: Unix seconds in decimal, without
// sign, spaces or leading zeros, that fit an int64.
func decimalSeconds(s string) bool {
	if s == "" || s[0] == '0' && s != "0" {
		return false
	}
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	_, err := strconv.ParseInt(s, 10, 64)
	return err == nil
}

// v1Signatures keeps the "v1," entries of a svix-signature header (space-separated, as Svix
// writes them; empty entries between doubled spaces are skipped, as Svix skips them), and
// drops every other: another version's signature is not ours to check.
func v1Signatures(header string) string {
	var entries []string
	for entry := range strings.SplitSeq(header, " ") {
		if sig, ok := strings.CutPrefix(entry, "v1,"); ok && sig != "" {
			entries = append(entries, entry)
		}
	}
	return strings.Join(entries, " ")
}

// ResendEvent is a Resend webhook event, the fields postguard reads of it. Resend sends
// {"type", "created_at", "data"}; for email events data names the mail (email_id), its
// recipient (to, an array of one address since Resend sends one event per recipient), and, by
// type, the bounce, the suppression or the failure.
type ResendEvent struct {
	// Type is the event's type, such as email.delivered.
	Type string
	// CreatedAt is when Resend created the event: what orders the events of one mail.
	CreatedAt time.Time
	// EmailID is the id Resend answered the send with; "" for an event of another kind.
	EmailID string
	// To is the mail's recipients.
	To []string
	// Bounce is the classification of an email.bounced event; nil for other types.
	Bounce *ResendBounce
	// Suppressed is the classification of an email.suppressed event; nil for other types.
	Suppressed *ResendSuppressed
}

// ResendBounce is Resend's classification of a bounce (its free-form message, which may quote
// the address, is not kept).
type ResendBounce struct {
	// Type is Permanent, Transient or Undetermined.
	Type string `json:"type"`
	// SubType refines it: General, NoEmail, Suppressed, MailboxFull, MessageTooLarge…
	SubType string `json:"subType"`
}

// Permanent says the address will never take mail.
func (b *ResendBounce) Permanent() bool { return b != nil && b.Type == BounceTypePermanent }

// ResendSuppressed is Resend's classification of a mail it would not send (the address is on
// its own suppression list); its message is not kept.
type ResendSuppressed struct {
	Type string `json:"type"`
}

// resendEventJSON is the JSON of an event, as Resend sends it.
type resendEventJSON struct {
	Type      string `json:"type"`
	CreatedAt string `json:"created_at"`
	Data      struct {
		EmailID    string            `json:"email_id"`
		To         json.RawMessage   `json:"to"`
		Bounce     *ResendBounce     `json:"bounce"`
		Suppressed *ResendSuppressed `json:"suppressed"`
	} `json:"data"`
}

// ParseResendEvent reads a webhook delivery's body. It needs a type and a created_at (RFC 3339);
// an email event of a type postguard follows needs its email_id too. Other fields and unknown
// members are ignored, so that new ones Resend adds do not break it. Every refusal wraps
// ErrMalformedEvent.
func ParseResendEvent(body []byte) (*ResendEvent, error) {
	var raw resendEventJSON
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformedEvent, err)
	}
	if raw.Type == "" {
		return nil, fmt.Errorf("%w: no type", ErrMalformedEvent)
	}
	createdAt, err := time.Parse(time.RFC3339Nano, raw.CreatedAt)
	if err != nil {
		return nil, fmt.Errorf("%w: created_at %q is not an RFC 3339 time", ErrMalformedEvent, raw.CreatedAt)
	}
	to, err := parseTo(raw.Data.To)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformedEvent, err)
	}
	event := &ResendEvent{
		Type:       raw.Type,
		CreatedAt:  createdAt.UTC(),
		EmailID:    raw.Data.EmailID,
		To:         to,
		Bounce:     raw.Data.Bounce,
		Suppressed: raw.Data.Suppressed,
	}
	if FollowedResendEvent(event.Type) && event.EmailID == "" {
		return nil, fmt.Errorf("%w: %s without data.email_id", ErrMalformedEvent, event.Type)
	}
	return event, nil
}

// FollowedResendEvent says postguard follows events of type: the ResendEvent* constants.
func FollowedResendEvent(eventType string) bool {
	switch eventType {
	case ResendEventSent, ResendEventDelivered, ResendEventDeliveryDelayed, ResendEventBounced,
		ResendEventComplained, ResendEventSuppressed, ResendEventFailed:
		return true
	}
	return false
}

// parseTo reads data.to: an array of addresses, or (leniently) one address.
func parseTo(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err == nil {
		return many, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err != nil {
		return nil, errors.New("data.to is neither an address nor an array of addresses")
	}
	return []string{one}, nil
}
