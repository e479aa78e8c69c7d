package mail

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/jobs/mail/resendfake"
)

func TestCheckResendWebhookSecret(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		secret string
		ok     bool
	}{
		{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", true}, // Svix's documented example, 24 bytes
		{resendfake.NewWebhookSecret(), true},
		{"whsec_AAAAAAAAAAAAAAAAAAAAAA==", true}, // 16 bytes
		{"", false},
		{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", false}, // no prefix
		{"whsec_", false},
		{"whsec_AAAAAAAAAAAAAAAAAAAA", false},             // 15 bytes
		{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2La!aSw", false}, // not base64
		{"re_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", false},    // an API key
	} {
		err := CheckResendWebhookSecret(tt.secret)
		if tt.ok {
			require.NoError(t, err, tt.secret)
		} else {
			require.Error(t, err, tt.secret)
		}
	}
	_, err := NewResendWebhookVerifier("whsec_short")
	require.Error(t, err)
}

func TestResendWebhookVerifier_Verify(t *testing.T) {
	t.Parallel()

	delivery := resendfake.Delivery{ID: "re_1", From: "App <a@example.com>", To: []string{"ada@example.com"}, Subject: "Hi", ReceivedAt: time.Now()}
	setup := func(t *testing.T) (*resendfake.Server, *ResendWebhookVerifier) {
		t.Helper()
		fake := resendfake.New(t, nil)
		verifier, err := NewResendWebhookVerifier(fake.WebhookSecret())
		require.NoError(t, err)
		return fake, verifier
	}
	// headers are the fake's signed headers of webhook, changed by change.
	headers := func(t *testing.T, fake *resendfake.Server, webhook *resendfake.Webhook) http.Header {
		t.Helper()
		req, err := fake.WebhookRequest(t.Context(), "/hook", webhook)
		require.NoError(t, err)
		return req.Header
	}

	t.Run("Signed", func(t *testing.T) {
		t.Parallel()

		fake, verifier := setup(t)
		webhook := fake.Event(delivery, resendfake.EventDelivered, nil)
		id, err := verifier.Verify(headers(t, fake, webhook), webhook.Body)
		require.NoError(t, err)
		require.Equal(t, webhook.ID, id)
	})

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()

		for _, tt := range []struct {
			name   string
			change func(fake *resendfake.Server, webhook *resendfake.Webhook, h http.Header) []byte
		}{
			{"BodyChanged", func(_ *resendfake.Server, w *resendfake.Webhook, _ http.Header) []byte {
				return append(append([]byte{}, w.Body...), ' ')
			}},
			{"IDChanged", func(_ *resendfake.Server, w *resendfake.Webhook, h http.Header) []byte {
				h.Set("svix-id", "msg_other")
				return w.Body
			}},
			{"TimestampChanged", func(_ *resendfake.Server, w *resendfake.Webhook, h http.Header) []byte {
				h.Set("svix-timestamp", strconv.FormatInt(w.SignedAt.Unix()+1, 10))
				return w.Body
			}},
			{"NoSignature", func(_ *resendfake.Server, w *resendfake.Webhook, h http.Header) []byte {
				h.Del("svix-signature")
				return w.Body
			}},
			{"NoID", func(_ *resendfake.Server, w *resendfake.Webhook, h http.Header) []byte {
				h.Del("svix-id")
				return w.Body
			}},
			{"NoTimestamp", func(_ *resendfake.Server, w *resendfake.Webhook, h http.Header) []byte {
				h.Del("svix-timestamp")
				return w.Body
			}},
			{"EmptyBody", func(_ *resendfake.Server, _ *resendfake.Webhook, _ http.Header) []byte { return nil }},
			{"SignatureWithoutVersion", func(_ *resendfake.Server, w *resendfake.Webhook, h http.Header) []byte {
				h.Set("svix-signature", h.Get("svix-signature")[len("v1,"):])
				return w.Body
			}},
			{"OtherSecret", func(_ *resendfake.Server, w *resendfake.Webhook, h http.Header) []byte {
				entry, _ := resendfake.SignWebhook(resendfake.NewWebhookSecret(), w.ID, w.SignedAt.Unix(), w.Body)
				h.Set("svix-signature", entry)
				return w.Body
			}},
			{"LongID", func(_ *resendfake.Server, w *resendfake.Webhook, h http.Header) []byte {
				h.Set("svix-id", string(make([]byte, 300)))
				return w.Body
			}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()

				fake, verifier := setup(t)
				webhook := fake.Event(delivery, resendfake.EventDelivered, nil)
				h := headers(t, fake, webhook)
				body := tt.change(fake, webhook, h)
				_, err := verifier.Verify(h, body)
				require.ErrorIs(t, err, ErrWebhookSignature)
			})
		}
	})

	// Svix's syntax, and no more: a signature entry counts only as "v1," and its base64 (other
	// versions are not ours to read, and a bare or unversioned entry is no signature), and
	// svix-timestamp is decimal seconds as Svix writes it. Each delivery here is signed with the
	// right secret over exactly the headers it carries, so only the syntax can refuse it.
	t.Run("Syntax", func(t *testing.T) {
		t.Parallel()

		fake, verifier := setup(t)
		webhook := fake.Event(delivery, resendfake.EventDelivered, nil)
		ts := strconv.FormatInt(webhook.SignedAt.Unix(), 10)
		signed := func(t *testing.T, timestamp string) string {
			t.Helper()
			entry, err := resendfake.SignWebhookHeader(fake.WebhookSecret(), webhook.ID, timestamp, webhook.Body)
			require.NoError(t, err)
			return strings.TrimPrefix(entry, "v1,")
		}
		sig := signed(t, ts)
		for _, tt := range []struct {
			name, timestamp, signature string
			ok                         bool
		}{
			{"V1", ts, "v1," + sig, true},
			{"V1AmongOthers", ts, "v1a," + sig + " v2,AAAA v1," + sig, true},
			{"ExtraSpaces", ts, "  v1," + sig + "  ", true},
			{"V1a", ts, "v1a," + sig, false},
			{"V2", ts, "v2," + sig, false},
			{"UpperCaseV1", ts, "V1," + sig, false},
			{"NoVersion", ts, "," + sig, false},
			{"Bare", ts, sig, false},
			{"CommaAlone", ts, ",", false},
			{"V1Empty", ts, "v1,", false},
			{"V1WithMore", ts, "v1," + sig + ",x", false},
			{"PlusTimestamp", "+" + ts, "v1," + signed(t, "+"+ts), false},
			{"LeadingZeros", "000" + ts, "v1," + signed(t, "000"+ts), false},
			{"LeadingSpace", " " + ts, "v1," + signed(t, " "+ts), false},
			{"TrailingSpace", ts + " ", "v1," + signed(t, ts+" "), false},
			{"Fraction", ts + ".0", "v1," + signed(t, ts+".0"), false},
			{"Exponent", "1.7e9", "v1," + signed(t, "1.7e9"), false},
			{"Hex", "0x" + strconv.FormatInt(webhook.SignedAt.Unix(), 16), "v1," + signed(t, "0x"+strconv.FormatInt(webhook.SignedAt.Unix(), 16)), false},
			{"Empty", "", "v1," + signed(t, ""), false},
		} {
			t.Run(tt.name, func(t *testing.T) {
				h := headers(t, fake, webhook)
				h.Set("svix-timestamp", tt.timestamp)
				h["Svix-Signature"] = []string{tt.signature} // as written, spaces included
				_, err := verifier.Verify(h, webhook.Body)
				if tt.ok {
					require.NoError(t, err)
				} else {
					require.ErrorIs(t, err, ErrWebhookSignature)
				}
			})
		}
	})

	t.Run("Stale", func(t *testing.T) {
		t.Parallel()

		// Signed six minutes ago, or six minutes ahead: outside the five minutes' tolerance.
		// Four minutes either way is within it.
		fake, verifier := setup(t)
		for _, tt := range []struct {
			offset time.Duration
			ok     bool
		}{
			{-6 * time.Minute, false},
			{6 * time.Minute, false},
			{-4 * time.Minute, true},
			{4 * time.Minute, true},
		} {
			webhook := fake.Event(delivery, resendfake.EventDelivered, &resendfake.EventOpts{SignedAt: time.Now().Add(tt.offset)})
			_, err := verifier.Verify(headers(t, fake, webhook), webhook.Body)
			if tt.ok {
				require.NoError(t, err, tt.offset)
			} else {
				require.ErrorIs(t, err, ErrWebhookSignature, tt.offset)
			}
		}
	})

	t.Run("Rotated", func(t *testing.T) {
		t.Parallel()

		// After a rotation each delivery carries two signatures: a verifier on either secret
		// takes it, one on a third secret does not.
		fake, oldVerifier := setup(t)
		newVerifier, err := NewResendWebhookVerifier(fake.RotateWebhookSecret())
		require.NoError(t, err)
		otherVerifier, err := NewResendWebhookVerifier(resendfake.NewWebhookSecret())
		require.NoError(t, err)

		webhook := fake.Event(delivery, resendfake.EventDelivered, nil)
		h := headers(t, fake, webhook)
		require.Len(t, strings.Fields(h.Get("svix-signature")), 2)
		_, err = oldVerifier.Verify(h, webhook.Body)
		require.NoError(t, err)
		_, err = newVerifier.Verify(h, webhook.Body)
		require.NoError(t, err)
		_, err = otherVerifier.Verify(h, webhook.Body)
		require.ErrorIs(t, err, ErrWebhookSignature)
	})
}

