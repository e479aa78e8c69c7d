package db_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/email"
	"github.com/postguard/postguard/internal/dbtest"
)

// The conformance suite: every test runs unchanged on both engines through dbtest.Engines.

// now is a fixed instant at the engines' precision (microseconds).
var now = time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.UTC)

func requireTimeEqual(t *testing.T, want time.Time, got *time.Time) {
	t.Helper()

	require.NotNil(t, got)
	require.True(t, want.Equal(*got), "want %s, got %s", want, *got)
}

// waitForLockWait returns once a backend of the database waits on a lock that
// EmailMessageGetByProviderID asked for, or once done has a value (which it leaves there).
func waitForLockWait(t *testing.T, pool *pgxpool.Pool, done chan error) {
	t.Helper()

	ticker := time.NewTicker(time.Millisecond)
	defer ticker.Stop()
	for {
		var waiting int
		err := pool.QueryRow(t.Context(), `
			SELECT count(*)
			FROM pg_stat_activity
			WHERE datname = current_database()
				AND wait_event_type = 'Lock'
				AND query LIKE '%EmailMessageGetByProviderID%'`).Scan(&waiting)
		require.NoError(t, err)
		if waiting > 0 {
			return
		}
		select {
		case err := <-done:
			done <- err
			return
		case <-ticker.C:
		}
	}
}

func tokenHash(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

func userInsert(ctx context.Context, t *testing.T, queries db.Queries, email string) *db.User {
	t.Helper()

	user, err := queries.UserInsert(ctx, &db.UserInsertParams{
		Email:        email,
		Name:         "Ada",
		Now:          now,
		PasswordHash: "hash",
	})
	require.NoError(t, err)
	return user
}

func TestStore_EmailToken(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		type testBundle struct {
			store db.Tables
			user  *db.User
		}

		setup := func(t *testing.T) (*testBundle, context.Context) {
			t.Helper()

			ctx := t.Context()
			store := newStore(t)
			return &testBundle{
				store: store,
				user:  userInsert(ctx, t, store, "ada@example.com"),
			}, ctx
		}

		var jobSeq atomic.Int64 // the job each token pretends to come from
		tokenInsert := func(ctx context.Context, t *testing.T, bundle *testBundle, raw string, purpose db.TokenPurpose, expiresAt time.Time) int64 {
			t.Helper()

			jobID := jobSeq.Add(1)
			require.NoError(t, bundle.store.EmailTokenInsert(ctx, &db.EmailTokenInsertParams{
				ExpiresAt: expiresAt,
				JobID:     jobID,
				Now:       now,
				Purpose:   purpose,
				Sealed:    []byte("sealed " + raw),
				TokenHash: tokenHash(raw),
				UserID:    bundle.user.ID,
			}))
			return jobID
		}

		t.Run("ConsumeConcurrent", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)
			tokenInsert(ctx, t, bundle, "tok", db.TokenPurposeVerify, now.Add(time.Hour))

			const workers = 10
			var (
				wg     sync.WaitGroup
				errs   = make([]error, workers)
				userID = make([]int64, workers)
			)
			for i := range workers {
				wg.Go(func() {
					userID[i], errs[i] = bundle.store.EmailTokenConsume(ctx, tokenHash("tok"), db.TokenPurposeVerify, now)
				})
			}
			wg.Wait()

			var won int
			for i, err := range errs {
				if err == nil {
					won++
					require.Equal(t, bundle.user.ID, userID[i])
					continue
				}
				require.ErrorIs(t, err, db.ErrNotFound)
			}
			require.Equal(t, 1, won)
		})

		t.Run("ConsumeExpired", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)
			expiresAt := now.Add(time.Hour)
			tokenInsert(ctx, t, bundle, "tok", db.TokenPurposeVerify, expiresAt)

			_, err := bundle.store.EmailTokenConsume(ctx, tokenHash("tok"), db.TokenPurposeVerify, expiresAt)
			require.ErrorIs(t, err, db.ErrNotFound)

			userID, err := bundle.store.EmailTokenConsume(ctx, tokenHash("tok"), db.TokenPurposeVerify, expiresAt.Add(-time.Microsecond))
			require.NoError(t, err)
			require.Equal(t, bundle.user.ID, userID)
		})

		t.Run("ConsumeOnce", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)
			tokenInsert(ctx, t, bundle, "tok", db.TokenPurposeReset, now.Add(time.Hour))

			userID, err := bundle.store.EmailTokenConsume(ctx, tokenHash("tok"), db.TokenPurposeReset, now)
			require.NoError(t, err)
			require.Equal(t, bundle.user.ID, userID)

			_, err = bundle.store.EmailTokenConsume(ctx, tokenHash("tok"), db.TokenPurposeReset, now)
			require.ErrorIs(t, err, db.ErrNotFound)
		})

		t.Run("ConsumeUnknown", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)

			_, err := bundle.store.EmailTokenConsume(ctx, tokenHash("nope"), db.TokenPurposeVerify, now)
			require.ErrorIs(t, err, db.ErrNotFound)
		})

		t.Run("ConsumeWrongPurpose", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)
			tokenInsert(ctx, t, bundle, "tok", db.TokenPurposeVerify, now.Add(time.Hour))

			_, err := bundle.store.EmailTokenConsume(ctx, tokenHash("tok"), db.TokenPurposeReset, now)
			require.ErrorIs(t, err, db.ErrNotFound)

			// The failed attempt did not spend it.
			_, err = bundle.store.EmailTokenConsume(ctx, tokenHash("tok"), db.TokenPurposeVerify, now)
			require.NoError(t, err)
		})

		t.Run("DeleteExpired", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)
			for i := range 3 {
				tokenInsert(ctx, t, bundle, fmt.Sprintf("expired%d", i), db.TokenPurposeVerify, now.Add(-time.Minute))
			}
			tokenInsert(ctx, t, bundle, "valid", db.TokenPurposeVerify, now.Add(time.Hour))

			for _, want := range []int64{2, 1, 0} {
				deleted, err := bundle.store.EmailTokenDeleteExpired(ctx, now, 2)
				require.NoError(t, err)
				require.Equal(t, want, deleted)
			}

			_, err := bundle.store.EmailTokenConsume(ctx, tokenHash("valid"), db.TokenPurposeVerify, now)
			require.NoError(t, err)
		})

		t.Run("EraseSealed", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)
			jobID := tokenInsert(ctx, t, bundle, "tok", db.TokenPurposeVerify, now.Add(time.Hour))
			otherJobID := tokenInsert(ctx, t, bundle, "other", db.TokenPurposeVerify, now.Add(time.Hour))

			require.NoError(t, bundle.store.EmailTokenEraseSealed(ctx, jobID))
			require.NoError(t, bundle.store.EmailTokenEraseSealed(ctx, jobID), "erasing twice is harmless")
			require.NoError(t, bundle.store.EmailTokenEraseSealed(ctx, 999_999), "a job without a token is fine")

			tok, err := bundle.store.EmailTokenGetByJob(ctx, jobID)
			require.NoError(t, err)
			require.Nil(t, tok.Sealed)
			other, err := bundle.store.EmailTokenGetByJob(ctx, otherJobID)
			require.NoError(t, err)
			require.Equal(t, []byte("sealed other"), other.Sealed)

			// The token itself still works: only its sealed copy is gone.
			_, err = bundle.store.EmailTokenConsume(ctx, tokenHash("tok"), db.TokenPurposeVerify, now)
			require.NoError(t, err)
		})

		t.Run("EraseSealedBefore", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)
			var old []int64
			for i := range 3 {
				old = append(old, tokenInsert(ctx, t, bundle, fmt.Sprintf("old%d", i), db.TokenPurposeVerify, now.Add(time.Hour)))
			}

			for _, want := range []int64{2, 1, 0} {
				erased, err := bundle.store.EmailTokenEraseSealedBefore(ctx, now.Add(time.Microsecond), 2)
				require.NoError(t, err)
				require.Equal(t, want, erased)
			}
			for _, jobID := range old {
				tok, err := bundle.store.EmailTokenGetByJob(ctx, jobID)
				require.NoError(t, err)
				require.Nil(t, tok.Sealed)
			}

			young := tokenInsert(ctx, t, bundle, "young", db.TokenPurposeVerify, now.Add(time.Hour))
			erased, err := bundle.store.EmailTokenEraseSealedBefore(ctx, now, 10)
			require.NoError(t, err)
			require.Zero(t, erased, "created at the cutoff: kept")
			tok, err := bundle.store.EmailTokenGetByJob(ctx, young)
			require.NoError(t, err)
			require.NotNil(t, tok.Sealed)
		})

		t.Run("GetByJob", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)
			jobID := tokenInsert(ctx, t, bundle, "tok", db.TokenPurposeReset, now.Add(time.Hour))

			tok, err := bundle.store.EmailTokenGetByJob(ctx, jobID)
			require.NoError(t, err)
			require.Equal(t, tokenHash("tok"), tok.TokenHash)
			require.Equal(t, bundle.user.ID, tok.UserID)
			require.Equal(t, db.TokenPurposeReset, tok.Purpose)
			require.Equal(t, jobID, tok.JobID)
			require.Equal(t, []byte("sealed tok"), tok.Sealed)
			requireTimeEqual(t, now.Add(time.Hour), &tok.ExpiresAt)
			requireTimeEqual(t, now, &tok.CreatedAt)
			require.Nil(t, tok.UsedAt)

			_, err = bundle.store.EmailTokenGetByJob(ctx, jobID+1)
			require.ErrorIs(t, err, db.ErrNotFound)
		})

		t.Run("DeleteByJob", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)
			jobID := tokenInsert(ctx, t, bundle, "tok", db.TokenPurposeReset, now.Add(time.Hour))
			require.NoError(t, bundle.store.EmailTokenDeleteByJob(ctx, jobID))
			require.NoError(t, bundle.store.EmailTokenDeleteByJob(ctx, jobID), "none left is fine")

			_, err := bundle.store.EmailTokenConsume(ctx, tokenHash("tok"), db.TokenPurposeReset, now)
			require.ErrorIs(t, err, db.ErrNotFound)
		})

		t.Run("InsertOneTokenPerJob", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)
			jobID := tokenInsert(ctx, t, bundle, "tok", db.TokenPurposeVerify, now.Add(time.Hour))

			err := bundle.store.EmailTokenInsert(ctx, &db.EmailTokenInsertParams{
				ExpiresAt: now.Add(time.Hour),
				JobID:     jobID,
				Now:       now,
				Purpose:   db.TokenPurposeVerify,
				TokenHash: tokenHash("second"),
				UserID:    bundle.user.ID,
			})
			require.Error(t, err)
		})

		t.Run("InsertUserOfAnotherTable", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)

			// A token's user may be a host app's, in a table of its own (the Go library's
			// workers read recipients through jobs.Recipients): no foreign key to users.
			err := bundle.store.EmailTokenInsert(ctx, &db.EmailTokenInsertParams{
				ExpiresAt: now.Add(time.Hour),
				JobID:     1,
				Now:       now,
				Purpose:   db.TokenPurposeVerify,
				TokenHash: tokenHash("tok"),
				UserID:    bundle.user.ID + 1000,
			})
			require.NoError(t, err)
			userID, err := bundle.store.EmailTokenConsume(ctx, tokenHash("tok"), db.TokenPurposeVerify, now)
			require.NoError(t, err)
			require.Equal(t, bundle.user.ID+1000, userID)
		})

		t.Run("LookupUsesNothing", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)
			expiresAt := now.Add(time.Hour)
			tokenInsert(ctx, t, bundle, "tok", db.TokenPurposeReset, expiresAt)
			tokenInsert(ctx, t, bundle, "verify", db.TokenPurposeVerify, expiresAt)
			want := &db.TokenOwner{UserID: bundle.user.ID, Locale: bundle.user.Locale}

			for range 3 {
				owner, err := bundle.store.EmailTokenLookup(ctx, tokenHash("tok"), db.TokenPurposeReset, now)
				require.NoError(t, err)
				require.Equal(t, want, owner)
			}
			// Inside a transaction too.
			require.NoError(t, bundle.store.Transact(ctx, func(ctx context.Context, tx db.Queries) error {
				owner, err := tx.EmailTokenLookup(ctx, tokenHash("tok"), db.TokenPurposeReset, now)
				require.Equal(t, want, owner)
				return err
			}))

			for name, lookup := range map[string]struct {
				raw     string
				purpose db.TokenPurpose
				at      time.Time
			}{
				"Unknown":      {"nope", db.TokenPurposeReset, now},
				"WrongPurpose": {"verify", db.TokenPurposeReset, now},
				"Expired":      {"tok", db.TokenPurposeReset, expiresAt},
			} {
				_, err := bundle.store.EmailTokenLookup(ctx, tokenHash(lookup.raw), lookup.purpose, lookup.at)
				require.ErrorIs(t, err, db.ErrNotFound, name)
			}
			owner, err := bundle.store.EmailTokenLookup(ctx, tokenHash("tok"), db.TokenPurposeReset, expiresAt.Add(-time.Microsecond))
			require.NoError(t, err)
			require.Equal(t, want, owner)

			// The lookups used nothing: the token is consumed once, then no longer found.
			userID, err := bundle.store.EmailTokenConsume(ctx, tokenHash("tok"), db.TokenPurposeReset, now)
			require.NoError(t, err)
			require.Equal(t, bundle.user.ID, userID)
			_, err = bundle.store.EmailTokenLookup(ctx, tokenHash("tok"), db.TokenPurposeReset, now)
			require.ErrorIs(t, err, db.ErrNotFound)
		})

		t.Run("LookupReadsTheUsersLocale", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)
			amelie, err := bundle.store.UserInsert(ctx, &db.UserInsertParams{Email: "amelie@example.fr", PasswordHash: "hash", Locale: "fr-CA", Now: now})
			require.NoError(t, err)
			for raw, userID := range map[string]int64{"amelie": amelie.ID, "gone": amelie.ID + 1000} {
				require.NoError(t, bundle.store.EmailTokenInsert(ctx, &db.EmailTokenInsertParams{
					ExpiresAt: now.Add(time.Hour),
					JobID:     userID,
					Now:       now,
					Purpose:   db.TokenPurposeVerify,
					TokenHash: tokenHash(raw),
					UserID:    userID,
				}))
			}

			owner, err := bundle.store.EmailTokenLookup(ctx, tokenHash("amelie"), db.TokenPurposeVerify, now)
			require.NoError(t, err)
			require.Equal(t, &db.TokenOwner{UserID: amelie.ID, Locale: "fr-CA"}, owner)

			// A token whose user is not in the users table (gone, or a host app's) is still found.
			owner, err = bundle.store.EmailTokenLookup(ctx, tokenHash("gone"), db.TokenPurposeVerify, now)
			require.NoError(t, err)
			require.Equal(t, &db.TokenOwner{UserID: amelie.ID + 1000, Locale: ""}, owner)
		})

		t.Run("InvalidateUser", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)
			tokenInsert(ctx, t, bundle, "verify1", db.TokenPurposeVerify, now.Add(time.Hour))
			tokenInsert(ctx, t, bundle, "verify2", db.TokenPurposeVerify, now.Add(time.Hour))
			tokenInsert(ctx, t, bundle, "reset", db.TokenPurposeReset, now.Add(time.Hour))

			other := userInsert(ctx, t, bundle.store, "grace@example.com")
			require.NoError(t, bundle.store.EmailTokenInsert(ctx, &db.EmailTokenInsertParams{
				ExpiresAt: now.Add(time.Hour),
				JobID:     1000,
				Now:       now,
				Purpose:   db.TokenPurposeVerify,
				TokenHash: tokenHash("other"),
				UserID:    other.ID,
			}))

			require.NoError(t, bundle.store.EmailTokenInvalidateUser(ctx, bundle.user.ID, db.TokenPurposeVerify, now))

			for _, raw := range []string{"verify1", "verify2"} {
				_, err := bundle.store.EmailTokenConsume(ctx, tokenHash(raw), db.TokenPurposeVerify, now)
				require.ErrorIs(t, err, db.ErrNotFound)
			}
			_, err := bundle.store.EmailTokenConsume(ctx, tokenHash("reset"), db.TokenPurposeReset, now)
			require.NoError(t, err)
			_, err = bundle.store.EmailTokenConsume(ctx, tokenHash("other"), db.TokenPurposeVerify, now)
			require.NoError(t, err)
		})
	})
}

