package api

import (
	"context"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/tokens"
)

// Outcomes of one webhook event, the values of the outcome label of
// postguard_email_events_total.
const (
	// EventApplied: the event set its message's status (and the time of that status).
	EventApplied = "applied"
	// EventOutOfOrder: the event is older than its message's status; its status's time is
	// recorded, the status is kept.
	EventOutOfOrder = "out_of_order"
	// EventReplayed: a delivery whose svix-id was applied already; nothing changed again.
	EventReplayed = "replayed"
	// EventUnknownEmail: no message has the event's email id (mail postguard did not send, one
	// pruned since, or one whose acceptance the worker had not recorded yet); nothing changed.
	EventUnknownEmail = "unknown_email"
	// EventUnknownType: a type postguard does not follow (email.opened, contact.created…);
	// nothing changed.
	EventUnknownType = "unknown_type"
)

// eventTypeOther is the type label of every event type postguard does not follow, so that the
// label's values stay few whatever Resend adds.
const eventTypeOther = "other"

// eventStatus is the status each followed event type sets.
var eventStatus = map[string]string{ //nolint:gochecknoglobals // a constant table
	mail.ResendEventSent:            db.EmailStatusSent,
	mail.ResendEventDelivered:       db.EmailStatusDelivered,
	mail.ResendEventDeliveryDelayed: db.EmailStatusDelayed,
	mail.ResendEventBounced:         db.EmailStatusBounced,
	mail.ResendEventComplained:      db.EmailStatusComplained,
	mail.ResendEventSuppressed:      db.EmailStatusSuppressed,
	mail.ResendEventFailed:          db.EmailStatusFailed,
}

var errWebhookSignature = newError(http.StatusUnauthorized, "The webhook's signature is missing, does not match, or is more than five minutes old.")

// resendWebhook is POST /v1/webhooks/resend, mounted when RESEND_WEBHOOK_SECRET is set. It
// verifies the Svix signature over the raw body (401, nothing changed, unless it holds), reads
// the event (400 for a body that is not one), and applies it in one short transaction
// (applyEvent). Every verified event is answered 204, the ones that change nothing (a replay,
// an unknown type, an unknown email id) included, so that Resend does not retry them, and
// counted in postguard_email_events_total{type,outcome}. No part of the body is logged.
func (s *server) resendWebhook(c *gin.Context) error {
	body, err := io.ReadAll(c.Request.Body) // at most MaxBodyBytes (limitBody)
	if err != nil {
		var maxBytesErr *http.MaxBytesError
		if errors.As(err, &maxBytesErr) {
			return err
		}
		return badRequest("The request body could not be read.", err)
	}
	svixID, err := s.webhooks.Verify(c.Request.Header, body)
	if err != nil {
		return errWebhookSignature.withCause(err)
	}
	event, err := mail.ParseResendEvent(body)
	if err != nil {
		return badRequest("The body is not a Resend webhook event.", err)
	}

	outcome, err := s.applyEvent(c.Request.Context(), svixID, event)
	if err != nil {
		return err
	}
	typeLabel := event.Type
	if _, ok := eventStatus[typeLabel]; !ok {
		typeLabel = eventTypeOther
	}
	s.events.WithLabelValues(typeLabel, outcome).Inc()
	c.Status(http.StatusNoContent)
	return nil
}

// applyEvent applies a verified event in one transaction and says what it did (an Event*
// outcome): it records the delivery's svix-id (a replay stops there), finds the message by the
// event's email id (locked until the transaction ends, so two events of one mail apply one after
// the other), merges the event into its lifecycle (recordEvent), and for a permanent bounce, a
// complaint or Resend's own suppression puts the recipient's address on the suppression list.
// The transaction either does all of it or nothing, and on error Resend retries the delivery.
func (s *server) applyEvent(ctx context.Context, svixID string, event *mail.ResendEvent) (string, error) {
	status, followed := eventStatus[event.Type]
	// The databases keep microseconds; compare what they keep.
	at := event.CreatedAt.Truncate(time.Microsecond)
	now := s.now()

	var outcome string
	err := s.store.InTx(ctx, func(ctx context.Context, tx riverstore.Tx) error {
		if err := tx.WebhookEventInsert(ctx, svixID, now); err != nil {
			if errors.Is(err, db.ErrExists) {
				outcome = EventReplayed
				return nil
			}
			return err
		}
		if !followed {
			outcome = EventUnknownType
			return nil
		}
		message, err := tx.EmailMessageGetByProviderID(ctx, event.EmailID)
		if errors.Is(err, db.ErrNotFound) {
			outcome = EventUnknownEmail
			return nil
		}
		if err != nil {
			return err
		}

		outcome = EventOutOfOrder
		if recordEvent(message, status, at, event.Bounce) {
			outcome = EventApplied
		}
		if err := tx.EmailMessageSetLifecycle(ctx, lifecycleOf(message, now)); err != nil {
			return err
		}
		return s.suppressRecipients(ctx, tx, event, at, now)
	})
	if err != nil {
		return "", err
	}
	return outcome, nil
}

