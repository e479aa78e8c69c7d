package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/internal/bursttest"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/jobs/mail/resendfake"
)

var testSecret = []byte("the host app's test secret, 32 bytes or more")

type testBundle struct {
	app   *App
	sqlDB *sql.DB // the app's database, either engine
	fake  *resendfake.Server
	clock *stubClock
}

// stubClock is the limiter's settable clock.
type stubClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stubClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stubClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type setupOpts struct {
	// compare replaces bcrypt's comparison (the burst counts the checks through it).
	compare func(hash, password []byte) error
}

// setupFunc builds the app on an empty database of its own, migrated by the app itself as in
// production, with env's RATE_LIMIT_ variables over DefaultRules, mail through the real Resend
// client to a fake of Resend, and the limiter's clock five minutes into a window. opts may be
// nil.
type setupFunc func(t *testing.T, opts *setupOpts, env ...string) *testBundle

// engines runs fn on the app on PostgreSQL (an empty schema of its own, its pgx pool) and on
// SQLite (a new file, its *sql.DB).
func engines(t *testing.T, fn func(t *testing.T, setup setupFunc)) {
	t.Helper()

	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		fn(t, func(t *testing.T, opts *setupOpts, env ...string) *testBundle {
			t.Helper()
			pool, err := pgxpool.New(t.Context(), dbtest.PostgresEmptyURL(t))
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			sqlDB := stdlib.OpenDBFromPool(pool)
			t.Cleanup(func() { sqlDB.Close() })
			return newBundle(t, sqlDB, func(config *Config) (*App, error) { return NewPostgresApp(t.Context(), pool, config) }, opts, env)
		})
	})
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		fn(t, func(t *testing.T, opts *setupOpts, env ...string) *testBundle {
			t.Helper()
			sqlDB, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "host.db")+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
			require.NoError(t, err)
			sqlDB.SetMaxOpenConns(1)
			t.Cleanup(func() { sqlDB.Close() })
			return newBundle(t, sqlDB, func(config *Config) (*App, error) { return NewSQLiteApp(sqlDB, config) }, opts, env)
		})
	})
}

func newBundle(t *testing.T, sqlDB *sql.DB, newApp func(config *Config) (*App, error), opts *setupOpts, env []string) *testBundle {
	t.Helper()
	if opts == nil {
		opts = &setupOpts{}
	}
	ctx := t.Context()
	fake := resendfake.New(t, nil)
	sender, err := mail.NewResendSender(&mail.ResendConfig{APIKey: "re_test", BaseURL: fake.URL(), From: "Host <no-reply@example.com>", Timeout: 10 * time.Second})
	require.NoError(t, err)
	rules, err := DefaultRules().WithEnviron(env)
	require.NoError(t, err)
	clock := &stubClock{now: time.Date(2026, 3, 1, 10, 5, 0, 0, time.UTC)}
	app, err := newApp(&Config{
		Secret:              testSecret,
		AppURL:              "https://host.example.com",
		Rules:               rules,
		Sender:              sender,
		Logger:              dbtest.Logger(t),
		BcryptCost:          bcrypt.MinCost,
		ComparePasswordFunc: opts.compare,
		NowFunc:             clock.Now,
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, app.Close()) })
	require.NoError(t, app.Migrate(ctx))
	require.NoError(t, app.Migrate(ctx), "idempotent")
	return &testBundle{app: app, sqlDB: sqlDB, fake: fake, clock: clock}
}

func (b *testBundle) post(t *testing.T, path, ip string, body any, cookies ...*http.Cookie) *httptest.ResponseRecorder {
	t.Helper()
	data, err := json.Marshal(body)
	require.NoError(t, err)
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	req.RemoteAddr = ip + ":40000"
	for _, cookie := range cookies {
		req.AddCookie(cookie)
	}
	rec := httptest.NewRecorder()
	b.app.Router.ServeHTTP(rec, req)
	return rec
}

func (b *testBundle) signUp(t *testing.T, email string) {
	t.Helper()
	rec := b.post(t, "/signup", "192.0.2.1", map[string]string{"email": email, "password": "correct horse", "name": "Ada"})
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
}

func (b *testBundle) login(t *testing.T, ip, email, password string, cookies ...*http.Cookie) *httptest.ResponseRecorder {
	t.Helper()
	return b.post(t, "/login", ip, map[string]string{"email": email, "password": password}, cookies...)
}

