package main

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"golang.org/x/crypto/bcrypt"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/api/abuse/ginlimit"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/postgres"
	"github.com/postguard/postguard/jobs"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/tokens"
)

// accountsSchema is the host's own table. A real app keeps it in its own migrations.
//
//go:embed accounts.sql
var accountsSchema string

// Actions the app limits with postguard's limiter.
const (
	// actionSignUp caps sign-ups per client IP (the Gin middleware spends it per request).
	actionSignUp abuse.Action = "signup"
	// actionLogin counts login attempts per client IP (password spraying across accounts) and per
	// account (guessing one account's password), spent before the password is checked; a success
	// is cleared and refunded, and the browser becomes a trusted device of the account.
	actionLogin abuse.Action = "login"
)

// maxBodyBytes bounds a request's body: a login or a sign-up is a few hundred bytes, and a body
// read whole into memory is a way to exhaust it.
const maxBodyBytes = 64 << 10

// DefaultRules are the app's limits; RATE_LIMIT_<ACTION>_<SCOPE> variables override them.
func DefaultRules() abuse.Rules {
	return abuse.Rules{}.
		With(abuse.Rule{Action: actionSignUp, Scope: abuse.ScopeIP, Limit: 10, Window: time.Hour}).
		With(abuse.Rule{Action: actionLogin, Scope: abuse.ScopeIP, Limit: 20, Window: 15 * time.Minute}).
		With(abuse.Rule{Action: actionLogin, Scope: abuse.ScopeKey, Limit: 5, Window: 15 * time.Minute})
}

// Config is the app's configuration.
type Config struct {
	// Secret keys postguard's rate-limit keys, link tokens' seals and unsubscribe links (at
	// least 32 bytes).
	Secret []byte
	// AppURL starts the links in mail.
	AppURL string
	// Rules are the app's limits (DefaultRules when empty).
	Rules abuse.Rules
	// Sender delivers mail (mail.NewResendSender in production).
	Sender mail.Sender
	// Logger receives the app's, River's and postguard's lines; slog.Default() when nil.
	Logger *slog.Logger
	// BcryptCost is the password hashes' cost; bcrypt.DefaultCost when zero.
	BcryptCost int
	// ComparePasswordFunc checks a password against its hash; bcrypt.CompareHashAndPassword when
	// nil. Tests count the checks through it.
	ComparePasswordFunc func(hash, password []byte) error
	// NowFunc is the limiter's clock; time.Now when nil.
	NowFunc func() time.Time
}

// App is a Gin app with its own accounts table, using postguard as a library in its own process:
// postguard's limiter guards its sign-up and login, and postguard's mail jobs run on its own
// River client, inserted in its own transactions.
type App struct {
	Router *gin.Engine
	River  *river.Client[pgx.Tx]

	pool    *pgxpool.Pool
	tables  db.Tables
	guard   *ginlimit.Guard
	limiter *abuse.Limiter
	secret  []byte
	cost    int
	compare func(hash, password []byte) error
	logger  *slog.Logger
	// unknownHash is compared against for an email without an account, so that its login costs
	// a hash too.
	unknownHash []byte
}

