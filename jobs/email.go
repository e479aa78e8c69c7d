package jobs

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverlog"
	"github.com/riverqueue/river/rivertype"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/email"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/tokens"
)

const (
	// MaxSnoozes is how many times the provider may ask one job to wait (429, or its idempotency
	// key still in flight); asked once more, the attempt fails like any error.
	MaxSnoozes = 10

	// IdempotencyKeyLifetime is how long the provider remembers an idempotency key. A job is never
	// snoozed past its creation plus this, because a send after it could be delivered twice.
	IdempotencyKeyLifetime = 24 * time.Hour

	// VerifyTokenTTL and ResetTokenTTL are the lives of the tokens in mail, counted from the first
	// attempt of the job that mails them (or from its new start, see mailer.prepare).
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
	// metadataPacerSlotProvider names the provider whose budget the slot is of.
	metadataPacerSlotProvider = "pacer_slot_provider"
)

// jobMetadata is what the email workers read of a job's metadata.
type jobMetadata struct {
	// Snoozes is River's own count of a job's snoozes, pacer snoozes included.
	Snoozes      int64  `json:"snoozes"`
	PacerSnoozes int64  `json:"pacer_snoozes"`
	PacerSlotUS  *int64 `json:"pacer_slot_us"`
	// PacerSlotProvider is the provider of PacerSlotUS; "" for a slot kept before there were
	// several, which was Resend's (DefaultProviderName).
	PacerSlotProvider string `json:"pacer_slot_provider"`
	// TraceParent is the W3C traceparent of the job's insert, which a River middleware that
	// traces (otelriver's, with trace propagation) wrote there: the trace the mail belongs to,
	// kept on its message row for the webhook's spans to link to. "" without one.
	TraceParent string `json:"traceparent"`
}

// traceParent is a job's traceparent as its message row keeps it: nil for none, or for one
// that is not the 55 characters of a version-00 traceparent (nothing else belongs there).
func traceParent(value string) *string {
	if len(value) != len("00-")+32+len("-")+16+len("-")+2 {
		return nil
	}
	return &value
}

func parseJobMetadata(raw []byte) jobMetadata {
	var meta jobMetadata
	if len(raw) > 0 {
		// Best effort: a key of another type reads as zero, which only relaxes the caps.
		_ = json.Unmarshal(raw, &meta)
	}
	return meta
}

// emailArgs are the args of the email jobs: each names the user its mail goes to.
type emailArgs interface {
	river.JobArgs
	userID() int64
}

// emailSpec is what one email kind is: the token its mail carries, whether a user gets it, and
// how it is rendered. Everything else the kinds share (emailWorker, mailer).
type emailSpec struct {
	// purpose and ttl are the link token's; purpose "" is a mail without one.
	purpose db.TokenPurpose
	ttl     time.Duration
	// skip says why user gets no mail of this kind, or "" to send it; nil sends to every user.
	skip func(user *Recipient) string
	// kind is the mail's templates.
	kind mail.Kind
	// data is what the mail to user says, with token (the link's, "" without a purpose), and the
	// headers it carries besides.
	data func(links *linkBuilder, user *Recipient, token string) (*mail.Data, map[string]string)
}

// emailWorker is the River worker of one email kind, T its args.
type emailWorker[T emailArgs] struct {
	river.WorkerDefaults[T]

	mailer *mailer
	spec   *emailSpec
}

// Work implements river.Worker.
func (w *emailWorker[T]) Work(ctx context.Context, job *river.Job[T]) error {
	return w.mailer.work(ctx, job.JobRow, job.Args.userID(), w.spec)
}