// device is the trusted-device cookie a successful login set.
func device(t *testing.T, rec *httptest.ResponseRecorder) *http.Cookie {
	t.Helper()
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	for _, cookie := range rec.Result().Cookies() {
		if cookie.Name == "__Host-postguard-device-login" {
			require.True(t, cookie.Secure)
			require.True(t, cookie.HttpOnly)
			require.Equal(t, http.SameSiteLaxMode, cookie.SameSite)
			require.Equal(t, "/", cookie.Path)
			return &http.Cookie{Name: cookie.Name, Value: cookie.Value}
		}
	}
	t.Fatalf("no device cookie in %v", rec.Header())
	return nil
}

// requireSameAnswer checks got is want: status, body and every header.
func requireSameAnswer(t *testing.T, want, got *httptest.ResponseRecorder, name string) {
	t.Helper()
	require.Equal(t, want.Code, got.Code, name)
	require.Equal(t, want.Header(), got.Header(), name)
	require.Equal(t, want.Body.String(), got.Body.String(), name)
}

func (b *testBundle) count(t *testing.T, query string) int {
	t.Helper()
	var n int
	require.NoError(t, b.sqlDB.QueryRowContext(t.Context(), query).Scan(&n))
	return n
}

// waitForJob waits for the first completed job of kind on completed, passing over the others'.
func waitForJob(t *testing.T, completed <-chan *river.Event, kind string) *river.Event {
	t.Helper()
	timeout := time.After(30 * time.Second) // a guard against a hang, not a bound on latency
	for {
		select {
		case event := <-completed:
			if event.Job.Kind == kind {
				return event
			}
		case <-timeout:
			t.Fatalf("no %s job was worked", kind)
		}
	}
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

			b := setup(t, nil, env...)
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

			b := setup(t, nil, env...)
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

			b := setup(t, nil, env...)
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

			b := setup(t, nil, env...)
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

			b := setup(t, nil)
			ctx := t.Context()
			completed, cancel := b.app.River.Subscribe(river.EventKindJobCompleted)
			defer cancel()
			require.NoError(t, b.app.River.Start(ctx))
			t.Cleanup(func() { require.NoError(t, b.app.River.Stop(context.WithoutCancel(ctx))) })

			rec := b.post(t, "/signup", "192.0.2.1", map[string]string{"email": "grace@example.org", "password": "correct horse", "name": "Grace"})
			require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
			var created struct{ ID int64 }
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &created))

			event := waitForJob(t, completed, "welcome_email")
			require.JSONEq(t, fmt.Sprintf(`{"user_id": %d}`, created.ID), string(event.Job.EncodedArgs), "only the account id in the job")
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

			b := setup(t, nil)
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

			b := setup(t, nil)
			b.signUp(t, "ada@example.com")
			rec := b.post(t, "/signup", "192.0.2.1", map[string]string{"email": " ADA@example.com", "password": "another horse"})
			require.Equal(t, http.StatusConflict, rec.Code)
			require.Equal(t, 1, b.count(t, "SELECT count(*) FROM river_job"), "the failed sign-up's transaction left no job")
		})

		t.Run("LimitedPerIPByTheMiddleware", func(t *testing.T) {
			t.Parallel()

			b := setup(t, nil, "RATE_LIMIT_SIGNUP_IP=2/1h")
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

// TestApp_PrunesCounters: the app's River prunes the limiter's expired counters, which nothing
// else deletes (every fresh IP or email leaves one per rule): on start, then every minute. A
// counter whose window ended more than COUNTER_RETENTION ago goes; a current one stays.
func TestApp_PrunesCounters(t *testing.T) {
	t.Parallel()

	engines(t, func(t *testing.T, setup setupFunc) {
		b := setup(t, nil)
		ctx := t.Context()
		b.signUp(t, "old@example.com") // on the limiter's stub clock, March 2026: long expired
		expired := b.count(t, "SELECT count(*) FROM rate_limit_counters")
		require.Positive(t, expired)
		b.clock.Add(time.Since(b.clock.Now()))
		rec := b.post(t, "/signup", "192.0.2.2", map[string]string{"email": "new@example.com", "password": "correct horse"})
		require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
		current := b.count(t, "SELECT count(*) FROM rate_limit_counters") - expired
		require.Positive(t, current)

		completed, cancel := b.app.River.Subscribe(river.EventKindJobCompleted)
		defer cancel()
		require.NoError(t, b.app.River.Start(ctx))
		t.Cleanup(func() { require.NoError(t, b.app.River.Stop(context.WithoutCancel(ctx))) })
		waitForJob(t, completed, "prune_counters")
		require.Equal(t, current, b.count(t, "SELECT count(*) FROM rate_limit_counters"), "the expired counters pruned, the current kept")
	})
}

// TestApp_LoginProtection: the login with DefaultRules (5 attempts per account, 20 per IP, in
// 15 minutes), as an attacker tries it.
func TestApp_LoginProtection(t *testing.T) {
	t.Parallel()

	engines(t, func(t *testing.T, setup setupFunc) {
		t.Run("BurstChecksAtMostFivePasswords", func(t *testing.T) {
			t.Parallel()

			// 200 logins at once for one account, from 200 IPs, each with another password; the
			// right one is the 138th. Every password check is held until the whole burst is either
			// at a check or answered.
			checker := bursttest.NewChecker()
			burst := bursttest.Burst{Attempts: 200, Right: 137, Limit: 5}
			b := setup(t, &setupOpts{compare: func(hash, password []byte) error {
				checker.Check(string(password))
				return bcrypt.CompareHashAndPassword(hash, password)
			}})
			hash, err := bcrypt.GenerateFromPassword([]byte(bursttest.Password(burst.Right)), bcrypt.MinCost)
			require.NoError(t, err)
			_, err = b.sqlDB.ExecContext(t.Context(), `INSERT INTO accounts (email, password_hash) VALUES ('ada@example.com', $1)`, hash)
			require.NoError(t, err)

			result := checker.Run(t, burst, func(i int, password string) int {
				return b.login(t, fmt.Sprintf("203.0.%d.%d", i/250, i%250+1), "ada@example.com", password).Code
			})
			require.LessOrEqual(t, result.Checks, burst.Limit, "passwords checked")
			require.False(t, result.Found, "the right password was found")
			require.Equal(t, map[int]int{http.StatusUnauthorized: burst.Limit, http.StatusTooManyRequests: burst.Attempts - burst.Limit}, result.Counts())
		})

		t.Run("ASuccessRefundsTheIP", func(t *testing.T) {
			t.Parallel()

			b := setup(t, nil)
			b.signUp(t, "ada@example.com")
			// 40 successful logins from one IP in a window: never refused by its limit of 20.
			for i := range 40 {
				require.Equal(t, http.StatusOK, b.login(t, "198.51.100.7", "ada@example.com", "correct horse").Code, "login %d", i)
			}
			// 20 failures are: the 21st attempt is refused, right password or not.
			for i := range 20 {
				require.Equal(t, http.StatusUnauthorized, b.login(t, "198.51.100.7", fmt.Sprintf("user%d@example.com", i), "wrong guess").Code, "failure %d", i)
			}
			requireRefused(t, b.login(t, "198.51.100.7", "ada@example.com", "correct horse"), "login-ip")
		})

		t.Run("PasswordSprayingStops", func(t *testing.T) {
			t.Parallel()

			b := setup(t, nil)
			// One IP, 30 accounts, one password each: refused after 20.
			for i := range 30 {
				rec := b.login(t, "203.0.113.66", fmt.Sprintf("user%d@example.com", i), "Summer2026!")
				if i < 20 {
					require.Equal(t, http.StatusUnauthorized, rec.Code, "account %d", i)
					continue
				}
				requireRefused(t, rec, "login-ip")
			}
		})

		t.Run("LockoutWithoutCollateral", func(t *testing.T) {
			t.Parallel()

			b := setup(t, nil)
			b.signUp(t, "ada@example.com")
			b.signUp(t, "mallory@example.com")
			owner := device(t, b.login(t, "198.51.100.7", "ada@example.com", "correct horse"))
			spare := device(t, b.login(t, "198.51.100.7", "ada@example.com", "correct horse")) // the owner's other browser
			mallorys := device(t, b.login(t, "203.0.113.1", "mallory@example.com", "correct horse"))

			// 100 failures for the account from 50 IPs: the first 5 are checked, the rest refused.
			for i := range 100 {
				rec := b.login(t, fmt.Sprintf("203.0.113.%d", 100+i%50), "ada@example.com", fmt.Sprintf("wrong guess %d", i))
				require.Equal(t, i < 5, rec.Code == http.StatusUnauthorized, "attempt %d: %d", i, rec.Code)
			}
			// An untrusted client is refused, right password or not.
			none := b.login(t, "198.51.100.9", "ada@example.com", "correct horse")
			requireRefused(t, none, "login-key")

			// The owner's browser logs in at once.
			owner = device(t, b.login(t, "198.51.100.7", "ada@example.com", "correct horse", owner))

			// A forged token, another account's, and garbage are each exactly no token.
			raw, err := base64.RawURLEncoding.DecodeString(spare.Value) // a device that stands, with room
			require.NoError(t, err)
			raw[len(raw)-1] ^= 1
			forged := http.Cookie{Name: spare.Name, Value: base64.RawURLEncoding.EncodeToString(raw)}
			for name, cookie := range map[string]*http.Cookie{
				"Forged":       &forged,
				"OtherAccount": {Name: mallorys.Name, Value: mallorys.Value},
				"Garbage":      {Name: owner.Name, Value: "not-a-token"},
			} {
				requireSameAnswer(t, none, b.login(t, "198.51.100.9", "ada@example.com", "correct horse", cookie), name)
			}

			// A device locks itself after 5 failures of its own; the others stand.
			for i := range 5 {
				require.Equal(t, http.StatusUnauthorized, b.login(t, "198.51.100.7", "ada@example.com", "wrong guess", owner).Code, "failure %d", i)
			}
			requireRefused(t, b.login(t, "198.51.100.7", "ada@example.com", "correct horse", owner), "login-key")

			// Revoked (a password change): the spare browser is no device from then on.
			require.NoError(t, b.app.RevokeDevices(t.Context(), "ada@example.com"))
			requireSameAnswer(t, none, b.login(t, "198.51.100.9", "ada@example.com", "correct horse", spare), "Revoked")
			// Not the other account's: its browser logs in after its own lock.
			for range 5 {
				b.login(t, "203.0.113.2", "mallory@example.com", "wrong guess")
			}
			mallorys = device(t, b.login(t, "203.0.113.1", "mallory@example.com", "correct horse", mallorys))

			// Expired: 90 days on (a window of its own, locked again), the device is no device.
			b.clock.Add(abuse.DefaultDeviceTokenTTL)
			for i := range 5 {
				require.Equal(t, http.StatusUnauthorized, b.login(t, fmt.Sprintf("203.0.113.%d", 10+i), "mallory@example.com", "wrong guess").Code)
			}
			lockedNow := b.login(t, "198.51.100.9", "mallory@example.com", "correct horse")
			requireRefused(t, lockedNow, "login-key")
			requireSameAnswer(t, lockedNow, b.login(t, "198.51.100.9", "mallory@example.com", "correct horse", mallorys), "Expired")

			// Each bad token counts in the account's bucket as no token does: a failure beside one
			// without a token, for two fresh accounts with the same history, answers the same.
			b.signUp(t, "bob@example.com")
			b.signUp(t, "carol@example.com")
			requireSameAnswer(t,
				b.login(t, "198.51.100.20", "bob@example.com", "wrong guess"),
				b.login(t, "198.51.100.21", "carol@example.com", "wrong guess", &forged), "FailureWithAForgedToken")
		})

		t.Run("HugeBodyRefusedUnread", func(t *testing.T) {
			t.Parallel()

			b := setup(t, nil)
			for _, declared := range []bool{true, false} {
				body := &countingReader{prefix: `{"email":"ada@example.com","password":"`, size: 200 << 20}
				req := httptest.NewRequest(http.MethodPost, "/login", body)
				req.Header.Set("Content-Type", "application/json")
				req.RemoteAddr = "198.51.100.7:40000"
				req.ContentLength = -1 // chunked: the server learns the size only by reading
				if declared {
					req.ContentLength = body.size
				}
				rec := httptest.NewRecorder()
				b.app.Router.ServeHTTP(rec, req)
				t.Logf("a body of %d bytes, its length declared %t: %d bytes read, answered %d", body.size, declared, body.read, rec.Code)
				require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code, rec.Body.String())
				require.Less(t, body.read, int64(2*maxBodyBytes), "of a 200 MB body, declared %t", declared)
				if declared {
					require.Zero(t, body.read, "a body declared too large is not read at all")
				}
			}
			require.Zero(t, b.count(t, "SELECT count(*) FROM rate_limit_counters"), "a refused body counts nothing")
		})
	})
}

// countingReader is a body of size bytes, a JSON prefix then 'a's, made as it is read, that
// counts what was read.
type countingReader struct {
	prefix string
	size   int64
	read   int64
}

func (r *countingReader) Read(p []byte) (int, error) {
	if r.read >= r.size {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), r.size-r.read))
	for i := range n {
		if at := r.read + int64(i); at < int64(len(r.prefix)) {
			p[i] = r.prefix[at]
		} else {
			p[i] = 'a'
		}
	}
	r.read += int64(n)
	return n, nil
}

func TestNewServer(t *testing.T) {
	t.Parallel()

	// People copy examples: the server cuts off slow clients.
	server := newServer(":8081", http.NotFoundHandler())
	require.Equal(t, 5*time.Second, server.ReadHeaderTimeout)
	require.Equal(t, 15*time.Second, server.ReadTimeout)
	require.Equal(t, 30*time.Second, server.WriteTimeout)
	require.Equal(t, 60*time.Second, server.IdleTimeout)
}
