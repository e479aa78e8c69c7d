package resendfake

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSignWebhook(t *testing.T) {
	t.Parallel()

	t.Run("SvixDocumentedExample", func(t *testing.T) {
		t.Parallel()

		// The example of Svix's documentation on verifying payloads: the fake signs as Svix does,
		// not merely as the service under test checks.
		got, err := SignWebhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, []byte(`{"test": 2432232314}`))
		require.NoError(t, err)
		require.Equal(t, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", got)
	})

	t.Run("MalformedSecret", func(t *testing.T) {
		t.Parallel()

		for _, secret := range []string{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_not base64!"} {
			_, err := SignWebhook(secret, "msg_1", 1, []byte("{}"))
			require.Error(t, err, secret)
		}
	})
}

func TestServer_Webhooks(t *testing.T) {
	t.Parallel()

	now := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	newServer := func(t *testing.T) *Server {
		t.Helper()
		return New(t, &Config{NowFunc: func() time.Time { return now }})
	}
	delivery := Delivery{
		ID:         "4ef9a417-02e9-4d39-ad75-9611e0fcc33c",
		From:       "Postguard <no-reply@example.com>",
		To:         []string{"ada@example.com"},
		Subject:    "Verify your email",
		ReceivedAt: now.Add(-time.Second),
	}
	decode := func(t *testing.T, webhook *Webhook) map[string]any {
		t.Helper()
		var body map[string]any
		require.NoError(t, json.Unmarshal(webhook.Body, &body))
		return body
	}

	t.Run("EventShapes", func(t *testing.T) {
		t.Parallel()

		server := newServer(t)
		for _, tt := range []struct {
			eventType string
			opts      *EventOpts
			extra     string
			want      map[string]any
		}{
			{EventDelivered, nil, "", nil},
			{EventDeliveryDelayed, nil, "", nil},
			{EventComplained, nil, "", nil},
			{EventBounced, nil, "bounce", map[string]any{"type": "Permanent", "subType": "General"}},
			{EventBounced, &EventOpts{BounceType: BounceTransient, BounceSubType: BounceMailboxFull}, "bounce", map[string]any{"type": "Transient", "subType": "MailboxFull"}},
			{EventSuppressed, nil, "suppressed", map[string]any{"type": "OnAccountSuppressionList"}},
			{EventFailed, nil, "failed", map[string]any{"reason": "reached_daily_quota"}},
		} {
			webhook := server.Event(delivery, tt.eventType, tt.opts)
			body := decode(t, webhook)
			require.Equal(t, tt.eventType, body["type"])
			require.Equal(t, "2026-03-01T12:00:00.123Z", body["created_at"], "Resend's milliseconds")
			data := body["data"].(map[string]any)
			require.Equal(t, delivery.ID, data["email_id"])
			require.Equal(t, []any{"ada@example.com"}, data["to"])
			require.Equal(t, delivery.From, data["from"])
			require.Equal(t, delivery.Subject, data["subject"])
			require.Equal(t, "2026-03-01T11:59:59.123456+00:00", data["created_at"])
			if tt.extra == "" {
				require.Len(t, data, 5, "the common fields only: %v", data)
				continue
			}
			extra := data[tt.extra].(map[string]any)
			for k, v := range tt.want {
				require.Equal(t, v, extra[k], "%s.%s", tt.extra, k)
			}
			require.True(t, strings.HasPrefix(webhook.ID, "msg_"))
			require.True(t, webhook.SignedAt.Equal(now))
		}
	})

	t.Run("EventOpts", func(t *testing.T) {
		t.Parallel()

		server := newServer(t)
		at, signedAt := now.Add(-time.Hour), now.Add(-10*time.Minute)
		webhook := server.Event(delivery, EventDelivered, &EventOpts{ID: "msg_fixed", At: at, SignedAt: signedAt})
		require.Equal(t, "msg_fixed", webhook.ID)
		require.True(t, webhook.SignedAt.Equal(signedAt))
		require.Equal(t, "2026-03-01T11:00:00.123Z", decode(t, webhook)["created_at"])

		require.NotEqual(t, server.Event(delivery, EventDelivered, nil).ID, server.Event(delivery, EventDelivered, nil).ID)
	})

	t.Run("SendWebhookSigns", func(t *testing.T) {
		t.Parallel()

		server := newServer(t)
		var got *http.Request
		var gotBody []byte
		receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got = r
			gotBody, _ = io.ReadAll(r.Body)
			w.WriteHeader(http.StatusNoContent)
		}))
		t.Cleanup(receiver.Close)

		webhook := server.Event(delivery, EventDelivered, nil)
		status, err := server.SendWebhook(t.Context(), receiver.URL+"/v1/webhooks/resend", webhook)
		require.NoError(t, err)
		require.Equal(t, http.StatusNoContent, status)

		require.Equal(t, http.MethodPost, got.Method)
		require.Equal(t, "/v1/webhooks/resend", got.URL.Path)
		require.Equal(t, "application/json", got.Header.Get("Content-Type"))
		require.Equal(t, webhook.Body, gotBody)
		require.Equal(t, webhook.ID, got.Header.Get("svix-id"))
		require.Equal(t, strconv.FormatInt(now.Unix(), 10), got.Header.Get("svix-timestamp"))
		want, err := SignWebhook(server.WebhookSecret(), webhook.ID, now.Unix(), webhook.Body)
		require.NoError(t, err)
		require.Equal(t, want, got.Header.Get("svix-signature"))
	})

	t.Run("ConfiguredSecret", func(t *testing.T) {
		t.Parallel()

		secret := NewWebhookSecret()
		require.Regexp(t, `^whsec_[A-Za-z0-9+/]{32}$`, secret)
		server := New(t, &Config{WebhookSecret: secret})
		require.Equal(t, secret, server.WebhookSecret())
		require.NotEqual(t, secret, newServer(t).WebhookSecret(), "a new one per fake")
	})

	t.Run("RotationSignsWithBoth", func(t *testing.T) {
		t.Parallel()

		server := newServer(t)
		first := server.WebhookSecret()
		webhook := server.Event(delivery, EventDelivered, nil)
		sign := func(secret string) string {
			entry, err := SignWebhook(secret, webhook.ID, webhook.SignedAt.Unix(), webhook.Body)
			require.NoError(t, err)
			return entry
		}

		second := server.RotateWebhookSecret()
		require.Equal(t, second, server.WebhookSecret())
		require.Equal(t, sign(first)+" "+sign(second), server.Signature(webhook))

		third := server.RotateWebhookSecret()
		require.Equal(t, sign(second)+" "+sign(third), server.Signature(webhook), "the oldest is dropped")
	})
}
