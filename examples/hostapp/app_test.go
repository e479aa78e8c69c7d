package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/jobs/mail/resendfake"
)

var testSecret = []byte("the host app's test secret, 32 bytes or more")

type testBundle struct {
	app   *App
	sqlDB *sql.DB // the app's database, either engine
	fake  *resendfake.Server
}

// setupFunc builds the app on an empty database of its own, migrated by the app itself as in
// production, with env's RATE_LIMIT_ variables over DefaultRules, mail through the real Resend
// client to a fake of Resend, and the limiter's clock five minutes into a window.
type setupFunc func(t *testing.T, env ...string) *testBundle

// engines runs fn on the app on PostgreSQL (an empty schema of its own, its pgx pool) and on
// SQLite (a new file, its *sql.DB).
func engines(t *testing.T, fn func(t *testing.T, setup setupFunc)) {
	t.Helper()

	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		fn(t, func(t *testing.T, env ...string) *testBundle {
			t.Helper()
			pool, err := pgxpool.New(t.Context(), dbtest.PostgresEmptyURL(t))
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			sqlDB := stdlib.OpenDBFromPool(pool)
			t.Cleanup(func() { sqlDB.Close() })
			return newBundle(t, sqlDB, func(config *Config) (*App, error) { return NewPostgresApp(t.Context(), pool, config) }, env)
		})
	})
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		fn(t, func(t *testing.T, env ...string) *testBundle {
			t.Helper()
			sqlDB, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "host.db")+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
			require.NoError(t, err)
			sqlDB.SetMaxOpenConns(1)
			t.Cleanup(func() { sqlDB.Close() })
			return newBundle(t, sqlDB, func(config *Config) (*App, error) { return NewSQLiteApp(sqlDB, config) }, env)
		})
	})
}

func newBundle(t *testing.T, sqlDB *sql.DB, newApp func(config *Config) (*App, error), env []string) *testBundle {
	t.Helper()
	ctx := t.Context()
	fake := resendfake.New(t, nil)
	sender, err := mail.NewResendSender(&mail.ResendConfig{APIKey: "re_test", BaseURL: fake.URL(), From: "Host <no-reply@example.com>", Timeout: 10 * time.Second})
	require.NoError(t, err)
	rules, err := DefaultRules().WithEnviron(env)
	require.NoError(t, err)
	app, err := newApp(&Config{
		Secret:     testSecret,
		AppURL:     "https://host.example.com",
		Rules:      rules,
		Sender:     sender,
		Logger:     dbtest.Logger(t),
		BcryptCost: bcrypt.MinCost,
		NowFunc:    func() time.Time { return time.Date(2026, 3, 1, 10, 5, 0, 0, time.UTC) },
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, app.Close()) })
	require.NoError(t, app.Migrate(ctx))
	require.NoError(t, app.Migrate(ctx), "idempotent")
	return &testBundle{app: app, sqlDB: sqlDB, fake: fake}
}

func (b *testBundle) post(t *testing.T, path, ip string, body any) *httptest.ResponseRecorder {
	t.Helper()
	data, err := json.Marshal(body)
	require.NoError(t, err)
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	req.RemoteAddr = ip + ":40000"
	rec := httptest.NewRecorder()
	b.app.Router.ServeHTTP(rec, req)
	return rec
}

func (b *testBundle) signUp(t *testing.T, email string) {
	t.Helper()
	rec := b.post(t, "/signup", "192.0.2.1", map[string]string{"email": email, "password": "correct horse", "name": "Ada"})
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
}

func (b *testBundle) login(t *testing.T, ip, email, password string) *httptest.ResponseRecorder {
	t.Helper()
	return b.post(t, "/login", ip, map[string]string{"email": email, "password": password})
}

func (b *testBundle) count(t *testing.T, query string) int {
	t.Helper()
	var n int
	require.NoError(t, b.sqlDB.QueryRowContext(t.Context(), query).Scan(&n))
	return n
}

// requireRefused checks a 429 of postguard's limiter, by policy.
func requireRefused(t *testing.T, rec *httptest.ResponseRecorder, policy string) {
	t.Helper()
	require.Equal(t, http.StatusTooManyRequests, rec.Code, rec.Body.String())
	require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
	require.Equal(t, "600", rec.Header().Get("Retry-After"))
	require.Equal(t, `"`+policy+`";r=0;t=600`, rec.Header().Get("RateLimit"))
	var problem map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &problem))
	require.EqualValues(t, 600, problem["retry_after_seconds"])
}