// suppressRecipients puts the recipients of event on the suppression list when the event says
// they must not be mailed again: a permanent bounce (a transient one says nothing of the
// address), a complaint, or Resend's own suppression. An address that does not normalise
// cannot be a user's and is left out.
func (s *server) suppressRecipients(ctx context.Context, tx riverstore.Tx, event *mail.ResendEvent, at, now time.Time) error {
	var reason, detail string
	switch {
	case event.Type == mail.ResendEventBounced && event.Bounce.Permanent():
		reason, detail = db.SuppressionReasonBounced, event.Bounce.SubType
	case event.Type == mail.ResendEventComplained:
		reason = db.SuppressionReasonComplained
	case event.Type == mail.ResendEventSuppressed:
		reason = db.SuppressionReasonSuppressed
		if event.Suppressed != nil {
			detail = event.Suppressed.Type
		}
	default:
		return nil
	}
	for _, to := range event.To {
		email, err := NormalizeEmail(to)
		if err != nil {
			s.logger.WarnContext(ctx, "webhook event's recipient is not an address postguard mails; not suppressed",
				slog.String("type", event.Type), slog.String("email_id", event.EmailID))
			continue
		}
		key := tokens.SuppressionKey(s.secret, email)
		if err := tx.EmailSuppressionInsert(ctx, &db.EmailSuppressionInsertParams{
			AddressHash:  key,
			Reason:       reason,
			Detail:       classification(detail),
			EmailID:      event.EmailID,
			SuppressedAt: at,
			Now:          now,
		}); err != nil {
			return err
		}
		s.logger.InfoContext(ctx, "address suppressed",
			slog.String("reason", reason), slog.String("email_id", event.EmailID), slog.String("address_hash", hex.EncodeToString(key)))
	}
	return nil
}

// statusRank orders statuses reached at one instant: the one later in a mail's life wins the
// tie (a delivery and its complaint in one millisecond end complained). Statuses of one rank do
// not follow each other; between two of them the first recorded stays.
func statusRank(status string) int {
	switch status {
	case db.EmailStatusQueued:
		return 0
	case db.EmailStatusSent:
		return 1
	case db.EmailStatusDelayed:
		return 2
	case db.EmailStatusDelivered:
		return 3
	case db.EmailStatusComplained:
		return 5
	default: // bounced, failed, suppressed: the end of a delivery that did not happen
		return 4
	}
}

// recordEvent merges an event of status at time at into message and says whether it set the
// message's status. The status's own time becomes the earliest event of that status, whatever
// the order events come in. The status itself moves only forward in the events' time: to an
// event later than the one that set it (StatusAt), or of the same instant and a later rank;
// while StatusAt is nil (postguard's own status, on the workers' clock) any event sets it, so
// that a skew between the workers' clock and Resend's cannot hide a delivery behind the
// acceptance. A bounce's classification is the earliest bounce's.
func recordEvent(message *db.EmailMessage, status string, at time.Time, bounce *mail.ResendBounce) bool {
	slot := statusTime(message, status)
	if *slot == nil || at.Before(**slot) {
		*slot = &at
		if status == db.EmailStatusBounced && bounce != nil {
			message.BounceType, message.BounceSubType = classificationPtr(bounce.Type), classificationPtr(bounce.SubType)
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
	case db.EmailStatusSent:
		return &message.SentAt
	case db.EmailStatusDelivered:
		return &message.DeliveredAt
	case db.EmailStatusDelayed:
		return &message.DelayedAt
	case db.EmailStatusBounced:
		return &message.BouncedAt
	case db.EmailStatusComplained:
		return &message.ComplainedAt
	case db.EmailStatusSuppressed:
		return &message.SuppressedAt
	default:
		return &message.FailedAt
	}
}

// lifecycleOf is what EmailMessageSetLifecycle writes of message.
func lifecycleOf(message *db.EmailMessage, now time.Time) *db.EmailMessageLifecycleParams {
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

// classification is s when it is a word of Resend's classifications (letters, digits, '_', '-',
// '.', at most 64 bytes), else "": only such a word is kept, never free text that could quote an
// address.
func classification(s string) string {
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
	if s = classification(s); s == "" {
		return nil
	}
	return &s
}