func TestStore_EmailMessage(t *testing.T) {
	t.Parallel()

	traceParent := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		insert := func(ctx context.Context, t *testing.T, store db.Tables, jobID int64, key string, at time.Time) *db.EmailMessage {
			t.Helper()

			message, err := store.EmailMessageInsert(ctx, &db.EmailMessageInsertParams{
				JobID:          jobID,
				Kind:           "verification_email",
				UserID:         7,
				IdempotencyKey: key,
				Now:            at,
				Locale:         "fr",
				PayloadSHA256:  bytes.Repeat([]byte{1}, 32),
				TraceParent:    &traceParent,
			})
			require.NoError(t, err)
			require.Equal(t, traceParent, *message.TraceParent)
			return message
		}

		t.Run("InsertAndGet", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			inserted := insert(ctx, t, store, 42, "verification_email:7:k1", now)

			got, err := store.EmailMessageGetByJob(ctx, 42)
			require.NoError(t, err)
			require.Equal(t, inserted, got)
			require.Equal(t, int64(42), got.JobID)
			require.Equal(t, "verification_email", got.Kind)
			require.Equal(t, int64(7), got.UserID)
			require.Equal(t, "verification_email:7:k1", got.IdempotencyKey)
			require.Equal(t, email.StatusQueued, got.Status)
			requireTimeEqual(t, now, &got.KeyCreatedAt)
			requireTimeEqual(t, now, &got.CreatedAt)
			require.Nil(t, got.ProviderID)
			require.Nil(t, got.AcceptedAt)
			require.Equal(t, "fr", got.Locale)
			require.Equal(t, bytes.Repeat([]byte{1}, 32), got.PayloadSHA256)

			_, err = store.EmailMessageGetByJob(ctx, 43)
			require.ErrorIs(t, err, db.ErrNotFound)
		})

		t.Run("InsertTwiceForAJob", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			insert(ctx, t, store, 42, "k1", now)

			// Inside a transaction, which stays usable after the refusal.
			err := store.Transact(ctx, func(ctx context.Context, tx db.Queries) error {
				_, err := tx.EmailMessageInsert(ctx, &db.EmailMessageInsertParams{JobID: 42, Kind: "welcome_email", UserID: 7, IdempotencyKey: "k2", Now: now})
				require.ErrorIs(t, err, db.ErrExists)
				_, err = tx.EmailMessageGetByJob(ctx, 42)
				return err
			})
			require.NoError(t, err)

			got, err := store.EmailMessageGetByJob(ctx, 42)
			require.NoError(t, err)
			require.Equal(t, "k1", got.IdempotencyKey, "the first stays")
		})

		t.Run("KeysAreUnique", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			insert(ctx, t, store, 42, "k1", now)
			_, err := store.EmailMessageInsert(ctx, &db.EmailMessageInsertParams{JobID: 43, Kind: "welcome_email", UserID: 7, IdempotencyKey: "k1", Now: now})
			require.Error(t, err)
		})

		t.Run("MarkAccepted", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			insert(ctx, t, store, 42, "k1", now)

			require.NoError(t, store.EmailMessageMarkAccepted(ctx, &db.EmailMessageMarkAcceptedParams{JobID: 42, Provider: "resend", ProviderID: "re_1", Now: now.Add(time.Second)}))
			// A second acceptance (a retry the provider answered idempotently) keeps the first.
			require.NoError(t, store.EmailMessageMarkAccepted(ctx, &db.EmailMessageMarkAcceptedParams{JobID: 42, Provider: "resend", ProviderID: "re_2", Now: now.Add(time.Minute)}))

			got, err := store.EmailMessageGetByJob(ctx, 42)
			require.NoError(t, err)
			require.Equal(t, email.StatusSent, got.Status)
			require.Equal(t, "re_1", *got.ProviderID)
			requireTimeEqual(t, now.Add(time.Second), got.AcceptedAt)
			requireTimeEqual(t, now.Add(time.Second), got.SentAt)
			require.Nil(t, got.StatusAt, "sent by the worker's own word, not a provider event")

			require.ErrorIs(t, store.EmailMessageMarkAccepted(ctx, &db.EmailMessageMarkAcceptedParams{JobID: 43, Provider: "resend", ProviderID: "re_3", Now: now}), db.ErrNotFound)
		})

		t.Run("MarkAcceptedKeepsLaterStatus", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			insert(ctx, t, store, 42, "k1", now)
			require.NoError(t, store.EmailMessageMarkAccepted(ctx, &db.EmailMessageMarkAcceptedParams{JobID: 42, Provider: "resend", ProviderID: "re_1", Now: now}))
			delivered := now.Add(time.Minute)
			require.NoError(t, store.EmailMessageSetLifecycle(ctx, &db.EmailMessageLifecycleParams{
				JobID: 42, Status: email.StatusDelivered, StatusAt: &delivered, SentAt: &now, DeliveredAt: &delivered, Now: delivered,
			}))

			// A later attempt that records the acceptance again (its first record's answer was
			// lost) leaves the provider's word alone.
			require.NoError(t, store.EmailMessageMarkAccepted(ctx, &db.EmailMessageMarkAcceptedParams{JobID: 42, Provider: "resend", ProviderID: "re_1", Now: now.Add(time.Hour)}))
			got, err := store.EmailMessageGetByJob(ctx, 42)
			require.NoError(t, err)
			require.Equal(t, email.StatusDelivered, got.Status)
			requireTimeEqual(t, delivered, got.StatusAt)
			requireTimeEqual(t, now, got.SentAt)
		})

		t.Run("GetByProviderID", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			insert(ctx, t, store, 42, "k1", now)
			insert(ctx, t, store, 43, "k2", now)
			require.NoError(t, store.EmailMessageMarkAccepted(ctx, &db.EmailMessageMarkAcceptedParams{JobID: 42, Provider: "resend", ProviderID: "re_1", Now: now}))

			err := store.Transact(ctx, func(ctx context.Context, tx db.Queries) error {
				got, err := tx.EmailMessageGetByProviderID(ctx, "re_1")
				require.NoError(t, err)
				require.Equal(t, int64(42), got.JobID)
				_, err = tx.EmailMessageGetByProviderID(ctx, "re_unknown")
				require.ErrorIs(t, err, db.ErrNotFound)
				return nil
			})
			require.NoError(t, err)
		})

		t.Run("ProviderIDsMayRepeat", func(t *testing.T) {
			t.Parallel()

			// Resend's ids are unique; a sender that repeats one (a no-op sender) still sends.
			ctx, store := t.Context(), newStore(t)
			insert(ctx, t, store, 42, "k1", now)
			insert(ctx, t, store, 43, "k2", now)
			require.NoError(t, store.EmailMessageMarkAccepted(ctx, &db.EmailMessageMarkAcceptedParams{JobID: 42, Provider: "resend", ProviderID: "noop", Now: now}))
			require.NoError(t, store.EmailMessageMarkAccepted(ctx, &db.EmailMessageMarkAcceptedParams{JobID: 43, Provider: "resend", ProviderID: "noop", Now: now}))
			got, err := store.EmailMessageGetByProviderID(ctx, "noop")
			require.NoError(t, err)
			require.Equal(t, int64(43), got.JobID, "the newest")
		})

		t.Run("GetByProviderIDLocksInTx", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			insert(ctx, t, store, 42, "k1", now)
			require.NoError(t, store.EmailMessageMarkAccepted(ctx, &db.EmailMessageMarkAcceptedParams{JobID: 42, Provider: "resend", ProviderID: "re_1", Now: now}))

			// Two transactions each read the message and write what they read plus a status
			// time of their own. The second reads while the first holds the row: it must wait
			// and read the first's write, or one of the two writes is lost.
			readAndSet := func(ctx context.Context, tx db.Queries, status string, read chan<- struct{}, release <-chan struct{}) error {
				message, err := tx.EmailMessageGetByProviderID(ctx, "re_1")
				if err != nil {
					return err
				}
				if read != nil {
					close(read)
					<-release
				}
				at := now.Add(time.Minute)
				params := &db.EmailMessageLifecycleParams{
					JobID: 42, Status: status, StatusAt: &at, Now: at,
					DeliveredAt: message.DeliveredAt, ComplainedAt: message.ComplainedAt,
				}
				if status == email.StatusDelivered {
					params.DeliveredAt = &at
				} else {
					params.ComplainedAt = &at
				}
				return tx.EmailMessageSetLifecycle(ctx, params)
			}

			read, release := make(chan struct{}), make(chan struct{})
			first, second := make(chan error, 1), make(chan error, 1)
			go func() {
				first <- store.Transact(ctx, func(ctx context.Context, tx db.Queries) error {
					return readAndSet(ctx, tx, email.StatusDelivered, read, release)
				})
			}()
			<-read
			go func() {
				second <- store.Transact(ctx, func(ctx context.Context, tx db.Queries) error {
					return readAndSet(ctx, tx, email.StatusComplained, nil, nil)
				})
			}()
			if store.Postgres != nil {
				// Until the second waits on a lock, or (were the row not locked) is done. SQLite's
				// second transaction waits for the one connection.
				waitForLockWait(t, store.Postgres.Pool(), second)
			}
			close(release)
			require.NoError(t, <-first)
			require.NoError(t, <-second)

			got, err := store.EmailMessageGetByJob(ctx, 42)
			require.NoError(t, err)
			require.NotNil(t, got.DeliveredAt, "neither write is lost")
			require.NotNil(t, got.ComplainedAt, "neither write is lost")
		})

		t.Run("SetLifecycle", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			insert(ctx, t, store, 42, "k1", now)
			require.NoError(t, store.EmailMessageMarkAccepted(ctx, &db.EmailMessageMarkAcceptedParams{JobID: 42, Provider: "resend", ProviderID: "re_1", Now: now}))

			times := make([]time.Time, 8)
			for i := range times {
				times[i] = now.Add(time.Duration(i+1) * time.Second)
			}
			bounceType, subType := "Permanent", "General"
			params := &db.EmailMessageLifecycleParams{
				JobID:         42,
				Status:        email.StatusBounced,
				StatusAt:      &times[0],
				SentAt:        &times[1],
				DeliveredAt:   &times[2],
				DelayedAt:     &times[3],
				BouncedAt:     &times[4],
				ComplainedAt:  &times[5],
				SuppressedAt:  &times[6],
				FailedAt:      &times[7],
				BounceType:    &bounceType,
				BounceSubType: &subType,
				Now:           now.Add(time.Hour),
			}
			require.NoError(t, store.EmailMessageSetLifecycle(ctx, params))

			got, err := store.EmailMessageGetByJob(ctx, 42)
			require.NoError(t, err)
			require.Equal(t, email.StatusBounced, got.Status)
			for i, field := range []*time.Time{got.StatusAt, got.SentAt, got.DeliveredAt, got.DelayedAt, got.BouncedAt, got.ComplainedAt, got.SuppressedAt, got.FailedAt} {
				requireTimeEqual(t, times[i], field)
			}
			require.Equal(t, "Permanent", *got.BounceType)
			require.Equal(t, "General", *got.BounceSubType)
			requireTimeEqual(t, now.Add(time.Hour), &got.UpdatedAt)
			require.Equal(t, "k1", got.IdempotencyKey, "the rest stays")

			// nil clears.
			require.NoError(t, store.EmailMessageSetLifecycle(ctx, &db.EmailMessageLifecycleParams{JobID: 42, Status: email.StatusSent, Now: now}))
			got, err = store.EmailMessageGetByJob(ctx, 42)
			require.NoError(t, err)
			require.Nil(t, got.StatusAt)
			require.Nil(t, got.BouncedAt)
			require.Nil(t, got.BounceType)

			require.ErrorIs(t, store.EmailMessageSetLifecycle(ctx, &db.EmailMessageLifecycleParams{JobID: 43, Status: email.StatusSent, Now: now}), db.ErrNotFound)
		})

		t.Run("MarkSuppressed", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			params := func(jobID int64, key string, at time.Time) *db.EmailMessageMarkSuppressedParams {
				return &db.EmailMessageMarkSuppressedParams{JobID: jobID, Kind: "password_reset_email", UserID: 7, IdempotencyKey: key, Now: at}
			}

			// A job's first attempt: a new row.
			marked, err := store.EmailMessageMarkSuppressed(ctx, params(42, "k1", now))
			require.NoError(t, err)
			require.True(t, marked)
			got, err := store.EmailMessageGetByJob(ctx, 42)
			require.NoError(t, err)
			require.Equal(t, email.StatusSuppressed, got.Status)
			require.Equal(t, "password_reset_email", got.Kind)
			requireTimeEqual(t, now, got.SuppressedAt)
			requireTimeEqual(t, now, &got.CreatedAt)
			require.Nil(t, got.StatusAt)
			require.Nil(t, got.AcceptedAt)

			// Again (a rescued attempt): the first time stays.
			marked, err = store.EmailMessageMarkSuppressed(ctx, params(42, "k2", now.Add(time.Minute)))
			require.NoError(t, err)
			require.True(t, marked)
			got, err = store.EmailMessageGetByJob(ctx, 42)
			require.NoError(t, err)
			require.Equal(t, "k1", got.IdempotencyKey)
			requireTimeEqual(t, now, got.SuppressedAt)

			// A later attempt of a job whose first attempt failed: its row turns suppressed.
			insert(ctx, t, store, 43, "k3", now)
			marked, err = store.EmailMessageMarkSuppressed(ctx, params(43, "k4", now.Add(time.Minute)))
			require.NoError(t, err)
			require.True(t, marked)
			got, err = store.EmailMessageGetByJob(ctx, 43)
			require.NoError(t, err)
			require.Equal(t, email.StatusSuppressed, got.Status)
			require.Equal(t, "k3", got.IdempotencyKey)
			requireTimeEqual(t, now.Add(time.Minute), got.SuppressedAt)

			// A job whose mail the provider accepted is left alone.
			insert(ctx, t, store, 44, "k5", now)
			require.NoError(t, store.EmailMessageMarkAccepted(ctx, &db.EmailMessageMarkAcceptedParams{JobID: 44, Provider: "resend", ProviderID: "re_1", Now: now}))
			marked, err = store.EmailMessageMarkSuppressed(ctx, params(44, "k6", now.Add(time.Minute)))
			require.NoError(t, err)
			require.False(t, marked)
			got, err = store.EmailMessageGetByJob(ctx, 44)
			require.NoError(t, err)
			require.Equal(t, email.StatusSent, got.Status)
			require.Nil(t, got.SuppressedAt)

			// In a transaction, which stays usable after a conflict.
			err = store.Transact(ctx, func(ctx context.Context, tx db.Queries) error {
				marked, err := tx.EmailMessageMarkSuppressed(ctx, params(44, "k7", now))
				require.False(t, marked)
				if err != nil {
					return err
				}
				_, err = tx.EmailMessageGetByJob(ctx, 44)
				return err
			})
			require.NoError(t, err)
		})

		t.Run("ListByUser", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			for i := range 4 {
				_, err := store.EmailMessageInsert(ctx, &db.EmailMessageInsertParams{
					JobID: int64(i + 1), Kind: "welcome_email", UserID: 7, IdempotencyKey: fmt.Sprintf("k%d", i), Now: now.Add(time.Duration(i) * time.Second),
				})
				require.NoError(t, err)
			}
			_, err := store.EmailMessageInsert(ctx, &db.EmailMessageInsertParams{JobID: 10, Kind: "welcome_email", UserID: 8, IdempotencyKey: "other", Now: now})
			require.NoError(t, err)

			got, err := store.EmailMessageListByUser(ctx, 7, 3)
			require.NoError(t, err)
			var ids []int64
			for _, message := range got {
				require.Equal(t, int64(7), message.UserID)
				ids = append(ids, message.JobID)
			}
			require.Equal(t, []int64{4, 3, 2}, ids, "newest first, at most max")

			got, err = store.EmailMessageListByUser(ctx, 9, 3)
			require.NoError(t, err)
			require.Empty(t, got)
		})

		t.Run("Rekey", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			insert(ctx, t, store, 42, "k1", now)

			rekey := func(jobID int64, key string, at time.Time) error {
				return store.EmailMessageRekey(ctx, &db.EmailMessageRekeyParams{
					JobID:          jobID,
					IdempotencyKey: key,
					Locale:         "pt-BR",
					PayloadSHA256:  bytes.Repeat([]byte{2}, 32),
					Now:            at,
				})
			}
			require.NoError(t, rekey(42, "k2", now.Add(25*time.Hour)))
			got, err := store.EmailMessageGetByJob(ctx, 42)
			require.NoError(t, err)
			require.Equal(t, "k2", got.IdempotencyKey)
			require.Equal(t, "pt-BR", got.Locale)
			require.Equal(t, bytes.Repeat([]byte{2}, 32), got.PayloadSHA256)
			requireTimeEqual(t, now.Add(25*time.Hour), &got.KeyCreatedAt)
			requireTimeEqual(t, now, &got.CreatedAt)

			// An accepted message keeps its key.
			require.NoError(t, store.EmailMessageMarkAccepted(ctx, &db.EmailMessageMarkAcceptedParams{JobID: 42, Provider: "resend", ProviderID: "re_1", Now: now}))
			require.ErrorIs(t, rekey(42, "k3", now), db.ErrNotFound)
			require.ErrorIs(t, rekey(43, "k4", now), db.ErrNotFound)
		})

		t.Run("ProviderInDoubtUntilAccepted", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			insert(ctx, t, store, 42, "k1", now)
			inDoubt := func(provider *string) error {
				return store.EmailMessageSetProviderInDoubt(ctx, &db.EmailMessageSetProviderInDoubtParams{JobID: 42, Provider: provider, Now: now})
			}
			got, err := store.EmailMessageGetByJob(ctx, 42)
			require.NoError(t, err)
			require.Nil(t, got.ProviderInDoubt, "no provider has had a new message")
			require.Nil(t, got.Provider)

			smtp := "smtp"
			require.NoError(t, inDoubt(&smtp))
			got, err = store.EmailMessageGetByJob(ctx, 42)
			require.NoError(t, err)
			require.Equal(t, "smtp", *got.ProviderInDoubt)
			require.NoError(t, inDoubt(nil))
			got, err = store.EmailMessageGetByJob(ctx, 42)
			require.NoError(t, err)
			require.Nil(t, got.ProviderInDoubt, "cleared once the provider said it did not take the mail")

			// The acceptance names its provider and ends the doubt; the first acceptance stays.
			require.NoError(t, inDoubt(&smtp))
			require.NoError(t, store.EmailMessageMarkAccepted(ctx, &db.EmailMessageMarkAcceptedParams{JobID: 42, Provider: "smtp", ProviderID: "<id@example.com>", Now: now}))
			require.NoError(t, store.EmailMessageMarkAccepted(ctx, &db.EmailMessageMarkAcceptedParams{JobID: 42, Provider: "resend", ProviderID: "re_1", Now: now.Add(time.Minute)}))
			got, err = store.EmailMessageGetByJob(ctx, 42)
			require.NoError(t, err)
			require.Equal(t, "smtp", *got.Provider)
			require.Equal(t, "<id@example.com>", *got.ProviderID)
			require.Nil(t, got.ProviderInDoubt)

			// An accepted message is in doubt of nothing, and a job without a message has none.
			require.ErrorIs(t, inDoubt(&smtp), db.ErrNotFound)
			require.ErrorIs(t, store.EmailMessageSetProviderInDoubt(ctx, &db.EmailMessageSetProviderInDoubtParams{JobID: 43, Provider: &smtp, Now: now}), db.ErrNotFound)
		})

		t.Run("RekeyEndsTheDoubt", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			insert(ctx, t, store, 42, "k1", now)
			resend := "resend"
			require.NoError(t, store.EmailMessageSetProviderInDoubt(ctx, &db.EmailMessageSetProviderInDoubtParams{JobID: 42, Provider: &resend, Now: now}))
			require.NoError(t, store.EmailMessageRekey(ctx, &db.EmailMessageRekeyParams{JobID: 42, IdempotencyKey: "k2", Locale: "fr", Now: now}))
			got, err := store.EmailMessageGetByJob(ctx, 42)
			require.NoError(t, err)
			require.Nil(t, got.ProviderInDoubt)
		})

		t.Run("MarkBounced", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			insert(ctx, t, store, 42, "k1", now)
			smtp := "smtp"
			require.NoError(t, store.EmailMessageSetProviderInDoubt(ctx, &db.EmailMessageSetProviderInDoubtParams{JobID: 42, Provider: &smtp, Now: now}))
			bounce := &db.EmailMessageMarkBouncedParams{JobID: 42, BounceType: "Permanent", BounceSubType: "SMTP 550 5.1.1", Now: now.Add(time.Second)}
			require.NoError(t, store.EmailMessageMarkBounced(ctx, bounce))

			got, err := store.EmailMessageGetByJob(ctx, 42)
			require.NoError(t, err)
			require.Equal(t, email.StatusBounced, got.Status)
			requireTimeEqual(t, now.Add(time.Second), got.StatusAt)
			requireTimeEqual(t, now.Add(time.Second), got.BouncedAt)
			require.Equal(t, "Permanent", *got.BounceType)
			require.Equal(t, "SMTP 550 5.1.1", *got.BounceSubType)
			require.Nil(t, got.ProviderInDoubt)
			require.Nil(t, got.AcceptedAt)

			insert(ctx, t, store, 43, "k2", now)
			require.NoError(t, store.EmailMessageMarkAccepted(ctx, &db.EmailMessageMarkAcceptedParams{JobID: 43, Provider: "smtp", ProviderID: "<id@example.com>", Now: now}))
			bounce.JobID = 43
			require.ErrorIs(t, store.EmailMessageMarkBounced(ctx, bounce), db.ErrNotFound, "an accepted message is left alone")
		})

		t.Run("DeleteBefore", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			for i := range 3 {
				insert(ctx, t, store, int64(i+1), fmt.Sprintf("old%d", i), now.Add(-time.Hour))
			}
			insert(ctx, t, store, 10, "kept", now)

			for _, want := range []int64{2, 1, 0} {
				deleted, err := store.EmailMessageDeleteBefore(ctx, now, 2)
				require.NoError(t, err)
				require.Equal(t, want, deleted)
			}
			_, err := store.EmailMessageGetByJob(ctx, 10)
			require.NoError(t, err)
		})
	})
}

