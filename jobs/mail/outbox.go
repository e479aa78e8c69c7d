package mail

import (
	"maps"
	"slices"
	"sync"
	"time"
)

// DefaultOutboxSize is how many mails /dev/mail shows: the last 100 the log mailer printed.
const DefaultOutboxSize = 100

// Outbox keeps, in memory, the last mails the log mailer printed, whole, for /dev/mail to show
// them as a person would see them. It holds live tokens: it exists for development only (see
// LogSenderConfig). Safe for concurrent use.
type Outbox struct {
	mu    sync.Mutex
	size  int
	mails []*OutboxMail // oldest first, at most size
}

// OutboxMail is one mail of an Outbox.
type OutboxMail struct {
	// ID is the id the log mailer answered for it, the provider id its job recorded.
	ID string
	// SentAt is when the log mailer printed it.
	SentAt time.Time
	// Message is the mail as the job sent it.
	Message Message
}

// NewOutbox returns an Outbox keeping the last size mails (DefaultOutboxSize when size < 1).
func NewOutbox(size int) *Outbox {
	if size < 1 {
		size = DefaultOutboxSize
	}
	return &Outbox{size: size}
}

// Add keeps a copy of msg under id, forgetting the oldest mail beyond the outbox's size.
func (o *Outbox) Add(id string, sentAt time.Time, msg *Message) {
	kept := &OutboxMail{ID: id, SentAt: sentAt, Message: *msg}
	kept.Message.Headers = maps.Clone(msg.Headers)

	o.mu.Lock()
	defer o.mu.Unlock()
	o.mails = append(o.mails, kept)
	if len(o.mails) > o.size {
		o.mails = slices.Delete(o.mails, 0, len(o.mails)-o.size)
	}
}

// List returns the mails kept, newest first.
func (o *Outbox) List() []OutboxMail {
	o.mu.Lock()
	defer o.mu.Unlock()
	list := make([]OutboxMail, 0, len(o.mails))
	for i := len(o.mails) - 1; i >= 0; i-- {
		list = append(list, *o.mails[i])
	}
	return list
}

// Get returns the mail kept under id; false when there is none (never one, or forgotten).
func (o *Outbox) Get(id string) (OutboxMail, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, m := range o.mails {
		if m.ID == id {
			return *m, true
		}
	}
	return OutboxMail{}, false
}
