package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/email"
	"github.com/postguard/postguard/jobs/mail"
)

// DefaultProviderName is the name of Deps.Sender's one provider: the send budget and metric label
// postguard's one sender always had.
const DefaultProviderName = "resend"

// Provider is one way mail goes out. Deps.Providers lists them in failover order.
type Provider struct {
	// Name names the provider in metrics, logs, the message row (which provider accepted each
	// mail) and the send pacer's budget: resend, smtp, log... Required, unique among the
	// providers, and kept from deploy to deploy (a message in doubt names its provider).
	Name string
	// Sender delivers the mail. Required.
	Sender mail.Sender
	// MaxRPS is the most sends per second through it, all worker processes together
	// (RESEND_MAX_RPS, SMTP_MAX_RPS); 0 sends unpaced.
	MaxRPS float64
}

// provider is a Provider as the mailer uses it, with its pacer (nil when unpaced) and circuit.
type provider struct {
	name    string
	sender  mail.Sender
	pacer   *pacer
	circuit *circuit
}

// newProviders checks deps' providers (or its one Sender, named DefaultProviderName and paced at
// config.MaxRPS) and builds them on store.
func newProviders(deps *Deps, config *Config, store pacerReserver) ([]*provider, error) {
	given := deps.Providers
	if len(given) == 0 && deps.Sender != nil {
		given = []Provider{{Name: DefaultProviderName, Sender: deps.Sender, MaxRPS: config.MaxRPS}}
	}
	providers := make([]*provider, 0, len(given))
	seen := make(map[string]bool, len(given))
	for _, p := range given {
		switch {
		case p.Name == "":
			return nil, errors.New("jobs: a Provider without a Name")
		case p.Sender == nil:
			return nil, fmt.Errorf("jobs: provider %q has no Sender", p.Name)
		case seen[p.Name]:
			return nil, fmt.Errorf("jobs: provider %q is named twice", p.Name)
		case !(p.MaxRPS >= 0): // NaN too
			return nil, fmt.Errorf("jobs: provider %q has a negative MaxRPS", p.Name)
		}
		seen[p.Name] = true
		providers = append(providers, &provider{
			name:    p.Name,
			sender:  p.Sender,
			pacer:   newPacer(store, p.Name, p.MaxRPS),
			circuit: newCircuit(config.CircuitCooldown),
		})
	}
	return providers, nil
}

// route is the providers an attempt may hand the job's mail to, in the order it tries them: those
// whose circuit is not open, in the configured order, then those whose circuit is open (there is
// nowhere better to go when every provider had an outage). A mail in doubt at a provider (an
// earlier attempt handed it over and never heard whether it was taken) goes to that provider only:
// there a retry is answered as the same mail (Resend's idempotency key), or at worst repeats it
// with the same Message-ID (SMTP); another provider would deliver a second, distinct mail.
func (m *mailer) route(a *attempt, inDoubt string) []*provider {
	if inDoubt != "" {
		for _, p := range m.providers {
			if p.name == inDoubt {
				return []*provider{p}
			}
		}
		a.logger.WarnContext(a.ctx, "an earlier attempt may have handed this mail to a provider that is no longer configured; sending it through the others may deliver it twice",
			slog.String("provider_in_doubt", inDoubt))
	}
	now := m.nowFunc()
	route := make([]*provider, 0, len(m.providers))
	var open []*provider
	for _, p := range m.providers {
		if p.circuit.state(now) == circuitOpen {
			open = append(open, p)
		} else {
			route = append(route, p)
		}
	}
	return append(route, open...)
}

