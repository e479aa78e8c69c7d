package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverlog"
	"github.com/riverqueue/river/rivertype"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/jobs/tokens"
)

const (
	// MaxSnoozes is how many times the provider may ask one job to wait (429, or its idempotency
	// key still in flight); asked once more, the attempt fails like any error.
	MaxSnoozes = 10

	// IdempotencyKeyLifetime is how long the provider remembers an idempotency key. A job is never
	// snoozed past its creation plus this, because a send after it could be delivered twice.
	IdempotencyKeyLifetime = 24 * time.Hour

	// VerifyTokenTTL and ResetTokenTTL are the lives of the tokens in mail, counted from the first
	// attempt of the job that mails them (or from its new start, see emailDeliverer.prepare).
	VerifyTokenTTL = 24 * time.Hour
	ResetTokenTTL  = time.Hour
)

// Metadata keys the email workers keep on their jobs (never anything secret: River UI shows them).
const (
	// metadataPacerSnoozes counts the snoozes taken waiting for a send slot, so they are not
	// counted against MaxSnoozes.
	metadataPacerSnoozes = "pacer_snoozes"
	// metadataPacerSlot holds, across a pacer snooze, the send slot (Unix microseconds) the job
	// reserved, so that it comes back to that slot instead of queueing again.
	metadataPacerSlot = "pacer_slot_us"
)

// jobMetadata is what the email workers read of a job's metadata.
type jobMetadata struct {
	// Snoozes is River's own count of a job's snoozes, pacer snoozes included.
	Snoozes      int64  `json:"snoozes"`
	PacerSnoozes int64  `json:"pacer_snoozes"`
	PacerSlotUS  *int64 `json:"pacer_slot_us"`
}

func parseJobMetadata(raw []byte) jobMetadata {
	var meta jobMetadata
	if len(raw) > 0 {
		// Best effort: a key of another type reads as zero, which only relaxes the caps.
		_ = json.Unmarshal(raw, &meta)
	}
	return meta
}

// linkBuilder makes the links of the mail.
type linkBuilder struct {
	appURL string // without a trailing slash
	secret []byte
}

func (l *linkBuilder) verifyURL(raw string) string {
	return l.appURL + "/v1/auth/verify-email?token=" + raw
}

func (l *linkBuilder) resetURL(raw string) string {
	return l.appURL + "/v1/auth/reset-password?token=" + raw
}

func (l *linkBuilder) unsubscribeURL(userID int64) string {
	return l.appURL + "/v1/unsubscribe?token=" + tokens.Unsubscribe(l.secret, userID)
}

// emailDeliverer is what the three email workers share: the user lookup, the message row with
// its idempotency key and token, the pacing, the send, and the mapping of the provider's answer to
// River's outcomes.
type emailDeliverer struct {
	jobTimeout time.Duration
	logger     *slog.Logger
	metrics    *metrics
	nowFunc    func() time.Time
	pacer      *pacer
	sealer     *tokens.Sealer
	sender     mail.Sender
	store      db.Store
}

// jobLogger logs to the process log and, through riverlog, to the job's log in River UI, with
// the job's ids. Nothing secret is ever logged: no email address, no raw token.
func (d *emailDeliverer) jobLogger(ctx context.Context, job *rivertype.JobRow, userID int64) *slog.Logger {
	handler := d.logger.Handler()
	if jobLogger, ok := riverlog.LoggerSafely(ctx); ok {
		handler = slog.NewMultiHandler(handler, jobLogger.Handler())
	}
	return slog.New(handler).With(
		slog.Int64("job_id", job.ID),
		slog.String("kind", job.Kind),
		slog.Int64("user_id", userID),
		slog.Int("attempt", job.Attempt),
	)
}

// user looks up the job's user. It returns nil and no error when the user no longer exists: the
// job then completes with nothing to send.
func (d *emailDeliverer) user(ctx context.Context, logger *slog.Logger, job *rivertype.JobRow, userID int64) (*db.User, error) {
	user, err := d.store.UserGetByID(ctx, userID)
	if errors.Is(err, db.ErrNotFound) {
		logger.InfoContext(ctx, "user not found, it was deleted; nothing to send")
		d.metrics.delivery(job.Kind, OutcomeSkipped)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("error getting user %d: %w", userID, err)
	}
	return user, nil
}

// delivery is what every attempt of one email job sends under: its idempotency key and, for
// verification and reset mail, its link token.
type delivery struct {
	key   string
	token string // "" for a mail without a link token
	// accepted says the provider accepted the job's mail already (an earlier attempt died before
	// River heard of it): the job completes without sending.
	accepted bool
}