func TestStore_EmailSuppression(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		insert := func(ctx context.Context, t *testing.T, queries db.Queries, address string, reason string, at time.Time) {
			t.Helper()

			require.NoError(t, queries.EmailSuppressionInsert(ctx, &db.EmailSuppressionInsertParams{
				AddressHash:  tokenHash(address),
				Reason:       reason,
				Detail:       "General",
				EmailID:      "re_" + address,
				SuppressedAt: at,
				Now:          at.Add(time.Second),
			}))
		}

		t.Run("InsertAndGet", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			insert(ctx, t, store, "ada", email.ReasonBounced, now)

			got, err := store.EmailSuppressionGet(ctx, tokenHash("ada"))
			require.NoError(t, err)
			require.Equal(t, tokenHash("ada"), got.AddressHash)
			require.Equal(t, email.ReasonBounced, got.Reason)
			require.Equal(t, "General", got.Detail)
			require.Equal(t, "re_ada", got.EmailID)
			requireTimeEqual(t, now, &got.SuppressedAt)
			requireTimeEqual(t, now.Add(time.Second), &got.CreatedAt)

			_, err = store.EmailSuppressionGet(ctx, tokenHash("bob"))
			require.ErrorIs(t, err, db.ErrNotFound)
		})

		t.Run("InsertKeepsFirst", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			insert(ctx, t, store, "ada", email.ReasonBounced, now)
			// Inside a transaction, which stays usable.
			err := store.Transact(ctx, func(ctx context.Context, tx db.Queries) error {
				insert(ctx, t, tx, "ada", email.ReasonComplained, now.Add(time.Hour))
				_, err := tx.EmailSuppressionGet(ctx, tokenHash("ada"))
				return err
			})
			require.NoError(t, err)

			got, err := store.EmailSuppressionGet(ctx, tokenHash("ada"))
			require.NoError(t, err)
			require.Equal(t, email.ReasonBounced, got.Reason)
			requireTimeEqual(t, now, &got.SuppressedAt)
		})

		t.Run("InsertRefusesUnknownReason", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			err := store.EmailSuppressionInsert(ctx, &db.EmailSuppressionInsertParams{
				AddressHash: tokenHash("ada"), Reason: "bored", EmailID: "re_1", SuppressedAt: now, Now: now,
			})
			require.Error(t, err)
		})

		t.Run("Delete", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			insert(ctx, t, store, "ada", email.ReasonBounced, now)
			insert(ctx, t, store, "bob", email.ReasonBounced, now)

			deleted, err := store.EmailSuppressionDelete(ctx, tokenHash("ada"))
			require.NoError(t, err)
			require.True(t, deleted)
			deleted, err = store.EmailSuppressionDelete(ctx, tokenHash("ada"))
			require.NoError(t, err)
			require.False(t, deleted)

			_, err = store.EmailSuppressionGet(ctx, tokenHash("ada"))
			require.ErrorIs(t, err, db.ErrNotFound)
			_, err = store.EmailSuppressionGet(ctx, tokenHash("bob"))
			require.NoError(t, err)
		})

		t.Run("ListPages", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			// Five suppressions, two of them at one instant: the hash orders those.
			for i, address := range []string{"a", "b", "c", "d"} {
				insert(ctx, t, store, address, email.ReasonBounced, now.Add(time.Duration(i)*time.Second))
			}
			insert(ctx, t, store, "e", email.ReasonComplained, now.Add(3*time.Second))

			var seen []string
			params := &db.EmailSuppressionListParams{BeforeAt: now.Add(100 * 365 * 24 * time.Hour), Max: 2}
			for range 4 {
				page, err := store.EmailSuppressionList(ctx, params)
				require.NoError(t, err)
				require.LessOrEqual(t, len(page), 2)
				for _, suppression := range page {
					seen = append(seen, suppression.EmailID)
				}
				if len(page) < params.Max {
					break
				}
				last := page[len(page)-1]
				params = &db.EmailSuppressionListParams{BeforeAt: last.SuppressedAt, BeforeHash: last.AddressHash, Max: 2}
			}
			require.Len(t, seen, 5, "every suppression once: %v", seen)
			require.ElementsMatch(t, []string{"re_d", "re_e"}, seen[:2], "newest first")
			require.Equal(t, []string{"re_c", "re_b", "re_a"}, seen[2:])
		})
	})
}