// send hands the job's mail to the providers of its route in turn until one takes it (then the
// acceptance, with the provider's name, is recorded before the job can complete), or one fails in
// a way that another provider must not or need not try:
//
//   - a permanent refusal (mail.ActionCancel: a 4xx from Resend, a 5xx reply from an SMTP
//     server) never fails over; a 5xx to RCPT TO also puts the address on the suppression list;
//   - a failure after which the provider may have the mail (mail.Outcome.MaybeAccepted) never
//     fails over: the message row keeps the provider in doubt, and the job's later attempts go
//     to it alone (route);
//   - an outage that left the provider without the mail (its error answer, a refused
//     connection) goes on to the next provider, logged and counted as a failover.
//
// Before each send the provider is recorded in doubt on the message row, unless it is already:
// should the worker die during the send, the rescued attempt knows where the mail may be. An
// answer that says the provider did not take it clears the doubt again.
func (m *mailer) send(a *attempt, user *Recipient, dl *delivery, purpose db.TokenPurpose) error {
	var (
		last    *provider
		lastErr error
	)
	for _, p := range m.route(a, dl.inDoubt) {
		if last != nil {
			m.failover(a, last, p, lastErr)
		}
		a.provider = p.name
		if err := m.pace(a, p); err != nil {
			return err
		}
		if dl.inDoubt != p.name {
			if err := m.setInDoubt(a, p.name); err != nil {
				return err
			}
			dl.inDoubt, dl.doubtIsOurs = p.name, true
		}

		providerID, err := p.sender.Send(a.ctx, dl.msg)
		if err == nil {
			m.recordAnswer(a, p, false)
			return m.markAccepted(a, p.name, providerID, purpose)
		}
		if a.ctx.Err() != nil {
			// Cut short (shutdown, the job's timeout): not the provider's answer; whatever
			// reached it stays in doubt.
			return sendError(a.ctx, a.job.Kind, err)
		}
		verdict := mail.Classify(err)
		m.recordAnswer(a, p, verdict.Outage)
		if verdict.MaybeAccepted {
			return sendError(a.ctx, a.job.Kind, err)
		}
		if dl.doubtIsOurs {
			// The provider said it did not take the mail: no earlier attempt left it there
			// either, so no doubt remains.
			if err := m.setInDoubt(a, ""); err != nil {
				return err
			}
			dl.inDoubt, dl.doubtIsOurs = "", false
		}
		if verdict.Bounce != nil {
			if err := m.bounce(a, user, verdict.Bounce, purpose); err != nil {
				return err
			}
		}
		if verdict.Action == mail.ActionCancel || !verdict.Outage {
			return sendError(a.ctx, a.job.Kind, err)
		}
		last, lastErr = p, err
	}
	if last == nil {
		// Not reached in practice: without providers the email queue is not worked at all.
		return errors.New("no mailer configured (MAILER=none)")
	}
	return sendError(a.ctx, a.job.Kind, lastErr)
}

// setInDoubt records provider ("" clears it) as the one the job's mail is handed to.
func (m *mailer) setInDoubt(a *attempt, provider string) error {
	params := &db.EmailMessageSetProviderInDoubtParams{JobID: a.job.ID, Now: m.nowFunc()}
	if provider != "" {
		params.Provider = &provider
	}
	if err := m.store.EmailMessageSetProviderInDoubt(a.ctx, params); err != nil {
		return fmt.Errorf("error recording the provider the job's email is handed to: %w", err)
	}
	return nil
}

// recordAnswer takes a provider's answer into its circuit, logging and counting a change.
func (m *mailer) recordAnswer(a *attempt, p *provider, outage bool) {
	if !p.circuit.record(outage, m.nowFunc()) {
		return
	}
	m.metrics.circuit(p.name, outage)
	if outage {
		a.logger.WarnContext(a.ctx, "the provider's circuit opened: attempts try the other providers first for a while",
			slog.String("provider", p.name), slog.Duration("cooldown", p.circuit.cooldown))
	} else {
		a.logger.InfoContext(a.ctx, "the provider's circuit closed: it takes mail again", slog.String("provider", p.name))
	}
}

// failover logs and counts an attempt going on from one provider to the next after err, an
// outage of from's that left it without the mail.
func (m *mailer) failover(a *attempt, from, to *provider, err error) {
	m.metrics.failover(from.name, to.name)
	a.logger.WarnContext(a.ctx, "email failing over to the next provider",
		slog.String("from", from.name), slog.String("to", to.name),
		slog.String("error", sendError(a.ctx, a.job.Kind, err).Error()))
}

// bounce records that the provider refused user's address for good while the job's mail was sent:
// the address goes on the suppression list (as a permanent bounce's would), the message row says
// bounced, and the job's sealed token is erased (nothing will send it).
func (m *mailer) bounce(a *attempt, user *Recipient, b *mail.Bounce, purpose db.TokenPurpose) error {
	now := m.nowFunc()
	err := m.store.Transact(a.ctx, func(ctx context.Context, tx db.Queries) error {
		if err := tx.EmailSuppressionInsert(ctx, &db.EmailSuppressionInsertParams{
			AddressHash:  email.SuppressionKey(m.links.secret, user.Email),
			Reason:       email.ReasonBounced,
			Detail:       b.Detail,
			EmailID:      b.EmailID,
			SuppressedAt: now,
			Now:          now,
		}); err != nil {
			return err
		}
		if err := tx.EmailMessageMarkBounced(ctx, &db.EmailMessageMarkBouncedParams{
			JobID:         a.job.ID,
			BounceType:    "Permanent",
			BounceSubType: b.Detail,
			Now:           now,
		}); err != nil {
			return err
		}
		if purpose == "" {
			return nil
		}
		return tx.EmailTokenEraseSealed(ctx, a.job.ID)
	})
	if err != nil {
		return fmt.Errorf("error recording the refusal of the job's recipient: %w", err)
	}
	a.logger.WarnContext(a.ctx, "the provider refused the recipient for good; the address is suppressed",
		slog.String("provider", a.provider), slog.String("detail", b.Detail))
	return nil
}
