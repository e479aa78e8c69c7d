package email

import (
	"time"

	"github.com/postguard/postguard/db"
)

// Message statuses: a message (db.EmailMessage) is queued from its job's first attempt until the
// provider accepts it (sent), or suppressed when its address is on the suppression list (nothing
// is sent); the provider's events then move it on: delivered, delayed, bounced, complained,
// suppressed (the provider would not send it) or failed. Record is how an event moves it.
const (
	StatusQueued     = "queued"
	StatusSent       = "sent"
	StatusDelivered  = "delivered"
	StatusDelayed    = "delayed"
	StatusBounced    = "bounced"
	StatusComplained = "complained"
	StatusSuppressed = "suppressed"
	StatusFailed     = "failed"
)

// Event is what a provider reported of one of its mails, in postguard's terms: its provider's
// webhook (or its answer to a send) is read into one.
type Event struct {
	// Status is the status the event reports: one of the Status* constants after queued.
	Status string
	// At is when the provider says it happened, at the databases' precision (microseconds).
	At time.Time
	// Bounce is the provider's classification of a bounce (StatusBounced); nil when it gave none.
	Bounce *Bounce
	// SuppressedType is the provider's kind of suppression (StatusSuppressed); "" when it gave
	// none.
	SuppressedType string
}

// Bounce is a provider's classification of a bounce.
type Bounce struct {
	// Type and SubType are the provider's words (Permanent/General, Transient/MailboxFull…),
	// never its message, which may quote the address.
	Type, SubType string
	// Permanent says the address will never take mail: it is suppressed (Suppression).
	Permanent bool
}

// statusRank orders statuses reached at one instant: the one later in a mail's life wins the
// tie (a delivery and its complaint in one millisecond end complained). Statuses of one rank do
// not follow each other; between two of them the first recorded stays.
func statusRank(status string) int {
	switch status {
	case StatusQueued:
		return 0
	case StatusSent:
		return 1
	case StatusDelayed:
		return 2
	case StatusDelivered:
		return 3
	case StatusComplained:
		return 5
	default: // bounced, failed, suppressed: the end of a delivery that did not happen
		return 4
	}
}

// Record merges event into message and says whether it set the message's status. The status's
// own time becomes the earliest event of that status, whatever the order events come in. The
// status itself moves only forward in the events' time: to an event later than the one that set
// it (StatusAt), or of the same instant and a later rank; while StatusAt is nil (postguard's own
// status, on the workers' clock) any event sets it, so that a skew between the workers' clock
// and the provider's cannot hide a delivery behind the acceptance. A bounce's classification is
// the earliest bounce's, each part kept only when it is a plain word (Classification). Give
// event.At at the databases' precision (microseconds), as the times it is compared with were
// read from them.
func Record(message *db.EmailMessage, event *Event) bool {
	status, at := event.Status, event.At
	slot := statusTime(message, status)
	if *slot == nil || at.Before(**slot) {
		*slot = &at
		if status == StatusBounced && event.Bounce != nil {
			message.BounceType, message.BounceSubType = classificationPtr(event.Bounce.Type), classificationPtr(event.Bounce.SubType)
		}
	}
	if message.StatusAt == nil || at.After(*message.StatusAt) ||
		(at.Equal(*message.StatusAt) && statusRank(status) > statusRank(message.Status)) {
		message.Status, message.StatusAt = status, &at
		return true
	}
	return false
}

// statusTime is the field of message that holds the time of status.
func statusTime(message *db.EmailMessage, status string) **time.Time {
	switch status {
	case StatusSent:
		return &message.SentAt
	case StatusDelivered:
		return &message.DeliveredAt
	case StatusDelayed:
		return &message.DelayedAt
	case StatusBounced:
		return &message.BouncedAt
	case StatusComplained:
		return &message.ComplainedAt
	case StatusSuppressed:
		return &message.SuppressedAt
	default:
		return &message.FailedAt
	}
}

// Lifecycle is what db's EmailMessageSetLifecycle writes of message, once Record merged an event
// into it.
func Lifecycle(message *db.EmailMessage, now time.Time) *db.EmailMessageLifecycleParams {
	return &db.EmailMessageLifecycleParams{
		Status:        message.Status,
		StatusAt:      message.StatusAt,
		SentAt:        message.SentAt,
		DeliveredAt:   message.DeliveredAt,
		DelayedAt:     message.DelayedAt,
		BouncedAt:     message.BouncedAt,
		ComplainedAt:  message.ComplainedAt,
		SuppressedAt:  message.SuppressedAt,
		FailedAt:      message.FailedAt,
		BounceType:    message.BounceType,
		BounceSubType: message.BounceSubType,
		Now:           now,
		JobID:         message.JobID,
	}
}

// maxClassificationLen bounds a classification kept from an event (a bounce's type and
// sub-type, a suppression's type).
const maxClassificationLen = 64

// Classification is s when it is a word of a provider's classifications (letters, digits, '_',
// '-', '.', at most 64 bytes), else "": only such a word is kept, never free text that could
// quote an address.
func Classification(s string) string {
	if len(s) > maxClassificationLen {
		return ""
	}
	for i := range len(s) {
		switch b := s[i]; {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9', b == '_', b == '-', b == '.':
		default:
			return ""
		}
	}
	return s
}

func classificationPtr(s string) *string {
	if s = Classification(s); s == "" {
		return nil
	}
	return &s
}