func TestStore_WebhookEvent(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		t.Run("InsertOnce", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			require.NoError(t, store.WebhookEventInsert(ctx, "msg_1", now))
			require.NoError(t, store.WebhookEventInsert(ctx, "msg_2", now))

			// A replay, inside a transaction that stays usable.
			err := store.Transact(ctx, func(ctx context.Context, tx db.Queries) error {
				require.ErrorIs(t, tx.WebhookEventInsert(ctx, "msg_1", now.Add(time.Minute)), db.ErrExists)
				return tx.WebhookEventInsert(ctx, "msg_3", now)
			})
			require.NoError(t, err)
			require.ErrorIs(t, store.WebhookEventInsert(ctx, "msg_3", now), db.ErrExists)
		})

		t.Run("InsertConcurrent", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			var recorded, replayed atomic.Int64
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					err := store.Transact(ctx, func(ctx context.Context, tx db.Queries) error {
						return tx.WebhookEventInsert(ctx, "msg_1", now)
					})
					switch {
					case err == nil:
						recorded.Add(1)
					case errors.Is(err, db.ErrExists):
						replayed.Add(1)
					default:
						require.NoError(t, err)
					}
				})
			}
			wg.Wait()
			require.Equal(t, int64(1), recorded.Load())
			require.Equal(t, int64(7), replayed.Load())
		})

		t.Run("DeleteBefore", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			for i := range 3 {
				require.NoError(t, store.WebhookEventInsert(ctx, fmt.Sprintf("old%d", i), now.Add(-time.Hour)))
			}
			require.NoError(t, store.WebhookEventInsert(ctx, "kept", now))

			for _, want := range []int64{2, 1, 0} {
				deleted, err := store.WebhookEventDeleteBefore(ctx, now, 2)
				require.NoError(t, err)
				require.Equal(t, want, deleted)
			}
			require.ErrorIs(t, store.WebhookEventInsert(ctx, "kept", now), db.ErrExists)
			require.NoError(t, store.WebhookEventInsert(ctx, "old0", now), "pruned: a replay this late applies again")
		})
	})
}