// linkBuilder makes the links of the mail.
type linkBuilder struct {
	appURL   string // without a trailing slash
	loginURL string // the welcome's button
	secret   []byte
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

// mailer is what the email workers share: the store, the recipients, the providers (each with its
// pacer and circuit), the token sealer, the renderer and the delivery metrics.
type mailer struct {
	jobTimeout time.Duration
	links      *linkBuilder
	logger     *slog.Logger
	metrics    *metrics
	nowFunc    func() time.Time
	providers  []*provider
	recipients Recipients
	renderer   *mail.Renderer
	sealer     *tokens.Sealer
	store      db.Tables
}

// attempt is one attempt of one email job: what its steps read.
type attempt struct {
	ctx    context.Context
	job    *rivertype.JobRow
	logger *slog.Logger
	meta   jobMetadata
	// keyExpires is when the provider forgets the job's idempotency key (its creation, on the
	// workers' clock, plus IdempotencyKeyLifetime); zero until prepare has read or made it.
	keyExpires time.Time
	// provider is the provider the attempt is at, or ended at; "" before it reaches one.
	provider string
}

// keyDeadline is the time no wait of the attempt may pass: its key's end, or before prepare, the
// job's creation plus the key's life (no key of the job can be older).
func (a *attempt) keyDeadline() time.Time {
	if a.keyExpires.IsZero() {
		return a.job.CreatedAt.Add(IdempotencyKeyLifetime)
	}
	return a.keyExpires
}

// work is one attempt of an email job: it delivers the job's mail, maps what happened to River's
// result and the delivery metric's outcome (outcome, the one place), and logs and counts it.
func (m *mailer) work(ctx context.Context, job *rivertype.JobRow, userID int64, spec *emailSpec) error {
	a := &attempt{ctx: ctx, job: job, logger: m.jobLogger(ctx, job, userID), meta: parseJobMetadata(job.Metadata)}

	err := m.deliver(a, userID, spec)
	label, result := outcome(job, a.meta, a.keyDeadline(), m.nowFunc(), err)
	m.metrics.delivery(job.Kind, cmp.Or(a.provider, ProviderNone), label)
	switch {
	case err == nil:
		a.logger.InfoContext(ctx, "email sent")
	case label == OutcomeSkipped || label == OutcomeSnoozed || label == OutcomeSuppressed:
		a.logger.InfoContext(ctx, "email "+label, slog.String("reason", err.Error()))
	default:
		a.logger.WarnContext(ctx, "email "+label, slog.String("error", result.Error()))
	}
	return result
}

// jobLogger logs to the process log and, through riverlog, to the job's log in River UI, with
// the job's ids. Nothing secret is ever logged: no email address, no raw token.
func (m *mailer) jobLogger(ctx context.Context, job *rivertype.JobRow, userID int64) *slog.Logger {
	handler := m.logger.Handler()
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

// deliver sends the job's mail, or says why not: nil once the provider accepted it, a *skipped
// when there is nothing to send, a *suppressedMail when its address is on the suppression list,
// a *snoozed to wait, or the error that stopped it.
func (m *mailer) deliver(a *attempt, userID int64, spec *emailSpec) error {
	if len(m.providers) == 0 {
		// Not reached in practice: without a provider the email queue is not worked at all.
		return errors.New("no mailer configured (MAILER=none)")
	}
	user, err := m.recipient(a.ctx, userID)
	if errors.Is(err, ErrNoRecipient) {
		return &skipped{reason: "the user was deleted"}
	}
	if err != nil {
		return fmt.Errorf("error getting user %d: %w", userID, err)
	}
	if spec.skip != nil {
		if reason := spec.skip(user); reason != "" {
			return &skipped{reason: reason}
		}
	}
	if err := m.checkSuppression(a, user); err != nil {
		return err
	}

	dl, err := m.prepare(a, user, spec)
	if err != nil {
		return err
	}
	if dl.accepted {
		return &skipped{reason: "the provider accepted this job's email in an earlier attempt; not sending again"}
	}
	dl.msg.IdempotencyKey, dl.msg.Kind = dl.key, a.job.Kind
	return m.send(a, user, dl, spec.purpose)
}

// recipient reads the job's user from the Recipients: the one place workers read a user. Its
// address is taken in its normal form (email.Normalize), whatever spelling the Recipients' table
// keeps, so that it is mailed, and looked up on the suppression list, as the webhook keys it: an
// address that is not one plain address cannot be mailed, and cancels the job.
func (m *mailer) recipient(ctx context.Context, userID int64) (*Recipient, error) {
	r, err := m.recipients.Recipient(ctx, userID)
	if err != nil {
		return nil, err
	}
	user := *r // the Recipients' own value stays as it gave it
	user.ID = userID
	if user.Email, err = email.Normalize(user.Email); err != nil {
		return nil, fmt.Errorf("%w: the address of user %d is not one plain address", mail.ErrInvalidMessage, userID)
	}
	return &user, nil
}

// render builds the job's message to user in locale (see mail.Renderer.Match), with token. Its
// IdempotencyKey and Kind are the caller's to set.
func (m *mailer) render(a *attempt, spec *emailSpec, user *Recipient, token, locale string) (*mail.Message, error) {
	data, headers := spec.data(m.links, user, token)
	rendered, err := m.renderer.Render(spec.kind, locale, data)
	if err != nil {
		return nil, fmt.Errorf("error rendering %s: %w", a.job.Kind, err)
	}
	return &mail.Message{
		To:      user.Email,
		Subject: rendered.Subject,
		HTML:    rendered.HTML,
		Text:    rendered.Text,
		Headers: headers,
	}, nil
}

// payloadDigest is the SHA-256 of what the provider receives of msg under its idempotency key:
// recipient, subject, bodies and headers, each length-prefixed so no two messages share an
// encoding. The sender (RESEND_FROM_EMAIL) is the sender's, not the message's, and is not in it.
func payloadDigest(msg *mail.Message) []byte {
	h := sha256.New()
	field := func(s string) {
		_ = binary.Write(h, binary.BigEndian, uint64(len(s)))
		_, _ = io.WriteString(h, s)
	}
	field(msg.To)
	field(msg.Subject)
	field(msg.HTML)
	field(msg.Text)
	for _, name := range slices.Sorted(maps.Keys(msg.Headers)) {
		field(name)
		field(msg.Headers[name])
	}
	return h.Sum(nil)
}

// delivery is what every attempt of one email job sends: its message (rendered, without its
// key), under its idempotency key.
type delivery struct {
	key string
	msg *mail.Message
	// accepted says the provider accepted the job's mail already (an earlier attempt died before
	// River heard of it): the job completes without sending, and msg is nil.
	accepted bool
	// inDoubt is the provider the message row says may have the mail (an earlier attempt handed
	// it over and never heard whether it was taken), or ""; doubtIsOurs says this attempt
	// recorded it.
	inDoubt     string
	doubtIsOurs bool
}

// prepare returns the job's delivery. The first attempt creates it: it chooses the locale (the
// best match of the user's, mail.Renderer.Match), a random idempotency key and, for a purpose, a
// random token, renders the mail, and stores the key, the locale and the digest of the mail
// (payloadDigest) in the job's message row, and the token as its hash and its sealed copy, in one
// transaction. Later attempts read them back, the token unsealed, and render the mail again in
// the same locale: rendering is deterministic for a kind, locale, templates and data, so every
// attempt sends the same bytes under the same key and the provider delivers the mail once.
//
// A later attempt whose mail renders other bytes than the digest says (a deploy changed the
// templates, APP_NAME or APP_URL, or the user's name changed) would be refused by the provider as
// another payload under a known key (409 invalid_idempotent_request, and the job cancelled, its
// mail never sent). It sends under a new key instead, with the same token and locale. The price:
// if an earlier attempt did reach the provider (its answer was lost), the user gets that mail and
// this one, both with working links.
//
// A job whose mail was not accepted starts over, with a new key and a new token, when its key is
// older than the provider's memory of it (IdempotencyKeyLifetime) or its sealed copy is gone
// (erased by prune at that age) or does not open (APP_SECRET changed): sending another token
// under the old key could be refused as another payload, or delivered twice. The old token's life
// (VerifyTokenTTL, ResetTokenTTL) has passed by then anyway.
func (m *mailer) prepare(a *attempt, user *Recipient, spec *emailSpec) (*delivery, error) {
	now := m.nowFunc()
	message, err := m.store.EmailMessageGetByJob(a.ctx, a.job.ID)
	switch {
	case errors.Is(err, db.ErrNotFound):
		return m.start(a, user, spec, now, false)
	case err != nil:
		return nil, fmt.Errorf("error getting the job's email message: %w", err)
	case message.AcceptedAt != nil:
		return &delivery{key: message.IdempotencyKey, accepted: true}, nil
	case now.Sub(message.KeyCreatedAt) >= IdempotencyKeyLifetime:
		a.logger.WarnContext(a.ctx, "the idempotency key outlived the provider's memory of it; starting over with a new key")
		return m.start(a, user, spec, now, true)
	}
	a.keyExpires = message.KeyCreatedAt.Add(IdempotencyKeyLifetime)

	var raw string
	if spec.purpose != "" {
		token, err := m.store.EmailTokenGetByJob(a.ctx, a.job.ID)
		if err != nil && !errors.Is(err, db.ErrNotFound) {
			return nil, fmt.Errorf("error getting the job's token: %w", err)
		}
		if err == nil && token.Sealed != nil {
			raw, err = m.sealer.Open(token.Sealed, a.job.ID, string(spec.purpose))
		}
		if err != nil || raw == "" {
			a.logger.WarnContext(a.ctx, "the job's sealed token is gone or does not open; starting over with a new key and token")
			return m.start(a, user, spec, now, true)
		}
	}

	msg, err := m.render(a, spec, user, raw, message.Locale)
	if err != nil {
		return nil, err
	}
	digest := payloadDigest(msg)
	if bytes.Equal(digest, message.PayloadSHA256) {
		dl := &delivery{key: message.IdempotencyKey, msg: msg}
		if message.ProviderInDoubt != nil {
			dl.inDoubt = *message.ProviderInDoubt
		}
		return dl, nil
	}

	a.logger.WarnContext(a.ctx, "the job's mail renders other bytes than at its first attempt (templates, APP_NAME or APP_URL changed, or the user's name); sending it under a new idempotency key",
		slog.String("locale", message.Locale))
	key := tokens.IdempotencyKey(a.job.Kind, user.ID)
	if err := m.store.EmailMessageRekey(a.ctx, &db.EmailMessageRekeyParams{
		JobID:          a.job.ID,
		IdempotencyKey: key,
		Locale:         message.Locale,
		PayloadSHA256:  digest,
		Now:            now,
	}); err != nil {
		return nil, fmt.Errorf("error giving the job's email a new key: %w", err)
	}
	a.keyExpires = now.Add(IdempotencyKeyLifetime)
	return &delivery{key: key, msg: msg}, nil
}

// start creates the job's delivery: a locale, a new idempotency key in the job's message row
// (inserted, or rekeyed when restart is set) and, for a purpose, a new token valid spec.ttl from
// now, replacing any the job had.
func (m *mailer) start(a *attempt, user *Recipient, spec *emailSpec, now time.Time, restart bool) (*delivery, error) {
	job := a.job
	locale := m.renderer.Match(user.Locale)
	var raw string
	if spec.purpose != "" {
		raw = tokens.New()
	}
	msg, err := m.render(a, spec, user, raw, locale)
	if err != nil {
		return nil, err
	}
	dl := &delivery{key: tokens.IdempotencyKey(job.Kind, user.ID), msg: msg}
	digest := payloadDigest(msg)

	err = m.store.Transact(a.ctx, func(ctx context.Context, tx db.Queries) error {
		if restart {
			if err := tx.EmailMessageRekey(ctx, &db.EmailMessageRekeyParams{
				JobID:          job.ID,
				IdempotencyKey: dl.key,
				Locale:         locale,
				PayloadSHA256:  digest,
				Now:            now,
			}); err != nil {
				return err
			}
		} else if _, err := tx.EmailMessageInsert(ctx, &db.EmailMessageInsertParams{
			JobID:          job.ID,
			Kind:           job.Kind,
			UserID:         user.ID,
			IdempotencyKey: dl.key,
			Now:            now,
			Locale:         locale,
			PayloadSHA256:  digest,
			TraceParent:    traceParent(a.meta.TraceParent),
		}); err != nil {
			return err
		}
		if spec.purpose == "" {
			return nil
		}
		if err := tx.EmailTokenDeleteByJob(ctx, job.ID); err != nil {
			return err
		}
		return tx.EmailTokenInsert(ctx, &db.EmailTokenInsertParams{
			TokenHash: tokens.Hash(raw),
			UserID:    user.ID,
			Purpose:   spec.purpose,
			JobID:     job.ID,
			Sealed:    m.sealer.Seal(raw, job.ID, string(spec.purpose)),
			ExpiresAt: now.Add(spec.ttl),
			Now:       now,
		})
	})
	if err != nil {
		return nil, fmt.Errorf("error preparing the job's email: %w", err)
	}
	a.keyExpires = now.Add(IdempotencyKeyLifetime)
	return dl, nil
}

// markAccepted records that provider accepted the job's mail, with its id for it, and erases the
// sealed copy of its token: nothing will send it again. Should this fail, the provider has the
// mail and the message row keeps it in doubt there: the next attempt sends the same bytes under
// the same key to the same provider, which Resend answers without delivering again (an SMTP
// server may deliver it twice), and records it then.
func (m *mailer) markAccepted(a *attempt, provider, providerID string, purpose db.TokenPurpose) error {
	err := m.store.Transact(a.ctx, func(ctx context.Context, tx db.Queries) error {
		if err := tx.EmailMessageMarkAccepted(ctx, &db.EmailMessageMarkAcceptedParams{
			JobID:      a.job.ID,
			Provider:   provider,
			ProviderID: providerID,
			Now:        m.nowFunc(),
		}); err != nil {
			return err
		}
		if purpose == "" {
			return nil
		}
		return tx.EmailTokenEraseSealed(ctx, a.job.ID)
	})
	if err != nil {
		return fmt.Errorf("error recording the provider's acceptance: %w", err)
	}
	return nil
}

// pace waits for the job's send slot in p's budget. When the slot is further away than half the job's timeout
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
// (a.keyDeadline) is not waited for: the attempt fails like any error, as a provider snooze past
// it does, and the job is retried on RetryPolicy's schedule (with a new key, see prepare) rather
// than sent with a key the provider may have forgotten.
func (m *mailer) pace(a *attempt, p *provider) error {
	var (
		slot, now time.Time
		err       error
		kept      = a.meta.PacerSlotUS
	)
	if kept != nil {
		// A slot reserved before a pacer snooze. Clear it whatever this attempt's outcome: it is
		// spent now, or it is of a provider this attempt does not send through (its circuit
		// opened meanwhile), and wasted.
		a.meta.PacerSlotUS = nil
		if err := errors.Join(
			river.MetadataSet(a.ctx, metadataPacerSlot, nil),
			river.MetadataSet(a.ctx, metadataPacerSlotProvider, nil),
		); err != nil {
			return fmt.Errorf("error clearing send slot: %w", err)
		}
		if cmp.Or(a.meta.PacerSlotProvider, DefaultProviderName) != p.name {
			kept = nil
		}
	}
	switch {
	case p.pacer == nil:
		return nil
	case kept != nil:
		slot = time.UnixMicro(*kept)
		if now, err = p.pacer.now(a.ctx); err != nil {
			return err
		}
	default:
		if slot, now, err = p.pacer.reserve(a.ctx); err != nil {
			return err
		}
	}

	wait := slot.Sub(now)
	// The key's deadline is on the workers' clock, the wait on the database's: compare the wait.
	if m.nowFunc().Add(wait).After(a.keyDeadline()) {
		return fmt.Errorf("error waiting for send slot: not waiting %s: it would outlive the idempotency key", wait.Round(time.Millisecond))
	}
	if wait > m.jobTimeout/2 {
		if err := errors.Join(
			river.MetadataSet(a.ctx, metadataPacerSlot, slot.UnixMicro()),
			river.MetadataSet(a.ctx, metadataPacerSlotProvider, p.name),
			river.MetadataSet(a.ctx, metadataPacerSnoozes, a.meta.PacerSnoozes+1),
		); err != nil {
			return fmt.Errorf("error keeping send slot: %w", err)
		}
		return &snoozed{wait: wait, reason: "the send slot is far", pacer: true}
	}
	if err := sleepContext(a.ctx, wait); err != nil {
		return fmt.Errorf("error waiting for send slot: %w", err)
	}
	return nil
}

// sendError is the sender's error as River may keep it on the job (River UI shows it): a
// provider's answer keeps its status, name and wait but not its message, which may quote the
// recipient; a send cut short by the context (shutdown) says context.Canceled, even when the HTTP
// client reported the context's cause, so that River puts the job back without spending it.
func sendError(ctx context.Context, kind string, err error) error {
	var providerErr *mail.ProviderError
	switch {
	case errors.As(err, &providerErr):
		err = &mail.ProviderError{
			StatusCode: providerErr.StatusCode,
			Name:       providerErr.Name,
			RetryAfter: providerErr.RetryAfter,
		}
	case errors.Is(ctx.Err(), context.Canceled) && !errors.Is(err, context.Canceled):
		err = fmt.Errorf("%w: %w", context.Canceled, err)
	}
	return fmt.Errorf("error sending %s email: %w", kind, err)
}
