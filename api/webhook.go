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
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/email"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs/mail"
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
	mail.ResendEventSent:            email.StatusSent,
	mail.ResendEventDelivered:       email.StatusDelivered,
	mail.ResendEventDeliveryDelayed: email.StatusDelayed,
	mail.ResendEventBounced:         email.StatusBounced,
	mail.ResendEventComplained:      email.StatusComplained,
	mail.ResendEventSuppressed:      email.StatusSuppressed,
	mail.ResendEventFailed:          email.StatusFailed,
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

	typeLabel := event.Type
	if _, ok := eventStatus[typeLabel]; !ok {
		typeLabel = eventTypeOther
	}
	ctx, span := s.tracer.Start(c.Request.Context(), "resend.webhook "+typeLabel,
		trace.WithAttributes(attrEventType.String(typeLabel), attrEmailID.String(event.EmailID)))
	defer span.End()
	outcome, traceParent, err := s.applyEvent(ctx, svixID, event)
	if err != nil {
		span.SetStatus(codes.Error, "")
		return err
	}
	span.SetAttributes(attrEventOutcome.String(outcome))
	if mailTrace := spanContextOf(traceParent); mailTrace.IsValid() {
		span.AddLink(trace.Link{SpanContext: mailTrace})
	}
	s.events.WithLabelValues(typeLabel, outcome).Inc()
	c.Status(http.StatusNoContent)
	return nil
}

// applyEvent applies a verified event in one transaction and says what it did (an Event*
// outcome), and the traceparent of the message's trace ("" for none): it records the delivery's svix-id (a replay stops there), finds the message by the
// event's email id (locked until the transaction ends, so two events of one mail apply one after
// the other), merges the event into its lifecycle (email.Record), and puts the recipients'
// addresses on the suppression list when the policy says so (email.Suppression). The
// transaction either does all of it or nothing, and on error Resend retries the delivery.
func (s *server) applyEvent(ctx context.Context, svixID string, event *mail.ResendEvent) (outcome, traceParent string, _ error) {
	status, followed := eventStatus[event.Type]
	// The databases keep microseconds; compare what they keep.
	ev := &email.Event{Status: status, At: event.CreatedAt.Truncate(time.Microsecond)}
	if event.Bounce != nil {
		ev.Bounce = &email.Bounce{Type: event.Bounce.Type, SubType: event.Bounce.SubType, Permanent: event.Bounce.Permanent()}
	}
	if event.Suppressed != nil {
		ev.SuppressedType = event.Suppressed.Type
	}
	now := s.now()

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
		if message.TraceParent != nil {
			traceParent = *message.TraceParent
		}

		outcome = EventOutOfOrder
		if email.Record(message, ev) {
			outcome = EventApplied
		}
		if err := tx.EmailMessageSetLifecycle(ctx, email.Lifecycle(message, now)); err != nil {
			return err
		}
		return s.suppressRecipients(ctx, tx, event, ev, now)
	})
	if err != nil {
		return "", "", err
	}
	return outcome, traceParent, nil
}

// Attributes of a webhook event's span: what Resend's event is about and what it did, never its
// recipients.
const (
	attrEventType    = attribute.Key("postguard.webhook.event_type")
	attrEventOutcome = attribute.Key("postguard.webhook.outcome")
	attrEmailID      = attribute.Key("postguard.email.provider_id")
)

// spanContextOf is the span context a W3C traceparent names; invalid for "" or a malformed one.
func spanContextOf(traceParent string) trace.SpanContext {
	if traceParent == "" {
		return trace.SpanContext{}
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceParent})
	return trace.SpanContextFromContext(ctx)
}

// suppressRecipients puts the recipients of event on the suppression list when the policy says
// they must not be mailed again (email.Suppression). An address that does not normalise cannot
// be one postguard mails and is left out.
func (s *server) suppressRecipients(ctx context.Context, tx riverstore.Tx, event *mail.ResendEvent, ev *email.Event, now time.Time) error {
	reason, detail, suppresses := email.Suppression(ev)
	if !suppresses {
		return nil
	}
	for _, to := range event.To {
		address, err := email.Normalize(to)
		if err != nil {
			s.logger.WarnContext(ctx, "webhook event's recipient is not an address postguard mails; not suppressed",
				slog.String("type", event.Type), slog.String("email_id", event.EmailID))
			continue
		}
		key := email.SuppressionKey(s.secret, address)
		if err := tx.EmailSuppressionInsert(ctx, &db.EmailSuppressionInsertParams{
			AddressHash:  key,
			Reason:       reason,
			Detail:       detail,
			EmailID:      event.EmailID,
			SuppressedAt: ev.At,
			Now:          now,
		}); err != nil {
			return err
		}
		s.logger.InfoContext(ctx, "address suppressed",
			slog.String("reason", reason), slog.String("email_id", event.EmailID), slog.String("address_hash", hex.EncodeToString(key)))
	}
	return nil
}