func TestStore_SecretCheck(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		t.Run("FirstRecordedStays", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			recorded, err := store.SecretCheckRecord(ctx, &db.SecretCheckParams{CheckValue: []byte("first"), Now: now})
			require.NoError(t, err)
			require.Equal(t, []byte("first"), recorded)
			recorded, err = store.SecretCheckRecord(ctx, &db.SecretCheckParams{CheckValue: []byte("second"), Now: now})
			require.NoError(t, err)
			require.Equal(t, []byte("first"), recorded, "a second secret reads the first's")

			require.NoError(t, store.SecretCheckReplace(ctx, &db.SecretCheckParams{CheckValue: []byte("second"), Now: now}))
			recorded, err = store.SecretCheckRecord(ctx, &db.SecretCheckParams{CheckValue: []byte("third"), Now: now})
			require.NoError(t, err)
			require.Equal(t, []byte("second"), recorded)
		})

		// Processes starting at once with different secrets: one value is recorded, and every
		// one of them reads it.
		t.Run("Concurrent", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			got := make([][]byte, 8)
			var wg sync.WaitGroup
			for i := range got {
				wg.Go(func() {
					recorded, err := store.SecretCheckRecord(ctx, &db.SecretCheckParams{CheckValue: []byte{byte(i)}, Now: now})
					require.NoError(t, err)
					got[i] = recorded
				})
			}
			wg.Wait()
			for _, recorded := range got {
				require.Equal(t, got[0], recorded)
			}
		})
	})
}

func TestTables_Transact(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		setup := func(t *testing.T) (db.Tables, context.Context) {
			t.Helper()

			return newStore(t), t.Context()
		}

		t.Run("EmailTakenKeepsTxUsable", func(t *testing.T) {
			t.Parallel()

			store, ctx := setup(t)
			userInsert(ctx, t, store, "ada@example.com")

			require.NoError(t, store.Transact(ctx, func(ctx context.Context, tx db.Queries) error {
				_, err := tx.UserInsert(ctx, &db.UserInsertParams{Email: "ada@example.com", Now: now, PasswordHash: "hash"})
				require.ErrorIs(t, err, db.ErrEmailTaken)

				// No statement failed, so the transaction goes on.
				userInsert(ctx, t, tx, "grace@example.com")
				return nil
			}))

			_, err := store.UserGetByEmail(ctx, "grace@example.com")
			require.NoError(t, err)
		})

		t.Run("Panic", func(t *testing.T) {
			t.Parallel()

			store, ctx := setup(t)

			require.PanicsWithValue(t, "boom", func() {
				_ = store.Transact(ctx, func(ctx context.Context, tx db.Queries) error {
					userInsert(ctx, t, tx, "ada@example.com")
					panic("boom")
				})
			})

			// Rolled back, and the connection is free again (SQLite has only one).
			_, err := store.UserGetByEmail(ctx, "ada@example.com")
			require.ErrorIs(t, err, db.ErrNotFound)
		})

	})
}

func TestStore_Engine(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		store := newStore(t)
		require.Equal(t, strings.ToLower(strings.TrimPrefix(t.Name(), "TestStore_Engine/")), store.Engine())
	})
}

func TestStore_RateLimitCounter(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		window := func(key string, start time.Time, limit int64) *db.RateLimitCounterConsumeParams {
			return &db.RateLimitCounterConsumeParams{
				KeyHash:     tokenHash(key),
				LimitCount:  limit,
				WindowEnd:   start.Add(15 * time.Minute),
				WindowStart: start,
			}
		}

		t.Run("Concurrent", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)

			const workers = 50
			var (
				wg     sync.WaitGroup
				counts = make([]int64, workers)
				errs   = make([]error, workers)
				oks    = make([]bool, workers)
			)
			for i := range workers {
				wg.Go(func() {
					counts[i], oks[i], errs[i] = store.RateLimitCounterConsume(ctx, window("ip", now, 5))
				})
			}
			wg.Wait()

			seen := make(map[int64]bool)
			for i := range workers {
				require.NoError(t, errs[i])
				if oks[i] {
					require.False(t, seen[counts[i]], "count %d returned twice", counts[i])
					seen[counts[i]] = true
				}
			}
			require.Equal(t, map[int64]bool{1: true, 2: true, 3: true, 4: true, 5: true}, seen)
		})

		t.Run("ConsumeToLimit", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)

			for want := int64(1); want <= 3; want++ {
				count, ok, err := store.RateLimitCounterConsume(ctx, window("ip", now, 3))
				require.NoError(t, err)
				require.True(t, ok)
				require.Equal(t, want, count)
			}

			count, ok, err := store.RateLimitCounterConsume(ctx, window("ip", now, 3))
			require.NoError(t, err)
			require.False(t, ok)
			require.Equal(t, int64(3), count)

			// Other keys and the next window count from 1.
			count, ok, err = store.RateLimitCounterConsume(ctx, window("email", now, 3))
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, int64(1), count)

			count, ok, err = store.RateLimitCounterConsume(ctx, window("ip", now.Add(15*time.Minute), 3))
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, int64(1), count)
		})

		t.Run("DeleteExpired", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)

			for i := range 5 {
				_, _, err := store.RateLimitCounterConsume(ctx, window(fmt.Sprintf("old%d", i), now.Add(-time.Hour), 5))
				require.NoError(t, err)
			}
			_, _, err := store.RateLimitCounterConsume(ctx, window("current", now, 5))
			require.NoError(t, err)

			for _, want := range []int64{2, 2, 1, 0} {
				deleted, err := store.RateLimitCounterDeleteExpired(ctx, now, 2)
				require.NoError(t, err)
				require.Equal(t, want, deleted)
			}

			// The current window was kept.
			count, _, err := store.RateLimitCounterConsume(ctx, window("current", now, 5))
			require.NoError(t, err)
			require.Equal(t, int64(2), count)
		})

		t.Run("Delete", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)
			del := func(key string, start time.Time) {
				t.Helper()
				require.NoError(t, store.RateLimitCounterDelete(ctx, &db.RateLimitCounterDeleteParams{KeyHash: tokenHash(key), WindowStart: start, WindowEnd: start.Add(15 * time.Minute)}))
			}

			for range 3 {
				_, _, err := store.RateLimitCounterConsume(ctx, window("ip", now, 3))
				require.NoError(t, err)
				_, _, err = store.RateLimitCounterConsume(ctx, window("ip", now.Add(-15*time.Minute), 3))
				require.NoError(t, err)
				_, _, err = store.RateLimitCounterConsume(ctx, window("email", now, 3))
				require.NoError(t, err)
			}
			_, ok, err := store.RateLimitCounterConsume(ctx, window("ip", now, 3))
			require.NoError(t, err)
			require.False(t, ok, "at the limit")

			del("ip", now)
			del("ip", now)      // none left: fine
			del("unknown", now) // never counted: fine
			count, ok, err := store.RateLimitCounterConsume(ctx, window("ip", now, 3))
			require.NoError(t, err)
			require.True(t, ok, "the window starts afresh")
			require.Equal(t, int64(1), count)

			// Other windows and keys are untouched.
			for _, w := range []*db.RateLimitCounterConsumeParams{window("ip", now.Add(-15*time.Minute), 3), window("email", now, 3)} {
				_, ok, err := store.RateLimitCounterConsume(ctx, w)
				require.NoError(t, err)
				require.False(t, ok)
			}
		})

		t.Run("GetSpendsNothing", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)
			get := func(key string, start time.Time) int64 {
				t.Helper()
				count, err := store.RateLimitCounterGet(ctx, &db.RateLimitCounterGetParams{KeyHash: tokenHash(key), WindowStart: start, WindowEnd: start.Add(15 * time.Minute)})
				require.NoError(t, err)
				return count
			}

			// A window nothing counted in reads 0, and reading it creates nothing.
			for range 3 {
				require.Zero(t, get("ip", now))
			}
			deleted, err := store.RateLimitCounterDeleteExpired(ctx, now.Add(time.Hour), 100)
			require.NoError(t, err)
			require.Zero(t, deleted, "a read inserted a counter")

			for want := int64(1); want <= 2; want++ {
				_, ok, err := store.RateLimitCounterConsume(ctx, window("ip", now, 2))
				require.NoError(t, err)
				require.True(t, ok)
				require.Equal(t, want, get("ip", now))
				require.Equal(t, want, get("ip", now), "reading twice spends nothing")
			}

			// A refusal leaves the count at the limit.
			_, ok, err := store.RateLimitCounterConsume(ctx, window("ip", now, 2))
			require.NoError(t, err)
			require.False(t, ok)
			require.Equal(t, int64(2), get("ip", now))

			// Other keys and other windows are their own.
			require.Zero(t, get("email", now))
			require.Zero(t, get("ip", now.Add(15*time.Minute)))

			// The reads did not spend: under a higher limit the count goes on from 2.
			count, ok, err := store.RateLimitCounterConsume(ctx, window("ip", now, 10))
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, int64(3), count)
		})

		t.Run("RefusedNotCounted", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)

			for range 2 {
				_, ok, err := store.RateLimitCounterConsume(ctx, window("ip", now, 2))
				require.NoError(t, err)
				require.True(t, ok)
			}
			for range 3 {
				_, ok, err := store.RateLimitCounterConsume(ctx, window("ip", now, 2))
				require.NoError(t, err)
				require.False(t, ok)
			}

			// Under a higher limit the count goes on from 2: the refusals were not counted.
			count, ok, err := store.RateLimitCounterConsume(ctx, window("ip", now, 10))
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, int64(3), count)
		})
	})
}

