package mail

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLogSender_Send(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		buf    *bytes.Buffer
		sender *LogSender
	}

	setup := func(t *testing.T) *testBundle {
		t.Helper()

		var buf bytes.Buffer
		return &testBundle{
			buf:    &buf,
			sender: NewLogSender(slog.New(slog.NewJSONHandler(&buf, nil)), nil),
		}
	}

	t.Run("PrintsMail", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t)

		renderer, err := NewRenderer(&RendererConfig{AppURL: "http://localhost:8080"})
		require.NoError(t, err)
		rendered, err := renderer.Render(KindVerification, "", &Data{Name: "Ada", ActionURL: "http://localhost:8080/v1/auth/verify-email?token=abc"})
		require.NoError(t, err)
		text := rendered.Text

		id, err := bundle.sender.Send(t.Context(), &Message{
			IdempotencyKey: "verification_email:1:2",
			Kind:           "verification_email",
			Subject:        "Verify your email address",
			Text:           text,
			To:             "ada@example.com",
		})
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(id, "log_"), id)

		var line struct {
			IdempotencyKey string   `json:"idempotency_key"`
			Kind           string   `json:"kind"`
			Level          string   `json:"level"`
			Links          []string `json:"links"`
			Subject        string   `json:"subject"`
			Text           string   `json:"text"`
			To             string   `json:"to"`
		}
		require.NoError(t, json.Unmarshal(bundle.buf.Bytes(), &line))
		require.Equal(t, "INFO", line.Level)
		require.Equal(t, "ada@example.com", line.To)
		require.Equal(t, "Verify your email address", line.Subject)
		require.Equal(t, "verification_email", line.Kind)
		require.Equal(t, "verification_email:1:2", line.IdempotencyKey)
		require.Equal(t, text, line.Text)
		require.Equal(t, []string{"http://localhost:8080/v1/auth/verify-email?token=abc", "http://localhost:8080"}, line.Links)
	})

	// With an outbox the mail is kept whole for /dev/mail and the log line is short: no body, no
	// token, a link to the mail instead.
	t.Run("KeepsMailForDevMail", func(t *testing.T) {
		t.Parallel()

		var buf bytes.Buffer
		outbox := NewOutbox(0)
		sentAt := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		sender := NewLogSender(slog.New(slog.NewJSONHandler(&buf, nil)), &LogSenderConfig{
			Outbox:     outbox,
			DevMailURL: "http://localhost:8080/dev/mail/",
			NowFunc:    func() time.Time { return sentAt },
		})
		msg := &Message{
			IdempotencyKey: "welcome_email:1:2",
			Kind:           "welcome_email",
			Subject:        "Welcome to Acme",
			HTML:           "<p>Hi</p>",
			Text:           "Hi, unsubscribe: http://localhost:8080/v1/unsubscribe?token=1.secret",
			To:             "ada@example.com",
			Headers:        map[string]string{"List-Unsubscribe": "<http://localhost:8080/v1/unsubscribe?token=1.secret>"},
		}
		id, err := sender.Send(t.Context(), msg)
		require.NoError(t, err)

		var line map[string]any
		require.NoError(t, json.Unmarshal(buf.Bytes(), &line))
		require.Equal(t, "welcome_email", line["kind"])
		require.Equal(t, "ada@example.com", line["to"])
		require.Equal(t, "Welcome to Acme", line["subject"])
		require.Equal(t, "http://localhost:8080/dev/mail/"+id, line["url"])
		require.NotContains(t, buf.String(), "secret", "the line carries no body and no token")

		kept, ok := outbox.Get(id)
		require.True(t, ok)
		require.Equal(t, OutboxMail{ID: id, SentAt: sentAt, Message: *msg}, kept)
	})

	t.Run("LinksWithoutTrailingPunctuation", func(t *testing.T) {
		t.Parallel()

		require.Equal(t,
			[]string{"https://example.com", "https://example.com/v1/unsubscribe?token=1.abc"},
			textLinks("Get started: https://example.com. Or https://example.com, again.\nUnsubscribe: https://example.com/v1/unsubscribe?token=1.abc\n"))
	})

	t.Run("NoRecipient", func(t *testing.T) {
		t.Parallel()

		bundle := setup(t)

		_, err := bundle.sender.Send(t.Context(), &Message{Subject: "s"})
		require.ErrorIs(t, err, ErrInvalidMessage)
		require.Empty(t, bundle.buf.String())
	})

	t.Run("NilLoggerUsesDefault", func(t *testing.T) {
		t.Parallel()

		require.Same(t, slog.Default(), NewLogSender(nil, nil).logger)
	})
}
