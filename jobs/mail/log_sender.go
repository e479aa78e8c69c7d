package mail

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
)

// LogSender "delivers" mail by printing it to the process log: recipient,
// subject, plain-text body and the links it carries. It is the development
// mailer (MAILER=log): its output holds live tokens, so it logs to the
// process logger it was given, never through riverlog (whose lines River UI
// shows). Safe for concurrent use.
type LogSender struct {
	logger *slog.Logger
}

// NewLogSender returns a LogSender writing to logger at Info level, or to
// slog.Default() when logger is nil.
func NewLogSender(logger *slog.Logger) *LogSender {
	if logger == nil {
		logger = slog.Default()
	}
	return &LogSender{logger: logger}
}

// linkPattern finds http(s) links in a plain-text body.
var linkPattern = regexp.MustCompile(`https?://[^\s<>"]+`)

// textLinks returns the distinct links of a plain-text body, in order, without the sentence
// punctuation that may follow one ("Get started: https://example.com.").
func textLinks(text string) []string {
	links := []string{}
	for _, link := range linkPattern.FindAllString(text, -1) {
		link = strings.TrimRight(link, ".,;:!?)")
		if !slices.Contains(links, link) {
			links = append(links, link)
		}
	}
	return links
}

// Send logs msg and returns a new id for it; a message without a recipient
// gives ErrInvalidMessage, like the real sender.
func (s *LogSender) Send(ctx context.Context, msg *Message) (string, error) {
	if msg == nil || strings.TrimSpace(msg.To) == "" {
		return "", fmt.Errorf("error sending email: %w: no recipient", ErrInvalidMessage)
	}

	links := textLinks(msg.Text)

	s.logger.InfoContext(ctx, "email printed by the log mailer, not sent",
		slog.String("kind", msg.Kind),
		slog.String("to", msg.To),
		slog.String("subject", msg.Subject),
		slog.String("idempotency_key", msg.IdempotencyKey),
		slog.Any("links", links),
		slog.String("text", msg.Text),
	)
	return "log_" + rand.Text(), nil
}