func TestStore_RateLimitCounterConsumeChain(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		window := func(key string, limit int64) db.RateLimitCounterConsumeParams {
			return db.RateLimitCounterConsumeParams{
				KeyHash:     tokenHash(key),
				LimitCount:  limit,
				WindowEnd:   now.Add(15 * time.Minute),
				WindowStart: now,
			}
		}
		count := func(t *testing.T, store db.Tables, key string) int64 {
			t.Helper()
			n, err := store.RateLimitCounterGet(t.Context(), &db.RateLimitCounterGetParams{KeyHash: tokenHash(key), WindowStart: now, WindowEnd: now.Add(15 * time.Minute)})
			require.NoError(t, err)
			return n
		}

		t.Run("SpendsInOrderWhileAdmitted", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)

			chain := &db.RateLimitCounterChainParams{Windows: []db.RateLimitCounterConsumeParams{
				window("ip", 3), window("email", 1), window("key", 5),
			}}
			result, err := store.RateLimitCounterConsumeChain(ctx, chain)
			require.NoError(t, err)
			require.Equal(t, []int64{1, 1, 1}, result.Counts)

			// The email's window is full: the IP spends, the email refuses and counts nothing,
			// the key is not spent.
			result, err = store.RateLimitCounterConsumeChain(ctx, chain)
			require.NoError(t, err)
			require.Equal(t, []int64{2}, result.Counts)
			require.Equal(t, []int64{2, 1, 1}, []int64{count(t, store, "ip"), count(t, store, "email"), count(t, store, "key")})

			_, _, err = store.RateLimitCounterConsume(ctx, &db.RateLimitCounterConsumeParams{
				KeyHash: tokenHash("alone"), WindowStart: now, WindowEnd: now.Add(15 * time.Minute), LimitCount: 3,
			})
			require.NoError(t, err)

			// The IP's window fills, then refuses first: nothing after it is spent.
			_, err = store.RateLimitCounterConsumeChain(ctx, chain)
			require.NoError(t, err)
			result, err = store.RateLimitCounterConsumeChain(ctx, chain)
			require.NoError(t, err)
			require.Empty(t, result.Counts)
			require.Equal(t, []int64{3, 1, 1}, []int64{count(t, store, "ip"), count(t, store, "email"), count(t, store, "key")})

			// A chain of one window is that window's statement.
			for _, want := range [][]int64{{2}, {3}, nil} {
				result, err = store.RateLimitCounterConsumeChain(ctx, &db.RateLimitCounterChainParams{Windows: []db.RateLimitCounterConsumeParams{window("alone", 3)}})
				require.NoError(t, err)
				require.Equal(t, want, result.Counts)
			}

			// A window with room is not spent after a refusal either.
			result, err = store.RateLimitCounterConsumeChain(ctx, &db.RateLimitCounterChainParams{Windows: []db.RateLimitCounterConsumeParams{
				window("ip", 3), window("other-email", 5),
			}})
			require.NoError(t, err)
			require.Empty(t, result.Counts)
			require.Zero(t, count(t, store, "other-email"), "spent after the IP refused")
		})

		t.Run("ReadsTheUserWhenAllAdmitted", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)
			user := userInsert(ctx, t, store, "ada@example.com")
			want, err := store.UserGetByID(ctx, user.ID)
			require.NoError(t, err)

			chain := func(email string) *db.RateLimitCounterChainParams {
				return &db.RateLimitCounterChainParams{
					Windows:   []db.RateLimitCounterConsumeParams{window("ip", 100), window(email, 1)},
					UserEmail: email,
				}
			}
			result, err := store.RateLimitCounterConsumeChain(ctx, chain("ada@example.com"))
			require.NoError(t, err)
			require.Len(t, result.Counts, 2)
			require.Equal(t, want, result.User)

			result, err = store.RateLimitCounterConsumeChain(ctx, chain("nobody@example.com"))
			require.NoError(t, err)
			require.Len(t, result.Counts, 2)
			require.Nil(t, result.User, "no such user")

			result, err = store.RateLimitCounterConsumeChain(ctx, chain("ada@example.com"))
			require.NoError(t, err)
			require.Equal(t, []int64{3}, result.Counts)
			require.Nil(t, result.User, "read although the email's window refused")

			result, err = store.RateLimitCounterConsumeChain(ctx, &db.RateLimitCounterChainParams{
				Windows: []db.RateLimitCounterConsumeParams{window("ip", 100)},
			})
			require.NoError(t, err)
			require.Nil(t, result.User, "read without an email")
		})

		t.Run("ConcurrentChainsExact", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)

			// 60 requests from 3 IPs (limit 8 each) for one email (limit 10): the email counts
			// only what the IPs admitted, and never more than its limit.
			const requests = 60
			var (
				wg      sync.WaitGroup
				results = make([]*db.RateLimitCounterChainResult, requests)
				errs    = make([]error, requests)
			)
			for i := range requests {
				wg.Go(func() {
					results[i], errs[i] = store.RateLimitCounterConsumeChain(ctx, &db.RateLimitCounterChainParams{
						Windows: []db.RateLimitCounterConsumeParams{window(fmt.Sprintf("ip%d", i%3), 8), window("email", 10)},
					})
				})
			}
			wg.Wait()

			byLength := make(map[int]int)
			for i := range requests {
				require.NoError(t, errs[i])
				byLength[len(results[i].Counts)]++
			}
			require.Equal(t, map[int]int{0: requests - 24, 1: 24 - 10, 2: 10}, byLength)
			require.Equal(t, int64(10), count(t, store, "email"))
			for i := range 3 {
				require.Equal(t, int64(8), count(t, store, fmt.Sprintf("ip%d", i)))
			}
		})

		t.Run("GetManyReadsInOrder", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)

			_, err := store.RateLimitCounterConsumeChain(ctx, &db.RateLimitCounterChainParams{Windows: []db.RateLimitCounterConsumeParams{
				window("ip", 5), window("key", 5),
			}})
			require.NoError(t, err)
			_, _, err = store.RateLimitCounterConsume(ctx, &db.RateLimitCounterConsumeParams{
				KeyHash: tokenHash("key"), WindowStart: now, WindowEnd: now.Add(15 * time.Minute), LimitCount: 5,
			})
			require.NoError(t, err)

			result, err := store.RateLimitCounterGetMany(ctx, &db.RateLimitCounterWindowsParams{Windows: []db.RateLimitCounterGetParams{
				{KeyHash: tokenHash("key"), WindowStart: now, WindowEnd: now.Add(15 * time.Minute)},
				{KeyHash: tokenHash("never"), WindowStart: now, WindowEnd: now.Add(15 * time.Minute)},
				{KeyHash: tokenHash("ip"), WindowStart: now, WindowEnd: now.Add(15 * time.Minute)},
			}})
			require.NoError(t, err)
			require.Equal(t, []int64{2, 0, 1}, result.Counts)
			require.False(t, result.DeviceTrusted)

			result, err = store.RateLimitCounterGetMany(ctx, &db.RateLimitCounterWindowsParams{Windows: []db.RateLimitCounterGetParams{
				{KeyHash: tokenHash("ip"), WindowStart: now.Add(-15 * time.Minute), WindowEnd: now},
			}})
			require.NoError(t, err)
			require.Equal(t, []int64{0}, result.Counts, "another window")
		})

		t.Run("RefusesBadChains", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)

			for _, windows := range [][]db.RateLimitCounterConsumeParams{
				nil,
				{window("a", 1), window("b", 1), window("c", 1), window("d", 1)},
			} {
				_, err := store.RateLimitCounterConsumeChain(ctx, &db.RateLimitCounterChainParams{Windows: windows})
				require.ErrorContains(t, err, "a rate limit chain has 1 to 3 windows")
			}
			noKey := window("a", 1)
			noKey.KeyHash = nil
			_, err := store.RateLimitCounterConsumeChain(ctx, &db.RateLimitCounterChainParams{Windows: []db.RateLimitCounterConsumeParams{window("b", 1), noKey}})
			require.ErrorContains(t, err, "rate limit chain window 2: no key")

			// A window is named by its end too (SQLite finds a counter by it): one without an end
			// after its start is refused, never read or spent as another window.
			noEnd := window("a", 1)
			noEnd.WindowEnd = time.Time{}
			_, err = store.RateLimitCounterConsumeChain(ctx, &db.RateLimitCounterChainParams{Windows: []db.RateLimitCounterConsumeParams{noEnd}})
			require.ErrorContains(t, err, "rate limit chain window 1: its end")
			_, _, err = store.RateLimitCounterConsume(ctx, &noEnd)
			require.ErrorContains(t, err, "is not after its start")
			_, err = store.RateLimitCounterGet(ctx, &db.RateLimitCounterGetParams{KeyHash: noEnd.KeyHash, WindowStart: noEnd.WindowStart})
			require.ErrorContains(t, err, "is not after its start")
			require.ErrorContains(t, store.RateLimitCounterDelete(ctx, &db.RateLimitCounterDeleteParams{KeyHash: noEnd.KeyHash, WindowStart: now, WindowEnd: now}), "is not after its start")
			_, err = store.RateLimitCounterGetMany(ctx, &db.RateLimitCounterWindowsParams{Windows: []db.RateLimitCounterGetParams{{KeyHash: noEnd.KeyHash, WindowStart: now}}})
			require.ErrorContains(t, err, "rate limit chain window 1: its end")
		})
	})
}

func TestStore_RateLimitCounterRefund(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		spend := func(t *testing.T, store db.Tables, key string, start time.Time, times int) {
			t.Helper()
			for range times {
				_, ok, err := store.RateLimitCounterConsume(t.Context(), &db.RateLimitCounterConsumeParams{
					KeyHash: tokenHash(key), WindowStart: start, WindowEnd: start.Add(15 * time.Minute), LimitCount: 5,
				})
				require.NoError(t, err)
				require.True(t, ok)
			}
		}
		count := func(t *testing.T, store db.Tables, key string, start time.Time) int64 {
			t.Helper()
			n, err := store.RateLimitCounterGet(t.Context(), &db.RateLimitCounterGetParams{KeyHash: tokenHash(key), WindowStart: start, WindowEnd: start.Add(15 * time.Minute)})
			require.NoError(t, err)
			return n
		}
		refund := func(t *testing.T, store db.Tables, windows ...db.RateLimitCounterGetParams) {
			t.Helper()
			trusted, err := store.RateLimitCounterRefund(t.Context(), &db.RateLimitCounterWindowsParams{Windows: windows})
			require.NoError(t, err)
			require.False(t, trusted, "no device")
		}
		window := func(key string, start time.Time) db.RateLimitCounterGetParams {
			return db.RateLimitCounterGetParams{KeyHash: tokenHash(key), WindowStart: start, WindowEnd: start.Add(15 * time.Minute)}
		}

		t.Run("GivesOneBackToEachWindow", func(t *testing.T) {
			t.Parallel()

			store := newStore(t)
			spend(t, store, "ip", now, 5)
			spend(t, store, "key", now, 2)
			spend(t, store, "ip", now.Add(-15*time.Minute), 3)

			refund(t, store, window("ip", now), window("key", now))
			require.Equal(t, int64(4), count(t, store, "ip", now))
			require.Equal(t, int64(1), count(t, store, "key", now))
			require.Equal(t, int64(3), count(t, store, "ip", now.Add(-15*time.Minute)), "another window is untouched")

			// The refunded request can be spent again: the window at its limit admits once more.
			spend(t, store, "ip", now, 1)
			_, ok, err := store.RateLimitCounterConsume(t.Context(), &db.RateLimitCounterConsumeParams{
				KeyHash: tokenHash("ip"), WindowStart: now, WindowEnd: now.Add(15 * time.Minute), LimitCount: 5,
			})
			require.NoError(t, err)
			require.False(t, ok)
		})

		t.Run("NeverBelowZero", func(t *testing.T) {
			t.Parallel()

			store := newStore(t)
			spend(t, store, "ip", now, 1)
			for range 3 {
				refund(t, store, window("ip", now), window("never", now))
			}
			require.Zero(t, count(t, store, "ip", now))
			require.Zero(t, count(t, store, "never", now))
			deleted, err := store.RateLimitCounterDeleteExpired(t.Context(), now.Add(time.Hour), 100)
			require.NoError(t, err)
			require.Equal(t, int64(1), deleted, "a refund inserts no counter")
		})

		t.Run("ConcurrentRefundsNeverBelowZero", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)
			spend(t, store, "ip", now, 5)
			spend(t, store, "key", now, 5)

			// 40 refunds of both windows at once, beside 10 chains spending them: the counts end
			// at 0 or above, and every spend that was admitted is still counted or refunded.
			var wg sync.WaitGroup
			errs := make([]error, 50)
			admitted := make([]int, 50)
			for i := range 50 {
				wg.Go(func() {
					if i%5 == 0 {
						result, err := store.RateLimitCounterConsumeChain(ctx, &db.RateLimitCounterChainParams{Windows: []db.RateLimitCounterConsumeParams{
							{KeyHash: tokenHash("ip"), WindowStart: now, WindowEnd: now.Add(15 * time.Minute), LimitCount: 5},
							{KeyHash: tokenHash("key"), WindowStart: now, WindowEnd: now.Add(15 * time.Minute), LimitCount: 5},
						}})
						errs[i] = err
						if err == nil {
							admitted[i] = len(result.Counts)
						}
						return
					}
					_, errs[i] = store.RateLimitCounterRefund(ctx, &db.RateLimitCounterWindowsParams{Windows: []db.RateLimitCounterGetParams{window("ip", now), window("key", now)}})
				})
			}
			wg.Wait()
			for _, err := range errs {
				require.NoError(t, err)
			}
			for _, key := range []string{"ip", "key"} {
				n := count(t, store, key, now)
				require.GreaterOrEqual(t, n, int64(0), key)
				require.LessOrEqual(t, n, int64(5), key)
			}
		})
	})
}

