package jobs

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/tokens"
)

// hostAccounts is a host app's own table of users, beside postguard's tables in one database,
// read by a RecipientsFunc as a host would: the workers never look at postguard's users.
type hostAccounts struct {
	store *dbtest.Store
	// reads counts the Recipients calls; fail, when set, is their error.
	reads int
	fail  error
}

func newHostAccounts(t *testing.T, store *dbtest.Store) *hostAccounts {
	t.Helper()
	h := &hostAccounts{store: store}
	h.exec(t, `CREATE TABLE accounts (
		id BIGINT PRIMARY KEY,
		email TEXT NOT NULL,
		display_name TEXT NOT NULL,
		language TEXT NOT NULL,
		welcome_opt_out BOOLEAN NOT NULL
	)`)
	// dbtest hands the schema to the next test once emptied: leave it as it was.
	t.Cleanup(func() {
		if store.Postgres != nil {
			_, err := store.Postgres.Pool().Exec(context.WithoutCancel(t.Context()), "DROP TABLE accounts")
			require.NoError(t, err)
		}
	})
	return h
}

func (h *hostAccounts) exec(t *testing.T, query string, args ...any) {
	t.Helper()
	var err error
	if h.store.Postgres != nil {
		_, err = h.store.Postgres.Pool().Exec(t.Context(), query, args...)
	} else {
		_, err = h.store.SQLite.DB().ExecContext(t.Context(), query, args...)
	}
	require.NoError(t, err)
}

func (h *hostAccounts) add(t *testing.T, id int64, email, name string, optOut bool) {
	t.Helper()
	h.exec(t, "INSERT INTO accounts (id, email, display_name, language, welcome_opt_out) VALUES ($1, $2, $3, 'fr', $4)", id, email, name, optOut)
}

// Recipient implements Recipients on the host's table.
func (h *hostAccounts) Recipient(ctx context.Context, userID int64) (*Recipient, error) {
	h.reads++
	if h.fail != nil {
		return nil, h.fail
	}
	const query = "SELECT email, display_name, language, welcome_opt_out FROM accounts WHERE id = $1"
	var r Recipient
	var row interface{ Scan(dest ...any) error }
	if h.store.Postgres != nil {
		row = h.store.Postgres.Pool().QueryRow(ctx, query, userID)
	} else {
		row = h.store.SQLite.DB().QueryRowContext(ctx, query, userID)
	}
	err := row.Scan(&r.Email, &r.Name, &r.Locale, &r.Unsubscribed)
	if errors.Is(err, sql.ErrNoRows) || errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("account %d: %w", userID, ErrNoRecipient)
	}
	return &r, err
}

