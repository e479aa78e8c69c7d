package main

import (
	"cmp"
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/pressly/goose/v3"
	"golang.org/x/crypto/bcrypt"
)

// migrations are the app's own, one directory per engine, recorded in goose's default table
// (goose_db_version) as any goose user's are.
//
//go:embed migrations
var migrations embed.FS

// Config is the app's configuration.
type Config struct {
	// DB is the app's database, on which its users table lives.
	DB *sql.DB
	// Limiter guards the login; see NewLimiter (limiter.go).
	Limiter Limiter
	// Logger receives the app's lines; slog.Default() when nil.
	Logger *slog.Logger
	// BcryptCost is the password hashes' cost; bcrypt.DefaultCost when zero.
	BcryptCost int
	// NowFunc is the app's clock; time.Now when nil.
	NowFunc func() time.Time
}

// Limiter is what the app's login asks of a rate limiter: a Gin handler's worth of checks,
// answering the request itself when it refuses (see limiter.go).
type Limiter interface {
	// Spend counts one login attempt for the client and the account key; false once it has
	// answered the request (429, or 503 when its database fails).
	Spend(c *gin.Context, key string) bool
	// Clear forgets the account key's attempts after a right password; false once it has
	// answered the request.
	Clear(c *gin.Context, key string) bool
}

// App is a Gin app with a users table of its own, whose login a rate limiter guards.
type App struct {
	Router *gin.Engine

	db      *sql.DB
	limiter Limiter
	logger  *slog.Logger
	cost    int
	now     func() time.Time
	// unknownHash is compared against for an email without an account, so that its login costs
	// a hash too and its answer does not tell.
	unknownHash []byte
}

// NewApp builds the app on config.DB, migrated by Migrate.
func NewApp(config *Config) (*App, error) {
	if config.DB == nil || config.Limiter == nil {
		return nil, errors.New("limiteronly: Config.DB and Config.Limiter are required")
	}
	cost := cmp.Or(config.BcryptCost, bcrypt.DefaultCost)
	unknownHash, err := bcrypt.GenerateFromPassword([]byte("no account has this password"), cost)
	if err != nil {
		return nil, err
	}
	a := &App{
		db:          config.DB,
		limiter:     config.Limiter,
		logger:      cmp.Or(config.Logger, slog.Default()),
		cost:        cost,
		now:         config.NowFunc,
		unknownHash: unknownHash,
	}
	if a.now == nil {
		a.now = time.Now
	}

	gin.SetMode(gin.ReleaseMode)
	router := gin.New()
	router.POST("/signup", a.signUp)
	router.POST("/login", a.login)
	a.Router = router
	return a, nil
}

// MigrateApp applies the app's own migrations for dialect (goose.DialectSQLite3 or
// goose.DialectPostgres) in goose's default table.
func MigrateApp(ctx context.Context, sqlDB *sql.DB, dialect goose.Dialect) error {
	dir := map[goose.Dialect]string{goose.DialectSQLite3: "sqlite", goose.DialectPostgres: "postgres"}[dialect]
	fsys, err := fs.Sub(migrations, "migrations/"+dir)
	if err != nil || dir == "" {
		return fmt.Errorf("no migrations for %q", dialect)
	}
	provider, err := goose.NewProvider(dialect, sqlDB, fsys)
	if err != nil {
		return fmt.Errorf("error creating goose provider: %w", err)
	}
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("error applying the app's migrations: %w", err)
	}
	return nil
}

type credentials struct {
	Email    string `json:"email"`
	Password string `json:"password"`
}

// readCredentials reads the body; false once it answered 400 or 422.
func readCredentials(c *gin.Context) (credentials, bool) {
	var req credentials
	if err := json.NewDecoder(c.Request.Body).Decode(&req); err != nil {
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

// signUp creates an account.
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
	err = a.db.QueryRowContext(c.Request.Context(),
		`INSERT INTO users (email, password_hash, created_at) VALUES ($1, $2, $3) ON CONFLICT (email) DO NOTHING RETURNING id`,
		req.Email, hash, a.now().Unix()).Scan(&id)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		c.JSON(http.StatusConflict, gin.H{"error": "an account uses this email already"})
	case err != nil:
		a.fail(c, err)
	default:
		c.JSON(http.StatusCreated, gin.H{"id": id})
	}
}

// login counts every attempt before the password is checked, per client IP and per account, so
// a guesser's attempts are capped whatever their outcome, and forgets the account's attempts on
// a right password. An email without an account is counted and hashed like one with, so the
// answers do not tell which emails have accounts.
func (a *App) login(c *gin.Context) {
	req, ok := readCredentials(c)
	if !ok {
		return
	}
	if !a.limiter.Spend(c, req.Email) {
		return
	}

	var id int64
	hash := a.unknownHash
	err := a.db.QueryRowContext(c.Request.Context(), `SELECT id, password_hash FROM users WHERE email = $1`, req.Email).Scan(&id, &hash)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		a.fail(c, err)
		return
	}
	if bcrypt.CompareHashAndPassword(hash, []byte(req.Password)) != nil || id == 0 {
		c.JSON(http.StatusUnauthorized, gin.H{"error": "wrong email or password"})
		return
	}
	if a.limiter.Clear(c, req.Email) {
		c.JSON(http.StatusOK, gin.H{"id": id})
	}
}

func (a *App) fail(c *gin.Context, err error) {
	a.logger.ErrorContext(c.Request.Context(), "request failed", slog.String("error", err.Error()))
	c.JSON(http.StatusInternalServerError, gin.H{"error": "internal error"})
}