func TestStore_RateLimitCounterDeleteMany(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		t.Run("DeletesTheNamedWindows", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)
			for _, key := range []string{"ip", "key", "other"} {
				for _, start := range []time.Time{now, now.Add(-15 * time.Minute)} {
					_, _, err := store.RateLimitCounterConsume(ctx, &db.RateLimitCounterConsumeParams{
						KeyHash: tokenHash(key), WindowStart: start, WindowEnd: start.Add(15 * time.Minute), LimitCount: 5,
					})
					require.NoError(t, err)
				}
			}

			trusted, err := store.RateLimitCounterDeleteMany(ctx, &db.RateLimitCounterWindowsParams{Windows: []db.RateLimitCounterGetParams{
				{KeyHash: tokenHash("ip"), WindowStart: now, WindowEnd: now.Add(15 * time.Minute)},
				{KeyHash: tokenHash("key"), WindowStart: now, WindowEnd: now.Add(15 * time.Minute)},
				{KeyHash: tokenHash("never"), WindowStart: now, WindowEnd: now.Add(15 * time.Minute)},
			}})
			require.NoError(t, err)
			require.False(t, trusted)

			result, err := store.RateLimitCounterGetMany(ctx, &db.RateLimitCounterWindowsParams{Windows: []db.RateLimitCounterGetParams{
				{KeyHash: tokenHash("ip"), WindowStart: now, WindowEnd: now.Add(15 * time.Minute)},
				{KeyHash: tokenHash("key"), WindowStart: now, WindowEnd: now.Add(15 * time.Minute)},
				{KeyHash: tokenHash("other"), WindowStart: now, WindowEnd: now.Add(15 * time.Minute)},
			}})
			require.NoError(t, err)
			require.Equal(t, []int64{0, 0, 1}, result.Counts)
			deleted, err := store.RateLimitCounterDeleteExpired(ctx, now.Add(time.Second), 100)
			require.NoError(t, err)
			require.Equal(t, int64(3), deleted, "the earlier windows were kept")
		})
	})
}

func TestStore_RateLimitDevice(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		const limit = 3
		window := func(key string) db.RateLimitCounterConsumeParams {
			w := db.RateLimitCounterConsumeParams{KeyHash: tokenHash(key), WindowStart: now, WindowEnd: now.Add(15 * time.Minute), LimitCount: limit}
			if key == "ip" {
				w.LimitCount = 100
			}
			return w
		}
		get := func(key string) db.RateLimitCounterGetParams {
			return db.RateLimitCounterGetParams{KeyHash: tokenHash(key), WindowStart: now, WindowEnd: now.Add(15 * time.Minute)}
		}
		// device is the device "phone" of the account "account" in the chain's second window.
		device := func(since time.Time) *db.RateLimitDeviceParams {
			return &db.RateLimitDeviceParams{Window: 1, KeyHash: tokenHash("phone"), RevocationHash: tokenHash("account-devices"), Since: since}
		}
		counts := func(t *testing.T, store db.Tables, keys ...string) []int64 {
			t.Helper()
			windows := make([]db.RateLimitCounterGetParams, len(keys))
			for i, key := range keys {
				windows[i] = get(key)
			}
			result, err := store.RateLimitCounterGetMany(t.Context(), &db.RateLimitCounterWindowsParams{Windows: windows})
			require.NoError(t, err)
			return result.Counts
		}
		epoch := time.Unix(0, 0).UTC()

		t.Run("RevocationTimes", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)

			revokedAt, err := store.RateLimitDeviceRevocationGet(ctx, tokenHash("account-devices"))
			require.NoError(t, err)
			require.True(t, epoch.Equal(revokedAt), "never revoked: %s", revokedAt)

			// Each revocation is later than the one before, on the database's clock.
			before := time.Now().Truncate(time.Millisecond)
			var last time.Time
			for range 3 {
				require.NoError(t, store.RateLimitDeviceRevocationUpsert(ctx, tokenHash("account-devices")))
				revokedAt, err := store.RateLimitDeviceRevocationGet(ctx, tokenHash("account-devices"))
				require.NoError(t, err)
				require.True(t, revokedAt.After(last), "%s not after %s", revokedAt, last)
				require.False(t, revokedAt.Before(before))
				last = revokedAt
			}
			other, err := store.RateLimitDeviceRevocationGet(ctx, tokenHash("another-account"))
			require.NoError(t, err)
			require.True(t, epoch.Equal(other), "another key's devices stand")

			deleted, err := store.RateLimitDeviceRevocationDeleteBefore(ctx, last, 10)
			require.NoError(t, err)
			require.Zero(t, deleted, "not before its time")
			deleted, err = store.RateLimitDeviceRevocationDeleteBefore(ctx, last.Add(time.Microsecond), 10)
			require.NoError(t, err)
			require.Equal(t, int64(1), deleted)
			revokedAt, err = store.RateLimitDeviceRevocationGet(ctx, tokenHash("account-devices"))
			require.NoError(t, err)
			require.True(t, epoch.Equal(revokedAt))
		})

		t.Run("DeleteBeforeInBatches", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)
			for i := range 5 {
				require.NoError(t, store.RateLimitDeviceRevocationUpsert(ctx, tokenHash(fmt.Sprintf("account-%d", i))))
			}
			for _, want := range []int64{2, 2, 1, 0} {
				deleted, err := store.RateLimitDeviceRevocationDeleteBefore(ctx, time.Now().Add(time.Hour), 2)
				require.NoError(t, err)
				require.Equal(t, want, deleted)
			}
		})

		t.Run("ATrustedDeviceSpendsItsOwnBucket", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)
			chain := func(device *db.RateLimitDeviceParams) *db.RateLimitCounterChainResult {
				t.Helper()
				result, err := store.RateLimitCounterConsumeChain(ctx, &db.RateLimitCounterChainParams{
					Windows: []db.RateLimitCounterConsumeParams{window("ip"), window("account")},
					Device:  device,
				})
				require.NoError(t, err)
				return result
			}

			// The account is spent by clients without a device.
			for range limit {
				require.Len(t, chain(nil).Counts, 2)
			}
			require.Len(t, chain(nil).Counts, 1, "the IP admits, the account refuses")

			// The device spends its own bucket; the IP's window is the same for everyone.
			for want := int64(1); want <= limit; want++ {
				result := chain(device(epoch))
				require.True(t, result.DeviceTrusted)
				require.Equal(t, []int64{limit + 1 + want, want}, result.Counts)
			}
			result := chain(device(epoch))
			require.True(t, result.DeviceTrusted)
			require.Len(t, result.Counts, 1, "the device locks itself")
			require.Equal(t, []int64{2*limit + 2, limit, limit}, counts(t, store, "ip", "account", "phone"))

			// A peek, a refund and a clear of the device are the device's bucket's too.
			require.NoError(t, store.RateLimitCounterDelete(ctx, &db.RateLimitCounterDeleteParams{KeyHash: tokenHash("phone"), WindowStart: now, WindowEnd: now.Add(15 * time.Minute)}))
			require.NoError(t, store.RateLimitCounterDelete(ctx, &db.RateLimitCounterDeleteParams{KeyHash: tokenHash("ip"), WindowStart: now, WindowEnd: now.Add(15 * time.Minute)}))
			chain(device(epoch))
			peek, err := store.RateLimitCounterGetMany(ctx, &db.RateLimitCounterWindowsParams{Windows: []db.RateLimitCounterGetParams{get("ip"), get("account")}, Device: device(epoch)})
			require.NoError(t, err)
			require.True(t, peek.DeviceTrusted)
			require.Equal(t, []int64{1, 1}, peek.Counts)
			trusted, err := store.RateLimitCounterRefund(ctx, &db.RateLimitCounterWindowsParams{Windows: []db.RateLimitCounterGetParams{get("ip"), get("account")}, Device: device(epoch)})
			require.NoError(t, err)
			require.True(t, trusted)
			require.Equal(t, []int64{0, limit, 0}, counts(t, store, "ip", "account", "phone"))
			chain(device(epoch))
			trusted, err = store.RateLimitCounterDeleteMany(ctx, &db.RateLimitCounterWindowsParams{Windows: []db.RateLimitCounterGetParams{get("account")}, Device: &db.RateLimitDeviceParams{
				Window: 0, KeyHash: tokenHash("phone"), RevocationHash: tokenHash("account-devices"), Since: epoch,
			}})
			require.NoError(t, err)
			require.True(t, trusted)
			require.Equal(t, []int64{1, limit, 0}, counts(t, store, "ip", "account", "phone"), "the account's failures stay")
		})

		t.Run("ARevokedDeviceIsNone", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)
			require.NoError(t, store.RateLimitDeviceRevocationUpsert(ctx, tokenHash("account-devices")))
			revokedAt, err := store.RateLimitDeviceRevocationGet(ctx, tokenHash("account-devices"))
			require.NoError(t, err)

			windows := []db.RateLimitCounterConsumeParams{window("ip"), window("account")}
			// Issued before the revocation: none, in each statement.
			result, err := store.RateLimitCounterConsumeChain(ctx, &db.RateLimitCounterChainParams{Windows: windows, Device: device(revokedAt.Add(-time.Microsecond))})
			require.NoError(t, err)
			require.False(t, result.DeviceTrusted)
			require.Equal(t, []int64{1, 1, 0}, counts(t, store, "ip", "account", "phone"), "the account's bucket was spent")
			peek, err := store.RateLimitCounterGetMany(ctx, &db.RateLimitCounterWindowsParams{Windows: []db.RateLimitCounterGetParams{get("ip"), get("account")}, Device: device(epoch)})
			require.NoError(t, err)
			require.False(t, peek.DeviceTrusted)
			require.Equal(t, []int64{1, 1}, peek.Counts)
			trusted, err := store.RateLimitCounterRefund(ctx, &db.RateLimitCounterWindowsParams{Windows: []db.RateLimitCounterGetParams{get("account")}, Device: &db.RateLimitDeviceParams{
				Window: 0, KeyHash: tokenHash("phone"), RevocationHash: tokenHash("account-devices"), Since: epoch,
			}})
			require.NoError(t, err)
			require.False(t, trusted)
			require.Equal(t, []int64{1, 0, 0}, counts(t, store, "ip", "account", "phone"), "the account's bucket was refunded")

			// Issued after it (carrying its time): trusted.
			result, err = store.RateLimitCounterConsumeChain(ctx, &db.RateLimitCounterChainParams{Windows: windows, Device: device(revokedAt)})
			require.NoError(t, err)
			require.True(t, result.DeviceTrusted)
			require.Equal(t, []int64{2, 0, 1}, counts(t, store, "ip", "account", "phone"))

			// Another revocation: that one is revoked too, everywhere.
			require.NoError(t, store.RateLimitDeviceRevocationUpsert(ctx, tokenHash("account-devices")))
			result, err = store.RateLimitCounterConsumeChain(ctx, &db.RateLimitCounterChainParams{Windows: windows, Device: device(revokedAt)})
			require.NoError(t, err)
			require.False(t, result.DeviceTrusted)
			require.Equal(t, []int64{3, 1, 1}, counts(t, store, "ip", "account", "phone"))
		})

		t.Run("RefusesBadDevices", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)
			for _, bad := range []*db.RateLimitDeviceParams{
				{Window: 2, KeyHash: tokenHash("phone"), RevocationHash: tokenHash("r")},
				{Window: -1, KeyHash: tokenHash("phone"), RevocationHash: tokenHash("r")},
				{Window: 1, RevocationHash: tokenHash("r")},
				{Window: 1, KeyHash: tokenHash("phone")},
			} {
				_, err := store.RateLimitCounterConsumeChain(ctx, &db.RateLimitCounterChainParams{Windows: []db.RateLimitCounterConsumeParams{window("ip"), window("account")}, Device: bad})
				require.Error(t, err)
				_, err = store.RateLimitCounterRefund(ctx, &db.RateLimitCounterWindowsParams{Windows: []db.RateLimitCounterGetParams{get("ip"), get("account")}, Device: bad})
				require.Error(t, err)
			}
			require.Equal(t, []int64{0, 0}, counts(t, store, "ip", "account"), "nothing spent")
		})
	})
}

