package jobs

import (
	"context"
	"errors"
	"fmt"

	"github.com/postguard/postguard/db"
)

// ErrNoRecipient says a job's user does not exist (any more): its mail is not sent, and the job
// completes. Recipients wrap it.
var ErrNoRecipient = errors.New("no such recipient")

// Recipient is who an email job's mail goes to, read from the user's table at each attempt.
type Recipient struct {
	// ID is the user id the job's args name. The worker sets it; a Recipients need not.
	ID int64
	// Email is the address the mail goes to, in any spelling: the workers mail its normal form
	// (email.Normalize), and look that up on the suppression list.
	Email string
	// Name greets the user in the mail; "" for none.
	Name string
	// Locale is the user's language, a BCP 47 tag; "" is the default locale.
	Locale string
	// Unsubscribed says the user opted out of welcome mail; verification and password reset
	// mail are still sent.
	Unsubscribed bool
}

// Recipients give the email workers a user's address, name and locale, and whether the user
// unsubscribed from welcome mail, from whichever table holds users: postguard's own
// (UserRecipients), or a host app's (a RecipientsFunc on its accounts).
type Recipients interface {
	// Recipient returns the recipient of userID, or an error wrapping ErrNoRecipient when there
	// is no such user (nothing is sent, the job completes). Any other error fails the attempt,
	// and River retries it.
	Recipient(ctx context.Context, userID int64) (*Recipient, error)
}

// RecipientsFunc is a function as a Recipients.
type RecipientsFunc func(ctx context.Context, userID int64) (*Recipient, error)

// Recipient implements Recipients.
func (f RecipientsFunc) Recipient(ctx context.Context, userID int64) (*Recipient, error) {
	return f(ctx, userID)
}

// UserRecipients are the recipients of postguard's own users table, through q (postguard's store or
// db.Tables).
func UserRecipients(q db.Queries) Recipients {
	return RecipientsFunc(func(ctx context.Context, userID int64) (*Recipient, error) {
		user, err := q.UserGetByID(ctx, userID)
		if errors.Is(err, db.ErrNotFound) {
			return nil, fmt.Errorf("%w: user %d: %w", ErrNoRecipient, userID, err)
		}
		if err != nil {
			return nil, err
		}
		return &Recipient{ID: user.ID, Email: user.Email, Name: user.Name, Locale: user.Locale, Unsubscribed: user.UnsubscribedAt != nil}, nil
	})
}
