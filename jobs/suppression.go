package jobs

import (
	"context"
	"errors"
	"fmt"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/email"
	"github.com/postguard/postguard/tokens"
)

// checkSuppression returns a *suppressedMail when user's address is on the suppression list (a
// permanent bounce, a complaint, or the provider's own suppression put it there), after marking
// the job's message row suppressed and erasing its sealed token (nothing will send it). Every
// kind is held back, verification and reset mail included: the address cannot take mail, or its
// owner asked not to get ours. It returns nil when the address is not on the list, and when the
// provider accepted the job's mail already (a rescued attempt): prepare then completes the job
// as sent, which it was.
func (m *mailer) checkSuppression(a *attempt, user *Recipient) error {
	suppression, err := m.store.EmailSuppressionGet(a.ctx, email.SuppressionKey(m.links.secret, user.Email))
	if errors.Is(err, db.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("error checking the suppression list: %w", err)
	}

	var marked bool
	err = m.store.Transact(a.ctx, func(ctx context.Context, tx db.Queries) error {
		var err error
		marked, err = tx.EmailMessageMarkSuppressed(ctx, &db.EmailMessageMarkSuppressedParams{
			JobID:  a.job.ID,
			Kind:   a.job.Kind,
			UserID: user.ID,
			// A key the row needs; nothing is sent under it.
			IdempotencyKey: tokens.IdempotencyKey(a.job.Kind, user.ID),
			Now:            m.nowFunc(),
		})
		if err != nil || !marked {
			return err
		}
		return tx.EmailTokenEraseSealed(ctx, a.job.ID)
	})
	if err != nil {
		return fmt.Errorf("error recording the suppression of the job's email: %w", err)
	}
	if !marked {
		return nil
	}
	return &suppressedMail{reason: fmt.Sprintf("the address is on the suppression list (%s); email not sent", suppression.Reason)}
}
