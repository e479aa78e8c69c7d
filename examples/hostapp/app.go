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
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"golang.org/x/crypto/bcrypt"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/api/abuse/ginlimit"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/jobs"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/tokens"
)

// The app's statements on its accounts, the same on both engines.
const (
	createAccountSQL = `INSERT INTO accounts (email, display_name, password_hash) VALUES ($1, $2, $3) ON CONFLICT (email) DO NOTHING RETURNING id`
	findAccountSQL   = `SELECT id, password_hash FROM accounts WHERE email = $1`
	recipientSQL     = `SELECT email, display_name, locale, welcome_opt_out FROM accounts WHERE id = $1`
	optOutSQL        = `UPDATE accounts SET welcome_opt_out = true WHERE id = $1`
)

// errEmailTaken is createAccount's when an account has the email already.
var errEmailTaken = errors.New("an account uses this email already")

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

func (c *Config) logger() *slog.Logger { return cmp.Or(c.Logger, slog.Default()) }

// App is a Gin app with its own accounts table, using postguard as a library in its own process:
// postguard's limiter guards its sign-up and login, and postguard's mail jobs run on its own
// River client, inserted in its own transactions. It runs on PostgreSQL (NewPostgresApp) or
// SQLite (NewSQLiteApp).
type App struct {
	Router *gin.Engine
	River  riverClient

	db      database
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

// riverClient is what the app does with its River client, whichever engine's: a
// *river.Client[pgx.Tx] or a *river.Client[*sql.Tx].
type riverClient interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
	Subscribe(kinds ...river.EventKind) (<-chan *river.Event, func())
}

// database is the app's database on one engine: its accounts, and its River client on the same
// handle (postgres.go, sqlite.go).
type database interface {
	// migrate applies River's migrations and creates the accounts table.
	migrate(ctx context.Context, logger *slog.Logger) error
	// inTx runs fn in one transaction, committed when it returns nil.
	inTx(ctx context.Context, fn func(tx accountsTx) error) error
	// findAccount returns the id (0 when there is none) and password hash of email's account.
	findAccount(ctx context.Context, email string) (int64, []byte, error)
	// recipient reads an account as the mail workers need it.
	recipient(ctx context.Context, id int64) (*jobs.Recipient, error)
	// optOut records the account's unsubscribe from welcome mail.
	optOut(ctx context.Context, id int64) error
	// close releases what the database made (never the app's own handle).
	close() error
}

// accountsTx is a transaction of the app's database.
type accountsTx interface {
	// createAccount inserts an account and, with the app's own River client in the same
	// transaction, its welcome job: both commit, or neither. errEmailTaken when the email has an
	// account already.
	createAccount(ctx context.Context, email, name string, hash []byte) (int64, error)
}

// newApp builds the app on its database and postguard's tables there; newRiver makes the app's
// River client, on the same handle, with postguard's workers.
func newApp(config *Config, tables db.Tables, d database, newRiver func(workers *river.Workers) (riverClient, error)) (_ *App, err error) {
	defer func() {
		if err != nil {
			_ = d.close()
			tables.Close()
		}
	}()
	logger := config.logger()
	rules := config.Rules
	if len(rules.All()) == 0 {
		rules = DefaultRules()
	}

	// postguard's mail workers, reading the app's accounts, on the app's River.
	workers, err := jobs.NewWorkers(&jobs.Deps{
		Store:      tables,
		Recipients: jobs.RecipientsFunc(d.recipient),
		Sender:     config.Sender,
		Logger:     logger,
	}, &jobs.Config{Secret: config.Secret, AppURL: config.AppURL})
	if err != nil {
		return nil, err
	}
	registry := river.NewWorkers()
	if err := workers.Register(registry); err != nil {
		return nil, err
	}
	client, err := newRiver(registry)
	if err != nil {
		return nil, fmt.Errorf("error creating River client: %w", err)
	}

	cost := cmp.Or(config.BcryptCost, bcrypt.DefaultCost)
	unknownHash, err := bcrypt.GenerateFromPassword([]byte("no account has this password"), cost)
	if err != nil {
		return nil, err
	}
	limiter, err := abuse.NewLimiter(tables, config.Secret, rules, &abuse.LimiterConfig{NowFunc: config.NowFunc})
	if err != nil {
		return nil, err
	}
	a := &App{
		River:       client,
		db:          d,
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

// counterPruneInterval is how often the app prunes the limiter's expired counters: every fresh
// IP or email leaves a counter per rule, and nothing else deletes them.
const counterPruneInterval = time.Minute

// newRiverClient is the app's River client on driver, working postguard's email queue, and
// pruning the limiter's expired counters on start and every counterPruneInterval (postguard's
// prune_counters job, on its maintenance queue; River runs a periodic job on its leader only).
// Finished jobs are this River's own to clean: its job cleaner is left on.
func newRiverClient[TTx any](driver riverdriver.Driver[TTx], workers *river.Workers, logger *slog.Logger) (*river.Client[TTx], error) {
	return river.NewClient(driver, &river.Config{
		Logger: logger,
		PeriodicJobs: []*river.PeriodicJob{river.NewPeriodicJob(
			river.PeriodicInterval(counterPruneInterval),
			func() (river.JobArgs, *river.InsertOpts) { return jobs.PruneCountersArgs{}, nil },
			&river.PeriodicJobOpts{ID: jobs.PruneCountersArgs{}.Kind(), RunOnStart: true},
		)},
		Queues: map[string]river.QueueConfig{
			jobs.QueueEmail:       {MaxWorkers: 4},
			jobs.QueueMaintenance: {MaxWorkers: 1},
		},
		Workers: workers,
	})
}

// Migrate applies River's migrations, postguard's tables (the limiter's and the mail workers'
// parts, each in a goose table of postguard's own) and the app's accounts table.
func (a *App) Migrate(ctx context.Context) error {
	if err := a.db.migrate(ctx, a.logger); err != nil {
		return err
	}
	return a.tables.MigrateTables(ctx, &db.MigrateOpts{Parts: []db.Part{db.PartLimiter, db.PartMail}})
}

// Close releases what the app made (not its database handle). Stop River first.
func (a *App) Close() error { return errors.Join(a.db.close(), a.tables.Close()) }

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
	err = a.db.inTx(c.Request.Context(), func(tx accountsTx) error {
		id, err = tx.createAccount(c.Request.Context(), req.Email, req.Name, hash)
		return err
	})
	switch {
	case errors.Is(err, errEmailTaken):
		c.JSON(http.StatusConflict, gin.H{"error": errEmailTaken.Error()})
	case err != nil:
		a.fail(c, err)
	default:
		c.JSON(http.StatusCreated, gin.H{"id": id})
	}
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

	id, hash, err := a.db.findAccount(c.Request.Context(), req.Email)
	if err != nil {
		a.fail(c, err)
		return
	}
	if id == 0 {
		hash = a.unknownHash
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
	if err := a.db.optOut(c.Request.Context(), id); err != nil {
		a.fail(c, err)
		return
	}
	c.Status(http.StatusOK)
}

func (a *App) fail(c *gin.Context, err error) {
	a.logger.ErrorContext(c.Request.Context(), "request failed", slog.String("error", err.Error()))
	c.JSON(http.StatusInternalServerError, gin.H{"error": "internal error"})
}
