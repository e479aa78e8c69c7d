package mail

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

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
			sender: NewLogSender(slog.New(slog.NewJSONHandler(&buf, nil))),
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

		require.Same(t, slog.Default(), NewLogSender(nil).logger)
	})
}