func TestApp_Login(t *testing.T) {
	t.Parallel()

	engines(t, func(t *testing.T, setup setupFunc) {
		const keyLimit, ipLimit = 3, 8
		env := []string{fmt.Sprintf("RATE_LIMIT_LOGIN_KEY=%d/15m", keyLimit), fmt.Sprintf("RATE_LIMIT_LOGIN_IP=%d/15m", ipLimit)}

		t.Run("WrongPasswordsLockTheAccount", func(t *testing.T) {
			t.Parallel()

			b := setup(t, env...)
			b.signUp(t, "ada@example.com")

			for range keyLimit {
				require.Equal(t, http.StatusUnauthorized, b.login(t, "198.51.100.7", "ada@example.com", "wrong guess").Code)
			}
			// The next is refused even with the right password, from any IP: the account's failures
			// are counted, not the attempts of one client.
			requireRefused(t, b.login(t, "198.51.100.7", "ada@example.com", "correct horse"), "login-key")
			requireRefused(t, b.login(t, "203.0.113.50", "ada@example.com", "correct horse"), "login-key")

			// An email without an account counts its failures the same: the answers do not tell.
			for range keyLimit {
				require.Equal(t, http.StatusUnauthorized, b.login(t, "198.51.100.9", "nobody@example.com", "wrong guess").Code)
			}
			requireRefused(t, b.login(t, "198.51.100.9", "nobody@example.com", "wrong guess"), "login-key")
		})

		t.Run("SuccessClearsTheAccountsFailures", func(t *testing.T) {
			t.Parallel()

			b := setup(t, env...)
			b.signUp(t, "ada@example.com")

			for range keyLimit - 1 {
				require.Equal(t, http.StatusUnauthorized, b.login(t, "198.51.100.7", "ada@example.com", "wrong guess").Code)
			}
			require.Equal(t, http.StatusOK, b.login(t, "198.51.100.7", "ada@example.com", "correct horse").Code)

			// Cleared: the account has its whole budget again (without the clear, the second of
			// these would already be refused).
			for range keyLimit {
				require.Equal(t, http.StatusUnauthorized, b.login(t, "198.51.100.8", "ada@example.com", "wrong guess").Code)
			}
			requireRefused(t, b.login(t, "198.51.100.8", "ada@example.com", "correct horse"), "login-key")
		})

		t.Run("IPRuleHoldsAcrossAccounts", func(t *testing.T) {
			t.Parallel()

			b := setup(t, env...)
			b.signUp(t, "mallory@example.com") // the sprayer's own account
			b.signUp(t, "victim@example.com")
			const sprayer = "203.0.113.66"

			// A password spray: one guess per account, each account far under its own limit.
			for i := range ipLimit / 2 {
				require.Equal(t, http.StatusUnauthorized, b.login(t, sprayer, fmt.Sprintf("user%d@example.com", i), "Summer2026!").Code)
			}
			// Logging into an account of its own clears that account's failures, not the IP's.
			require.Equal(t, http.StatusOK, b.login(t, sprayer, "mallory@example.com", "correct horse").Code)
			for i := ipLimit / 2; i < ipLimit; i++ {
				require.Equal(t, http.StatusUnauthorized, b.login(t, sprayer, fmt.Sprintf("user%d@example.com", i), "Summer2026!").Code)
			}
			// The IP is spent: refused on a fresh account, right password or not.
			requireRefused(t, b.login(t, sprayer, "victim@example.com", "correct horse"), "login-ip")
			requireRefused(t, b.login(t, sprayer, "mallory@example.com", "correct horse"), "login-ip")
			// The victim, from elsewhere, logs in.
			require.Equal(t, http.StatusOK, b.login(t, "198.51.100.7", "victim@example.com", "correct horse").Code)
		})

		t.Run("CountersHoldNoRawKeyOrIP", func(t *testing.T) {
			t.Parallel()

			b := setup(t, env...)
			b.login(t, "198.51.100.7", "ada@example.com", "wrong guess")
			query := `SELECT concat_ws('|', encode(key_hash, 'escape'), encode(key_hash, 'hex')) FROM rate_limit_counters`
			if b.app.tables.Engine() == "sqlite" {
				query = `SELECT CAST(key_hash AS TEXT) || '|' || hex(key_hash) FROM rate_limit_counters`
			}
			rows, err := b.sqlDB.QueryContext(t.Context(), query)
			require.NoError(t, err)
			defer rows.Close()
			var texts []string
			for rows.Next() {
				var text string
				require.NoError(t, rows.Scan(&text))
				texts = append(texts, text)
			}
			require.NoError(t, rows.Err())
			require.Len(t, texts, 2, "the IP's counter and the account's")
			for _, text := range texts {
				require.NotContains(t, text, "198.51.100.7")
				require.NotContains(t, text, "ada")
			}
		})
	})
}