func TestParseResendEvent(t *testing.T) {
	t.Parallel()

	t.Run("ResendExample", func(t *testing.T) {
		t.Parallel()

		// The email.bounced example of Resend's changelog on webhook events.
		event, err := ParseResendEvent([]byte(`{"type": "email.bounced","created_at": "2024-11-22T23:41:12.126Z","data": {"broadcast_id": "8b146471-e88e-4322-86af-016cd36fd216","created_at": "2024-11-22T23:41:11.894719+00:00","email_id": "56761188-7520-42d8-8898-ff6fc54ce618","from": "Acme <onboarding@resend.dev>","to": ["delivered@resend.dev"],"subject": "Sending this example","template_id": "43f68331-0622-4e15-8202-246a0388854b","bounce": {"message": "The recipient's email address is on the suppression list because it has a recent history of producing hard bounces.","subType": "Suppressed","type": "Permanent"},"tags": {"category": "confirm_email"}}}`))
		require.NoError(t, err)
		require.Equal(t, ResendEventBounced, event.Type)
		require.True(t, time.Date(2024, 11, 22, 23, 41, 12, 126_000_000, time.UTC).Equal(event.CreatedAt))
		require.Equal(t, time.UTC, event.CreatedAt.Location())
		require.Equal(t, "56761188-7520-42d8-8898-ff6fc54ce618", event.EmailID)
		require.Equal(t, []string{"delivered@resend.dev"}, event.To)
		require.Equal(t, &ResendBounce{Type: "Permanent", SubType: "Suppressed"}, event.Bounce)
		require.True(t, event.Bounce.Permanent())
		require.Nil(t, event.Suppressed)
	})

	t.Run("FakeEvents", func(t *testing.T) {
		t.Parallel()

		fake := resendfake.New(t, nil)
		delivery := resendfake.Delivery{ID: "re_1", To: []string{"ada@example.com"}, ReceivedAt: time.Now()}
		for _, tt := range []struct {
			eventType string
			opts      *resendfake.EventOpts
			check     func(t *testing.T, event *ResendEvent)
		}{
			{resendfake.EventDelivered, nil, func(t *testing.T, e *ResendEvent) { require.Nil(t, e.Bounce) }},
			{resendfake.EventBounced, &resendfake.EventOpts{BounceType: resendfake.BounceTransient, BounceSubType: resendfake.BounceMailboxFull}, func(t *testing.T, e *ResendEvent) {
				require.Equal(t, &ResendBounce{Type: "Transient", SubType: "MailboxFull"}, e.Bounce)
				require.False(t, e.Bounce.Permanent())
			}},
			{resendfake.EventSuppressed, nil, func(t *testing.T, e *ResendEvent) {
				require.Equal(t, &ResendSuppressed{Type: "OnAccountSuppressionList"}, e.Suppressed)
			}},
			{resendfake.EventFailed, nil, func(t *testing.T, e *ResendEvent) { require.Nil(t, e.Suppressed) }},
		} {
			webhook := fake.Event(delivery, tt.eventType, tt.opts)
			event, err := ParseResendEvent(webhook.Body)
			require.NoError(t, err, tt.eventType)
			require.Equal(t, tt.eventType, event.Type)
			require.Equal(t, "re_1", event.EmailID)
			require.Equal(t, []string{"ada@example.com"}, event.To)
			tt.check(t, event)
		}
	})

	t.Run("Lenient", func(t *testing.T) {
		t.Parallel()

		for _, tt := range []struct {
			name string
			body string
			to   []string
		}{
			{"ToAsString", `{"type":"email.delivered","created_at":"2026-03-01T12:00:00Z","data":{"email_id":"re_1","to":"ada@example.com"}}`, []string{"ada@example.com"}},
			{"NoTo", `{"type":"email.delivered","created_at":"2026-03-01T12:00:00+01:00","data":{"email_id":"re_1"}}`, nil},
			{"UnknownTypeWithoutEmailID", `{"type":"contact.created","created_at":"2026-03-01T12:00:00Z","data":{"id":"c_1","email":"ada@example.com"}}`, nil},
			{"NewFields", `{"type":"email.delivered","created_at":"2026-03-01T12:00:00Z","data":{"email_id":"re_1","to":["a@example.com"],"next_year":{"x":1}},"extra":true}`, []string{"a@example.com"}},
		} {
			event, err := ParseResendEvent([]byte(tt.body))
			require.NoError(t, err, tt.name)
			require.Equal(t, tt.to, event.To, tt.name)
		}
	})

	t.Run("Malformed", func(t *testing.T) {
		t.Parallel()

		for _, tt := range []struct {
			name string
			body string
		}{
			{"NotJSON", `type=email.delivered`},
			{"Array", `[{"type":"email.delivered"}]`},
			{"NoType", `{"created_at":"2026-03-01T12:00:00Z","data":{"email_id":"re_1"}}`},
			{"NoCreatedAt", `{"type":"email.delivered","data":{"email_id":"re_1"}}`},
			{"BadCreatedAt", `{"type":"email.delivered","created_at":"yesterday","data":{"email_id":"re_1"}}`},
			{"FollowedTypeWithoutEmailID", `{"type":"email.bounced","created_at":"2026-03-01T12:00:00Z","data":{"to":["a@example.com"]}}`},
			{"ToOfNumbers", `{"type":"email.delivered","created_at":"2026-03-01T12:00:00Z","data":{"email_id":"re_1","to":[1,2]}}`},
			{"BounceNotAnObject", `{"type":"email.bounced","created_at":"2026-03-01T12:00:00Z","data":{"email_id":"re_1","bounce":"hard"}}`},
		} {
			_, err := ParseResendEvent([]byte(tt.body))
			require.ErrorIs(t, err, ErrMalformedEvent, tt.name)
		}
	})
}