// send is the body of every email worker once it has the job's user: it prepares the job's
// delivery, renders the mail with its token (render gets "" when purpose is ""), and delivers it.
func (d *emailDeliverer) send(ctx context.Context, logger *slog.Logger, job *rivertype.JobRow, user *db.User, purpose db.TokenPurpose, ttl time.Duration, render func(token string) (*mail.Message, error)) error {
	dl, err := d.prepare(ctx, logger, job, user.ID, purpose, ttl)
	if err != nil {
		return err
	}
	if dl.accepted {
		logger.InfoContext(ctx, "the provider accepted this job's email in an earlier attempt; not sending again")
		return nil
	}
	msg, err := render(dl.token)
	if err != nil {
		return fmt.Errorf("error rendering %s: %w", job.Kind, err)
	}
	msg.IdempotencyKey, msg.Kind = dl.key, job.Kind
	return d.deliver(ctx, logger, job, msg, purpose)
}

// prepare returns the job's delivery. The first attempt creates it: the job's message row with a
// random idempotency key and, for a purpose, a random token stored as its hash and its sealed copy,
// in one transaction. Later attempts read them back, the token unsealed, so that every attempt
// sends the same bytes under the same key and the provider delivers the mail once.
//
// A job whose mail was not accepted starts over, with a new key and a new token, when its key is
// older than the provider's memory of it (IdempotencyKeyLifetime) or its sealed copy is gone
// (erased by prune at that age) or does not open (APP_SECRET changed): sending another token
// under the old key could be refused as another payload, or delivered twice. The old token's life
// (VerifyTokenTTL, ResetTokenTTL) has passed by then anyway.
func (d *emailDeliverer) prepare(ctx context.Context, logger *slog.Logger, job *rivertype.JobRow, userID int64, purpose db.TokenPurpose, ttl time.Duration) (*delivery, error) {
	now := d.nowFunc()
	message, err := d.store.EmailMessageGetByJob(ctx, job.ID)
	switch {
	case errors.Is(err, db.ErrNotFound):
		return d.start(ctx, job, userID, purpose, ttl, now, false)
	case err != nil:
		return nil, fmt.Errorf("error getting the job's email message: %w", err)
	case message.AcceptedAt != nil:
		return &delivery{key: message.IdempotencyKey, accepted: true}, nil
	case now.Sub(message.KeyCreatedAt) >= IdempotencyKeyLifetime:
		logger.WarnContext(ctx, "the idempotency key outlived the provider's memory of it; starting over with a new key")
		return d.start(ctx, job, userID, purpose, ttl, now, true)
	case purpose == "":
		return &delivery{key: message.IdempotencyKey}, nil
	}

	token, err := d.store.EmailTokenGetByJob(ctx, job.ID)
	if err != nil && !errors.Is(err, db.ErrNotFound) {
		return nil, fmt.Errorf("error getting the job's token: %w", err)
	}
	if err == nil && token.Sealed != nil {
		raw, err := d.sealer.Open(token.Sealed, job.ID, string(purpose))
		if err == nil {
			return &delivery{key: message.IdempotencyKey, token: raw}, nil
		}
	}
	logger.WarnContext(ctx, "the job's sealed token is gone or does not open; starting over with a new key and token")
	return d.start(ctx, job, userID, purpose, ttl, now, true)
}

// start creates the job's delivery: a new idempotency key in the job's message row (inserted, or
// rekeyed when restart is set) and, for a purpose, a new token valid ttl from now, replacing any
// the job had.
func (d *emailDeliverer) start(ctx context.Context, job *rivertype.JobRow, userID int64, purpose db.TokenPurpose, ttl time.Duration, now time.Time, restart bool) (*delivery, error) {
	dl := &delivery{key: tokens.IdempotencyKey(job.Kind, userID)}
	if purpose != "" {
		dl.token = tokens.New()
	}
	err := d.store.InTx(ctx, func(ctx context.Context, tx db.Queries) error {
		if restart {
			if err := tx.EmailMessageRekey(ctx, job.ID, dl.key, now); err != nil {
				return err
			}
		} else if _, err := tx.EmailMessageInsert(ctx, &db.EmailMessageInsertParams{
			JobID:          job.ID,
			Kind:           job.Kind,
			UserID:         userID,
			IdempotencyKey: dl.key,
			Now:            now,
		}); err != nil {
			return err
		}
		if purpose == "" {
			return nil
		}
		if err := tx.EmailTokenDeleteByJob(ctx, job.ID); err != nil {
			return err
		}
		return tx.EmailTokenInsert(ctx, &db.EmailTokenInsertParams{
			TokenHash: tokens.Hash(dl.token),
			UserID:    userID,
			Purpose:   purpose,
			JobID:     job.ID,
			Sealed:    d.sealer.Seal(dl.token, job.ID, string(purpose)),
			ExpiresAt: now.Add(ttl),
			Now:       now,
		})
	})
	if err != nil {
		return nil, fmt.Errorf("error preparing the job's email: %w", err)
	}
	return dl, nil
}