func TestApp_SignUp(t *testing.T) {
	t.Parallel()

	engines(t, func(t *testing.T, setup setupFunc) {
		t.Run("WelcomeMailThroughTheAppsRiver", func(t *testing.T) {
			t.Parallel()

			b := setup(t)
			ctx := t.Context()
			completed, cancel := b.app.River.Subscribe(river.EventKindJobCompleted)
			defer cancel()
			require.NoError(t, b.app.River.Start(ctx))
			t.Cleanup(func() { require.NoError(t, b.app.River.Stop(context.WithoutCancel(ctx))) })

			rec := b.post(t, "/signup", "192.0.2.1", map[string]string{"email": "grace@example.org", "password": "correct horse", "name": "Grace"})
			require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
			var created struct{ ID int64 }
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &created))

			select {
			case event := <-completed:
				require.Equal(t, "welcome_email", event.Job.Kind)
				require.JSONEq(t, fmt.Sprintf(`{"user_id": %d}`, created.ID), string(event.Job.EncodedArgs), "only the account id in the job")
			case <-time.After(30 * time.Second):
				t.Fatal("the welcome job was not worked")
			}
			deliveries := b.fake.Deliveries()
			require.Len(t, deliveries, 1)
			require.Equal(t, []string{"grace@example.org"}, deliveries[0].To)
			require.Contains(t, deliveries[0].Text, "Grace", "the name from the app's accounts table")

			// The mail's one-click unsubscribe link works on the app's own route.
			link := strings.Trim(deliveries[0].Headers["List-Unsubscribe"], "<>")
			require.True(t, strings.HasPrefix(link, "https://host.example.com/v1/unsubscribe?token="), link)
			req := httptest.NewRequest(http.MethodPost, strings.TrimPrefix(link, "https://host.example.com"), strings.NewReader("List-Unsubscribe=One-Click"))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			rec = httptest.NewRecorder()
			b.app.Router.ServeHTTP(rec, req)
			require.Equal(t, http.StatusOK, rec.Code)
			require.Equal(t, 1, b.count(t, "SELECT count(*) FROM accounts WHERE welcome_opt_out"))
		})

		t.Run("RolledBackTransactionLeavesNothing", func(t *testing.T) {
			t.Parallel()

			b := setup(t)
			ctx := t.Context()
			hash := []byte("$2a$04$not-a-real-hash")

			errLater := errors.New("a later step of the sign-up failed")
			err := b.app.db.inTx(ctx, func(tx accountsTx) error {
				if _, err := tx.createAccount(ctx, "rolled@example.com", "Rolled", hash); err != nil {
					return err
				}
				return errLater
			})
			require.ErrorIs(t, err, errLater)
			require.Zero(t, b.count(t, "SELECT count(*) FROM accounts"), "no account")
			require.Zero(t, b.count(t, "SELECT count(*) FROM river_job"), "no welcome job")

			require.NoError(t, b.app.db.inTx(ctx, func(tx accountsTx) error {
				_, err := tx.createAccount(ctx, "kept@example.com", "Kept", hash)
				return err
			}))
			require.Equal(t, 1, b.count(t, "SELECT count(*) FROM accounts"))
			require.Equal(t, 1, b.count(t, "SELECT count(*) FROM river_job WHERE kind = 'welcome_email'"))
		})

		t.Run("TakenEmail", func(t *testing.T) {
			t.Parallel()

			b := setup(t)
			b.signUp(t, "ada@example.com")
			rec := b.post(t, "/signup", "192.0.2.1", map[string]string{"email": " ADA@example.com", "password": "another horse"})
			require.Equal(t, http.StatusConflict, rec.Code)
			require.Equal(t, 1, b.count(t, "SELECT count(*) FROM river_job"), "the failed sign-up's transaction left no job")
		})

		t.Run("LimitedPerIPByTheMiddleware", func(t *testing.T) {
			t.Parallel()

			b := setup(t, "RATE_LIMIT_SIGNUP_IP=2/1h")
			for i := range 2 {
				rec := b.post(t, "/signup", "198.51.100.9", map[string]string{"email": fmt.Sprintf("s%d@example.com", i), "password": "correct horse"})
				require.Equal(t, http.StatusCreated, rec.Code)
			}
			rec := b.post(t, "/signup", "198.51.100.9", map[string]string{"email": "s3@example.com", "password": "correct horse"})
			require.Equal(t, http.StatusTooManyRequests, rec.Code)
			require.Equal(t, `"signup-ip";q=2;w=3600`, rec.Header().Get("RateLimit-Policy"))
			require.Equal(t, 2, b.count(t, "SELECT count(*) FROM accounts"))
		})
	})
}