// NewApp builds the app on pool (its own pgx pool, which it keeps).
func NewApp(ctx context.Context, pool *pgxpool.Pool, config *Config) (*App, error) {
	logger := cmp.Or(config.Logger, slog.Default())
	rules := config.Rules
	if len(rules.All()) == 0 {
		rules = DefaultRules()
	}

	// postguard's tables in the app's database, on the app's pool.
	engine, err := postgres.NewEngineFromPool(ctx, pool, &postgres.Config{Logger: logger})
	if err != nil {
		return nil, err
	}
	tables := db.NewTables(engine, &db.TablesConfig{Logger: logger})

	// postguard's mail workers, reading the app's accounts, on the app's River.
	workers, err := jobs.NewWorkers(&jobs.Deps{
		Store:      tables,
		Recipients: jobs.RecipientsFunc(func(ctx context.Context, id int64) (*jobs.Recipient, error) { return recipient(ctx, pool, id) }),
		Sender:     config.Sender,
		Logger:     logger,
	}, &jobs.Config{Secret: config.Secret, AppURL: config.AppURL})
	if err != nil {
		tables.Close()
		return nil, err
	}
	registry := river.NewWorkers()
	if err := workers.Register(registry); err != nil {
		tables.Close()
		return nil, err
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Logger:  logger,
		Queues:  map[string]river.QueueConfig{jobs.QueueEmail: {MaxWorkers: 4}},
		Workers: registry,
	})
	if err != nil {
		tables.Close()
		return nil, fmt.Errorf("error creating River client: %w", err)
	}

	cost := cmp.Or(config.BcryptCost, bcrypt.DefaultCost)
	unknownHash, err := bcrypt.GenerateFromPassword([]byte("no account has this password"), cost)
	if err != nil {
		tables.Close()
		return nil, err
	}
	limiter := abuse.NewLimiter(tables, config.Secret, rules, &abuse.LimiterConfig{NowFunc: config.NowFunc})
	a := &App{
		River:       client,
		pool:        pool,
		tables:      tables,
		guard:       ginlimit.New(limiter, &ginlimit.Config{Logger: logger}),
		limiter:     limiter,
		secret:      config.Secret,
		cost:        cost,
		compare:     config.ComparePasswordFunc,
		logger:      logger,
		unknownHash: unknownHash,
	}
	if a.compare == nil {
		a.compare = bcrypt.CompareHashAndPassword
	}

	gin.SetMode(gin.ReleaseMode)
	router := gin.New()
	router.Use(limitBody)
	router.POST("/signup", a.guard.Limit(actionSignUp, nil), a.signUp)
	router.POST("/login", a.login)
	router.POST("/v1/unsubscribe", a.unsubscribe) // the welcome mail's one-click link
	a.Router = router
	return a, nil
}

// Migrate applies River's migrations, postguard's tables and the app's accounts table.
func (a *App) Migrate(ctx context.Context) error {
	migrator, err := rivermigrate.New(riverpgxv5.New(a.pool), &rivermigrate.Config{Logger: a.logger})
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("error applying River's migrations: %w", err)
	}
	if err := a.tables.MigrateTables(ctx); err != nil {
		return err
	}
	if _, err := a.pool.Exec(ctx, accountsSchema); err != nil {
		return fmt.Errorf("error creating accounts: %w", err)
	}
	return nil
}

// Close releases what NewApp made (not the pool). Stop River first.
func (a *App) Close() error { return a.tables.Close() }

// recipient reads an account as the mail workers need it.
func recipient(ctx context.Context, pool *pgxpool.Pool, id int64) (*jobs.Recipient, error) {
	var r jobs.Recipient
	err := pool.QueryRow(ctx, `SELECT email, display_name, locale, welcome_opt_out FROM accounts WHERE id = $1`, id).
		Scan(&r.Email, &r.Name, &r.Locale, &r.Unsubscribed)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("account %d: %w", id, jobs.ErrNoRecipient)
	}
	if err != nil {
		return nil, fmt.Errorf("error reading account %d: %w", id, err)
	}
	return &r, nil
}

type credentials struct {
	Email    string `json:"email"`
	Password string `json:"password"`
	Name     string `json:"name"`
}

// limitBody caps every request's body at maxBodyBytes: one that says it is longer is refused
// unread (413), and any other is cut off there, so no body is ever read whole into memory.
func limitBody(c *gin.Context) {
	if c.Request.ContentLength > maxBodyBytes {
		c.AbortWithStatusJSON(http.StatusRequestEntityTooLarge, gin.H{"error": "the body is too large"})
		return
	}
	c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, maxBodyBytes)
	c.Next()
}

// readCredentials reads the body; false once it answered 400, 413 or 422.
func readCredentials(c *gin.Context) (credentials, bool) {
	var req credentials
	if err := json.NewDecoder(c.Request.Body).Decode(&req); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			c.JSON(http.StatusRequestEntityTooLarge, gin.H{"error": "the body is too large"})
			return req, false
		}
		c.JSON(http.StatusBadRequest, gin.H{"error": "the body must be a JSON object"})
		return req, false
	}
	req.Email = strings.ToLower(strings.TrimSpace(req.Email))
	if !strings.Contains(req.Email, "@") || len(req.Password) < 8 {
		c.JSON(http.StatusUnprocessableEntity, gin.H{"error": "an email and a password of at least 8 characters are required"})
		return req, false
	}
	return req, true
}

