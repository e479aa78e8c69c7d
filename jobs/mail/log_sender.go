package mail

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"
)

// LogSender "delivers" mail by printing it to the process log. It is the
// development mailer (MAILER=log): what it shows holds live tokens, so it
// logs to the process logger it was given, never through riverlog (whose
// lines River UI shows).
//
// With an Outbox it keeps each mail there for /dev/mail and logs one short
// line: kind, recipient, subject and the mail's /dev/mail link. Without one it
// logs the recipient, subject, plain-text body and the links it carries. Safe
// for concurrent use.
type LogSender struct {
	logger     *slog.Logger
	outbox     *Outbox
	devMailURL string
	nowFunc    func() time.Time
}

// LogSenderConfig configures a LogSender. A nil *LogSenderConfig logs whole
// mails.
type LogSenderConfig struct {
	// Outbox, when set, keeps each mail for /dev/mail.
	Outbox *Outbox
	// DevMailURL is where /dev/mail is served, e.g. http://localhost:8080/dev/mail:
	// each log line links to DevMailURL/<id>.
	DevMailURL string
	// NowFunc returns the current time, the SentAt of kept mails. Defaults to
	// time.Now.
	NowFunc func() time.Time
}

// NewLogSender returns a LogSender writing to logger at Info level, or to
// slog.Default() when logger is nil.
func NewLogSender(logger *slog.Logger, config *LogSenderConfig) *LogSender {
	if logger == nil {
		logger = slog.Default()
	}
	if config == nil {
		config = &LogSenderConfig{}
	}
	s := &LogSender{
		logger:     logger,
		outbox:     config.Outbox,
		devMailURL: strings.TrimRight(config.DevMailURL, "/"),
		nowFunc:    config.NowFunc,
	}
	if s.nowFunc == nil {
		s.nowFunc = time.Now
	}
	return s
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

	id := "log_" + rand.Text()
	if s.outbox != nil {
		s.outbox.Add(id, s.nowFunc(), msg)
		s.logger.InfoContext(ctx, "email kept by the log mailer, not sent: open it at /dev/mail",
			slog.String("kind", msg.Kind),
			slog.String("to", msg.To),
			slog.String("subject", msg.Subject),
			slog.String("url", s.devMailURL+"/"+id),
		)
		return id, nil
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
	return id, nil
}