// markAccepted records that the provider accepted the job's mail, and erases the sealed copy of
// its token: nothing will send it again.
func (d *emailDeliverer) markAccepted(ctx context.Context, jobID int64, providerID string, purpose db.TokenPurpose) error {
	err := d.store.InTx(ctx, func(ctx context.Context, tx db.Queries) error {
		if err := tx.EmailMessageMarkAccepted(ctx, jobID, providerID, d.nowFunc()); err != nil {
			return err
		}
		if purpose == "" {
			return nil
		}
		return tx.EmailTokenEraseSealed(ctx, jobID)
	})
	if err != nil {
		return fmt.Errorf("error recording the provider's acceptance: %w", err)
	}
	return nil
}

// deliver waits for a send slot, sends msg, records an acceptance, and maps the result to what
// River should do.
func (d *emailDeliverer) deliver(ctx context.Context, logger *slog.Logger, job *rivertype.JobRow, msg *mail.Message, purpose db.TokenPurpose) error {
	if d.sender == nil {
		// Not reached in practice: without a sender the email queue is not worked at all.
		return errors.New("no mailer configured (MAILER=none)")
	}
	meta := parseJobMetadata(job.Metadata)

	if err := d.pace(ctx, logger, job, meta); err != nil {
		return err
	}

	providerID, err := d.sender.Send(ctx, msg)
	if err == nil {
		if err := d.markAccepted(ctx, job.ID, providerID, purpose); err != nil {
			// The provider has the mail. The next attempt sends the same bytes under the same key,
			// which the provider answers without delivering again, and records it then.
			return d.fail(ctx, logger, job, err)
		}
	}
	return d.result(ctx, logger, job, meta, err)
}

// pace waits for the job's send slot. When the slot is further away than half the job's timeout
// (a deep backlog across many workers), it snoozes the job until the slot instead, keeping the
// slot in the job's metadata: the job comes back to send in it without queueing again, so no
// slot is wasted and a backlog cannot push the schedule away faster than it drains (were the slot
// dropped and a new one reserved on return, every returning job would push the schedule one
// interval further and nothing would ever be sent). A job that comes back late to its slot sends
// at once: every send still has a slot of its own, so the rate holds over time, though two sends
// may then come closer than the interval (a 429, if the provider minds, is snoozed). A pacer
// snooze spends no attempt and does not count against MaxSnoozes.
//
// Slots and waits are on the database's clock (see pacer). A slot past the job's idempotency key
// life (its creation, also on the database's clock, plus IdempotencyKeyLifetime) is not waited
// for: the attempt fails like any error, as a provider snooze past that life does, and the job
// is retried on RetryPolicy's schedule (or discarded after its last attempt) rather than sent
// with a key the provider may have forgotten.
func (d *emailDeliverer) pace(ctx context.Context, logger *slog.Logger, job *rivertype.JobRow, meta jobMetadata) error {
	if d.pacer == nil {
		return nil
	}

	var slot, now time.Time
	if meta.PacerSlotUS != nil {
		// A slot reserved before a pacer snooze. Clear it whatever this attempt's outcome: it is
		// spent now.
		slot = time.UnixMicro(*meta.PacerSlotUS)
		if err := river.MetadataSet(ctx, metadataPacerSlot, nil); err != nil {
			return fmt.Errorf("error clearing send slot: %w", err)
		}
		var err error
		if now, err = d.pacer.now(ctx); err != nil {
			return err
		}
	} else {
		var err error
		if slot, now, err = d.pacer.reserve(ctx); err != nil {
			return err
		}
	}

	if deadline := job.CreatedAt.Add(IdempotencyKeyLifetime); slot.After(deadline) {
		return d.fail(ctx, logger, job, fmt.Errorf("error waiting for send slot: not waiting %s: it would outlive the idempotency key", slot.Sub(now).Round(time.Millisecond)))
	}
	wait := slot.Sub(now)
	if wait > d.jobTimeout/2 {
		if err := errors.Join(
			river.MetadataSet(ctx, metadataPacerSlot, slot.UnixMicro()),
			river.MetadataSet(ctx, metadataPacerSnoozes, meta.PacerSnoozes+1),
		); err != nil {
			return fmt.Errorf("error keeping send slot: %w", err)
		}
		logger.InfoContext(ctx, "send slot is far; snoozing until it", slog.Duration("wait", wait))
		d.metrics.delivery(job.Kind, OutcomeSnoozed)
		return river.JobSnooze(wait)
	}
	if err := sleepContext(ctx, wait); err != nil {
		d.metrics.delivery(job.Kind, OutcomeRetried)
		return fmt.Errorf("error waiting for send slot: %w", err)
	}
	return nil
}