// signUp creates an account and its welcome mail in one transaction.
func (a *App) signUp(c *gin.Context) {
	req, ok := readCredentials(c)
	if !ok {
		return
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(req.Password), a.cost)
	if err != nil {
		a.fail(c, err)
		return
	}
	var id int64
	err = pgx.BeginFunc(c.Request.Context(), a.pool, func(tx pgx.Tx) error {
		id, err = a.createAccount(c.Request.Context(), tx, req.Email, req.Name, hash)
		return err
	})
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "23505":
		c.JSON(http.StatusConflict, gin.H{"error": "an account uses this email already"})
	case err != nil:
		a.fail(c, err)
	default:
		c.JSON(http.StatusCreated, gin.H{"id": id})
	}
}

// createAccount inserts an account and, with the app's own River client in the same
// transaction, its welcome job: both commit, or neither.
func (a *App) createAccount(ctx context.Context, tx pgx.Tx, email, name string, hash []byte) (int64, error) {
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO accounts (email, display_name, password_hash) VALUES ($1, $2, $3) RETURNING id`, email, name, hash).Scan(&id); err != nil {
		return 0, err
	}
	if _, err := a.River.InsertTx(ctx, tx, jobs.WelcomeEmailArgs{UserID: id}, nil); err != nil {
		return 0, fmt.Errorf("error inserting welcome job: %w", err)
	}
	return id, nil
}

// login spends first: one attempt of the account (and of the client's IP) is counted before the
// password is checked, and a refusal (429) checks nothing, so at most the account's limit of
// passwords is ever checked per window, however many guesses arrive at once. On a right password
// it clears the account's failures (the device's own, when the browser is a trusted device),
// refunds the IP (a success costs a client nothing) and makes the browser a trusted device: from
// then on its attempts count in a bucket of its own, so guessers who lock the account lock it for
// everyone but the owner's known browsers. Unknown emails count like wrong passwords and take as
// long, so the answers do not tell which emails have accounts.
func (a *App) login(c *gin.Context) {
	req, ok := readCredentials(c)
	if !ok {
		return
	}
	subject := a.guard.Subject(c, abuse.Subject{Key: req.Email, Device: a.guard.Device(c, actionLogin)})
	if !a.guard.Spend(c, actionLogin, subject) {
		return
	}

	var id int64
	var hash []byte
	err := a.pool.QueryRow(c.Request.Context(), `SELECT id, password_hash FROM accounts WHERE email = $1`, req.Email).Scan(&id, &hash)
	if errors.Is(err, pgx.ErrNoRows) {
		hash = a.unknownHash
	} else if err != nil {
		a.fail(c, err)
		return
	}
	if a.compare(hash, []byte(req.Password)) != nil || id == 0 {
		c.JSON(http.StatusUnauthorized, gin.H{"error": "wrong email or password"})
		return
	}
	if a.guard.Clear(c, actionLogin, abuse.Subject{Key: req.Email, Device: subject.Device}) &&
		a.guard.Refund(c, actionLogin, abuse.Subject{IP: subject.IP}) &&
		a.guard.IssueDevice(c, actionLogin, req.Email) {
		c.JSON(http.StatusOK, gin.H{"id": id})
	}
}

// RevokeDevices forgets every trusted browser of the account with email, at once in every
// process: a password change, or a "sign out everywhere", calls it.
func (a *App) RevokeDevices(ctx context.Context, email string) error {
	return a.limiter.RevokeDevices(ctx, actionLogin, email)
}

// unsubscribe is the one-click unsubscribe of the welcome mail (RFC 8058): the signed token of
// postguard's link names the account.
func (a *App) unsubscribe(c *gin.Context) {
	id, ok := tokens.ParseUnsubscribe(a.secret, c.Query("token"))
	if !ok {
		c.JSON(http.StatusBadRequest, gin.H{"error": "invalid unsubscribe link"})
		return
	}
	if _, err := a.pool.Exec(c.Request.Context(), `UPDATE accounts SET welcome_opt_out = true WHERE id = $1`, id); err != nil {
		a.fail(c, err)
		return
	}
	c.Status(http.StatusOK)
}

func (a *App) fail(c *gin.Context, err error) {
	a.logger.ErrorContext(c.Request.Context(), "request failed", slog.String("error", err.Error()))
	c.JSON(http.StatusInternalServerError, gin.H{"error": "internal error"})
}