func TestStore_SendPacerReserve(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		// Far longer than any test runs, so that the database's clock never catches up with the
		// schedule and every slot is exactly one interval after the previous one.
		const interval = time.Hour

		t.Run("InvalidInterval", func(t *testing.T) {
			t.Parallel()

			store := newStore(t)

			_, _, err := store.SendPacerReserve(t.Context(), "resend", 0)
			require.Error(t, err)
		})

		t.Run("OnTheDatabasesClock", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)

			// The database runs on this machine's clock: its now falls between two readings of
			// it (at the engines' precision).
			before := time.Now().Truncate(time.Millisecond)
			slot, dbNow, err := store.SendPacerReserve(ctx, "resend", interval)
			after := time.Now()
			require.NoError(t, err)
			require.True(t, !dbNow.Before(before) && !dbNow.After(after), "database's now %s not within [%s, %s]", dbNow, before, after)
			requireTimeEqual(t, dbNow, &slot) // the first slot is now

			before = time.Now().Truncate(time.Millisecond)
			clock, err := store.Now(ctx)
			after = time.Now()
			require.NoError(t, err)
			require.True(t, !clock.Before(before) && !clock.After(after), "database's now %s not within [%s, %s]", clock, before, after)
		})

		t.Run("NamesIndependent", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)

			_, _, err := store.SendPacerReserve(ctx, "a", interval)
			require.NoError(t, err)

			slot, dbNow, err := store.SendPacerReserve(ctx, "b", interval)
			require.NoError(t, err)
			requireTimeEqual(t, dbNow, &slot)
		})

		t.Run("NeverBeforeNow", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)

			// With a tiny interval the database's clock overtakes the schedule between two calls,
			// or it does not: either way the slot is the later of the two, never a burst of
			// missed slots after an idle spell.
			const tiny = time.Millisecond
			previous, _, err := store.SendPacerReserve(ctx, "resend", tiny)
			require.NoError(t, err)
			for range 20 {
				slot, dbNow, err := store.SendPacerReserve(ctx, "resend", tiny)
				require.NoError(t, err)
				want := previous.Add(tiny)
				if dbNow.After(want) {
					want = dbNow
				}
				requireTimeEqual(t, want, &slot)
				previous = slot
			}
		})

		t.Run("Spacing", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)

			first, _, err := store.SendPacerReserve(ctx, "resend", interval)
			require.NoError(t, err)
			for i := 1; i < 4; i++ {
				slot, dbNow, err := store.SendPacerReserve(ctx, "resend", interval)
				require.NoError(t, err)
				requireTimeEqual(t, first.Add(time.Duration(i)*interval), &slot)
				require.True(t, dbNow.Before(slot), "now %s, slot %s", dbNow, slot)
			}
		})

		t.Run("SpacingConcurrent", func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := newStore(t)

			const workers = 10
			var (
				wg    sync.WaitGroup
				errs  = make([]error, workers)
				slots = make([]time.Time, workers)
			)
			for i := range workers {
				wg.Go(func() {
					slots[i], _, errs[i] = store.SendPacerReserve(ctx, "resend", interval)
				})
			}
			wg.Wait()

			first := slots[0]
			for i := range workers {
				require.NoError(t, errs[i])
				if slots[i].Before(first) {
					first = slots[i]
				}
			}
			seen := make(map[time.Duration]bool)
			for i := range workers {
				seen[slots[i].Sub(first)] = true
			}
			for i := range workers {
				require.True(t, seen[time.Duration(i)*interval], "no slot at first+%s", time.Duration(i)*interval)
			}
		})
	})
}

func TestStore_User(t *testing.T) {
	t.Parallel()

	dbtest.Engines(t, func(t *testing.T, newStore dbtest.NewStoreFunc) {
		type testBundle struct {
			store db.Tables
			user  *db.User
		}

		setup := func(t *testing.T) (*testBundle, context.Context) {
			t.Helper()

			ctx := t.Context()
			store := newStore(t)
			return &testBundle{
				store: store,
				user:  userInsert(ctx, t, store, "ada@example.com"),
			}, ctx
		}

		t.Run("GetByEmail", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)

			user, err := bundle.store.UserGetByEmail(ctx, "ada@example.com")
			require.NoError(t, err)
			require.Equal(t, bundle.user, user)

			_, err = bundle.store.UserGetByEmail(ctx, "grace@example.com")
			require.ErrorIs(t, err, db.ErrNotFound)
		})

		t.Run("GetByID", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)

			user, err := bundle.store.UserGetByID(ctx, bundle.user.ID)
			require.NoError(t, err)
			require.Equal(t, bundle.user, user)

			_, err = bundle.store.UserGetByID(ctx, bundle.user.ID+1000)
			require.ErrorIs(t, err, db.ErrNotFound)
		})

		t.Run("Insert", func(t *testing.T) {
			t.Parallel()

			bundle, _ := setup(t)

			require.NotZero(t, bundle.user.ID)
			require.Equal(t, "ada@example.com", bundle.user.Email)
			require.Equal(t, "Ada", bundle.user.Name)
			require.Equal(t, "hash", bundle.user.PasswordHash)
			require.Nil(t, bundle.user.EmailVerifiedAt)
			require.Nil(t, bundle.user.UnsubscribedAt)
			requireTimeEqual(t, now, &bundle.user.CreatedAt)
			requireTimeEqual(t, now, &bundle.user.UpdatedAt)
			require.Equal(t, time.UTC, bundle.user.CreatedAt.Location())
			require.Empty(t, bundle.user.Locale, "no locale given")
		})

		t.Run("InsertLocale", func(t *testing.T) {
			t.Parallel()

			ctx, store := t.Context(), newStore(t)
			inserted, err := store.UserInsert(ctx, &db.UserInsertParams{Email: "amelie@example.fr", PasswordHash: "hash", Locale: "fr-CA", Now: now})
			require.NoError(t, err)
			require.Equal(t, "fr-CA", inserted.Locale)

			got, err := store.UserGetByID(ctx, inserted.ID)
			require.NoError(t, err)
			require.Equal(t, "fr-CA", got.Locale)
		})

		t.Run("InsertDuplicate", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)

			_, err := bundle.store.UserInsert(ctx, &db.UserInsertParams{Email: "ada@example.com", Now: now, PasswordHash: "other"})
			require.ErrorIs(t, err, db.ErrEmailTaken)

			user, err := bundle.store.UserGetByEmail(ctx, "ada@example.com")
			require.NoError(t, err)
			require.Equal(t, "hash", user.PasswordHash)
		})

		t.Run("MarkEmailVerified", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)

			amelie, err := bundle.store.UserInsert(ctx, &db.UserInsertParams{Email: "amelie@example.fr", PasswordHash: "hash", Locale: "fr", Now: now})
			require.NoError(t, err)
			for _, at := range []time.Time{now.Add(time.Minute), now.Add(time.Hour)} {
				locale, err := bundle.store.UserMarkEmailVerified(ctx, amelie.ID, at)
				require.NoError(t, err)
				require.Equal(t, "fr", locale, "the user's locale, for the page that says so")
			}

			user, err := bundle.store.UserGetByID(ctx, amelie.ID)
			require.NoError(t, err)
			requireTimeEqual(t, now.Add(time.Minute), user.EmailVerifiedAt) // the first verification stays
			other, err := bundle.store.UserGetByID(ctx, bundle.user.ID)
			require.NoError(t, err)
			require.Nil(t, other.EmailVerifiedAt, "another user's is untouched")

			_, err = bundle.store.UserMarkEmailVerified(ctx, bundle.user.ID+1000, now)
			require.ErrorIs(t, err, db.ErrNotFound)
		})

		t.Run("SetPassword", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)

			require.NoError(t, bundle.store.UserSetPassword(ctx, bundle.user.ID, "new", now.Add(time.Minute)))

			user, err := bundle.store.UserGetByID(ctx, bundle.user.ID)
			require.NoError(t, err)
			require.Equal(t, "new", user.PasswordHash)
			requireTimeEqual(t, now.Add(time.Minute), user.EmailVerifiedAt) // a reset proves the mailbox
			requireTimeEqual(t, now.Add(time.Minute), &user.UpdatedAt)

			require.NoError(t, bundle.store.UserSetPassword(ctx, bundle.user.ID, "newer", now.Add(time.Hour)))

			user, err = bundle.store.UserGetByID(ctx, bundle.user.ID)
			require.NoError(t, err)
			require.Equal(t, "newer", user.PasswordHash)
			requireTimeEqual(t, now.Add(time.Minute), user.EmailVerifiedAt)

			require.ErrorIs(t, bundle.store.UserSetPassword(ctx, bundle.user.ID+1000, "x", now), db.ErrNotFound)
		})

		t.Run("Unsubscribe", func(t *testing.T) {
			t.Parallel()

			bundle, ctx := setup(t)

			for _, at := range []time.Time{now.Add(time.Minute), now.Add(time.Hour)} {
				locale, err := bundle.store.UserUnsubscribe(ctx, bundle.user.ID, at)
				require.NoError(t, err)
				require.Equal(t, bundle.user.Locale, locale)
			}

			user, err := bundle.store.UserGetByID(ctx, bundle.user.ID)
			require.NoError(t, err)
			requireTimeEqual(t, now.Add(time.Minute), user.UnsubscribedAt)
			require.Nil(t, user.EmailVerifiedAt)

			_, err = bundle.store.UserUnsubscribe(ctx, bundle.user.ID+1000, now)
			require.ErrorIs(t, err, db.ErrNotFound)
		})
	})
}