// result maps the sender's answer to River's outcomes, as mail.Classify says:
//   - nil: completed;
//   - 429: snoozed for its Retry-After (no attempt spent);
//   - 409 concurrent_idempotent_requests (the key still in flight): a short snooze;
//   - 409 invalid_idempotent_request and every other 4xx: cancelled, retrying cannot help;
//   - 5xx, timeouts and network errors: an error, retried on RetryPolicy's schedule;
//   - context.Canceled (shutdown): an error wrapping it, so River puts the job back.
//
// Snoozes are capped (MaxSnoozes, and never past the idempotency key's life); past the cap the
// attempt fails like any error.
func (d *emailDeliverer) result(ctx context.Context, logger *slog.Logger, job *rivertype.JobRow, meta jobMetadata, err error) error {
	kind := job.Kind
	if err == nil {
		logger.InfoContext(ctx, "email sent")
		d.metrics.delivery(kind, OutcomeSent)
		return nil
	}

	var providerErr *mail.ProviderError
	if errors.As(err, &providerErr) {
		// River keeps returned errors on the job (River UI shows them) and a provider's message
		// may quote the recipient: pass on the status, name and wait only.
		err = &mail.ProviderError{
			StatusCode: providerErr.StatusCode,
			Name:       providerErr.Name,
			RetryAfter: providerErr.RetryAfter,
		}
	} else if errors.Is(err, context.Canceled) || errors.Is(ctx.Err(), context.Canceled) {
		// Shutdown (or a remote cancel) cut the send short. The HTTP client may report the
		// context's cause rather than context.Canceled itself: make sure the error says both, so
		// that River puts the job back without spending the attempt.
		if !errors.Is(err, context.Canceled) {
			err = fmt.Errorf("%w: %w", context.Canceled, err)
		}
		logger.InfoContext(ctx, "email send interrupted", slog.String("error", err.Error()))
		d.metrics.delivery(kind, OutcomeRetried)
		return fmt.Errorf("error sending %s email: %w", kind, err)
	}
	err = fmt.Errorf("error sending %s email: %w", kind, err)

	switch outcome := mail.Classify(err); outcome.Action {
	case mail.ActionSnooze:
		return d.snooze(ctx, logger, job, meta, outcome.SnoozeFor, err)

	case mail.ActionCancel:
		logger.WarnContext(ctx, "provider refused the email; cancelling the job", slog.String("error", err.Error()))
		d.metrics.delivery(kind, OutcomeCancelled)
		return river.JobCancel(err)

	case mail.ActionRetry:
	}
	// A 5xx, a network error or a timeout: the message may or may not have arrived, and the
	// idempotency key makes a retry safe either way.
	return d.fail(ctx, logger, job, err)
}

// snooze asks River to try the job again after wait, unless the job's snoozes are used up or
// wait would carry it past its idempotency key's life; then the attempt fails like any error.
func (d *emailDeliverer) snooze(ctx context.Context, logger *slog.Logger, job *rivertype.JobRow, meta jobMetadata, wait time.Duration, err error) error {
	providerSnoozes := meta.Snoozes - meta.PacerSnoozes
	if providerSnoozes >= MaxSnoozes {
		return d.fail(ctx, logger, job, fmt.Errorf("%w; not snoozing again: snoozed %d times already", err, providerSnoozes))
	}
	if deadline := job.CreatedAt.Add(IdempotencyKeyLifetime); d.nowFunc().Add(wait).After(deadline) {
		return d.fail(ctx, logger, job, fmt.Errorf("%w; not snoozing %s: it would outlive the idempotency key", err, wait))
	}
	logger.InfoContext(ctx, "provider asked to wait; snoozing", slog.String("reason", err.Error()), slog.Duration("wait", wait))
	d.metrics.delivery(job.Kind, OutcomeSnoozed)
	return river.JobSnooze(wait)
}

// fail logs and counts a failed attempt and returns err for River to retry (or discard, on the
// last attempt).
func (d *emailDeliverer) fail(ctx context.Context, logger *slog.Logger, job *rivertype.JobRow, err error) error {
	outcome := OutcomeRetried
	if job.Attempt >= job.MaxAttempts {
		outcome = OutcomeDiscarded
	}
	logger.WarnContext(ctx, "email send failed", slog.String("outcome", outcome), slog.String("error", err.Error()))
	d.metrics.delivery(job.Kind, outcome)
	return err
}