func TestEmailWorkers_HostRecipients(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		setupHost := func(t *testing.T) (*testBundle, *hostAccounts) {
			t.Helper()
			var accounts *hostAccounts
			bundle := setup(t, newStore, &setupOpts{recipients: func(store *dbtest.Store) Recipients {
				accounts = newHostAccounts(t, store)
				return accounts
			}})
			return bundle, accounts
		}

		t.Run("WelcomeAndVerificationToTheHostsAccount", func(t *testing.T) {
			t.Parallel()

			bundle, accounts := setupHost(t)
			accounts.add(t, 501, "grace@example.org", "Grace", false)

			res, err := bundle.work(t, WelcomeEmailArgs{UserID: 501}, nil)
			require.NoError(t, err)
			require.Equal(t, rivertype.JobStateCompleted, res.Job.State)
			res, err = bundle.work(t, VerificationEmailArgs{UserID: 501}, nil)
			require.NoError(t, err)
			require.Equal(t, rivertype.JobStateCompleted, res.Job.State)

			deliveries := bundle.fake.Deliveries()
			require.Len(t, deliveries, 2)
			for _, d := range deliveries {
				require.Equal(t, []string{"grace@example.org"}, d.To)
				require.Contains(t, d.Text, "Grace")
			}
			require.Regexp(t, keyPattern("welcome_email", 501), deliveries[0].IdempotencyKey)
			require.Contains(t, deliveries[0].Headers["List-Unsubscribe"], tokens.Unsubscribe(testSecret, 501), "the unsubscribe link names the host's user id")

			// The verification token is kept for the host's user id: postguard's users table is
			// empty, and the host checks the link with EmailTokenConsume.
			raw := linkToken(t, deliveries[1].Text, testAppURL+"/v1/auth/verify-email?token=")
			userID, err := bundle.store.EmailTokenConsume(t.Context(), tokens.Hash(raw), db.TokenPurposeVerify, bundle.clock.Now())
			require.NoError(t, err)
			require.Equal(t, int64(501), userID)
			_, err = bundle.store.UserGetByID(t.Context(), 501)
			require.ErrorIs(t, err, db.ErrNotFound, "postguard's users table was never read or written")
		})

		t.Run("OptedOutOfWelcomeOnly", func(t *testing.T) {
			t.Parallel()

			bundle, accounts := setupHost(t)
			accounts.add(t, 502, "quiet@example.org", "Quiet", true)

			res, err := bundle.work(t, WelcomeEmailArgs{UserID: 502}, nil)
			require.NoError(t, err)
			require.Equal(t, rivertype.JobStateCompleted, res.Job.State)
			require.Empty(t, bundle.fake.Deliveries())
			require.Equal(t, float64(1), bundle.deliveries(t, "welcome_email", OutcomeSkipped))

			_, err = bundle.work(t, PasswordResetEmailArgs{UserID: 502}, nil)
			require.NoError(t, err)
			require.Len(t, bundle.fake.Deliveries(), 1, "reset mail is still sent")
		})

		t.Run("NoSuchAccountCompletes", func(t *testing.T) {
			t.Parallel()

			bundle, accounts := setupHost(t)
			res, err := bundle.work(t, VerificationEmailArgs{UserID: 999}, nil)
			require.NoError(t, err)
			require.Equal(t, rivertype.JobStateCompleted, res.Job.State)
			require.Equal(t, 1, accounts.reads)
			require.Empty(t, bundle.fake.Requests())
			require.Contains(t, bundle.logs.String(), "the user was deleted")
		})

		t.Run("AddressInItsNormalForm", func(t *testing.T) {
			t.Parallel()

			// The host's table keeps the address as its user typed it: mailed in its normal form.
			bundle, accounts := setupHost(t)
			accounts.add(t, 503, "  Ada@Bücher.DE ", "Ada", false)
			res, err := bundle.work(t, WelcomeEmailArgs{UserID: 503}, nil)
			require.NoError(t, err)
			require.Equal(t, rivertype.JobStateCompleted, res.Job.State)
			require.Equal(t, []string{"ada@xn--bcher-kva.de"}, bundle.fake.Deliveries()[0].To)
		})

		t.Run("NotAnAddressCancels", func(t *testing.T) {
			t.Parallel()

			// An address that is not one plain address can never be mailed: cancelled, not
			// retried, and the error names the user, not the address.
			bundle, accounts := setupHost(t)
			accounts.add(t, 504, "ada@[127.0.0.1]", "Ada", false)
			res, err := bundle.work(t, WelcomeEmailArgs{UserID: 504}, nil)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCancelled, res.EventKind)
			require.Equal(t, rivertype.JobStateCancelled, res.Job.State)
			require.Contains(t, res.Job.Errors[0].Error, "the address of user 504 is not one plain address")
			require.NotContains(t, res.Job.Errors[0].Error, "127.0.0.1")
			require.NotContains(t, bundle.logs.String(), "127.0.0.1")
			require.Empty(t, bundle.fake.Requests())
			require.Equal(t, float64(1), bundle.deliveries(t, "welcome_email", OutcomeCancelled))
		})

		t.Run("RecipientsErrorRetries", func(t *testing.T) {
			t.Parallel()

			bundle, accounts := setupHost(t)
			accounts.fail = errors.New("accounts table unreachable")
			res, err := bundle.work(t, WelcomeEmailArgs{UserID: 501}, nil)
			require.ErrorContains(t, err, "accounts table unreachable")
			require.Equal(t, rivertype.JobStateRetryable, res.Job.State)
			require.Empty(t, bundle.fake.Requests())

			// Next attempt, the table answers: delivered.
			accounts.fail = nil
			accounts.add(t, 501, "grace@example.org", "Grace", false)
			res, err = bundle.workAgain(t, res.Job)
			require.NoError(t, err)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)
			require.Len(t, bundle.fake.Deliveries(), 1)
		})
	})
}

func TestUserRecipients(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		store := newStore(t)
		user := createUser(t, store)
		recipients := UserRecipients(store)

		r, err := recipients.Recipient(t.Context(), user.ID)
		require.NoError(t, err)
		require.Equal(t, &Recipient{ID: user.ID, Email: user.Email, Name: user.Name}, r)

		_, err = store.UserUnsubscribe(t.Context(), user.ID, user.CreatedAt)
		require.NoError(t, err)
		r, err = recipients.Recipient(t.Context(), user.ID)
		require.NoError(t, err)
		require.True(t, r.Unsubscribed)

		_, err = recipients.Recipient(t.Context(), user.ID+1000)
		require.ErrorIs(t, err, ErrNoRecipient)
		require.ErrorIs(t, err, db.ErrNotFound)
	})
}
