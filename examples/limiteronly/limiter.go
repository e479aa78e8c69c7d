//go:build !baseline

package main

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/api/abuse/ginlimit"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/sqlite"
)

// This file is all of postguard the app uses: its limiter, on the app's own database, and
// prune.go, which deletes the limiter's expired counters. baseline.go is the same app without them, the one scripts/librarycost measures postguard's cost
// against.

// actionLogin counts login attempts per client IP (password spraying across accounts) and per
// account (guessing one account's password).
const actionLogin abuse.Action = "login"

// DefaultRules are the app's limits; RATE_LIMIT_LOGIN_IP and RATE_LIMIT_LOGIN_KEY override them.
func DefaultRules() abuse.Rules {
	return abuse.Rules{}.
		With(abuse.Rule{Action: actionLogin, Scope: abuse.ScopeIP, Limit: 20, Window: 15 * time.Minute}).
		With(abuse.Rule{Action: actionLogin, Scope: abuse.ScopeKey, Limit: 5, Window: 15 * time.Minute})
}

// LimiterConfig configures NewLimiter.
type LimiterConfig struct {
	// Tables are postguard's tables on the app's database.
	Tables db.Tables
	// Secret keys the counters' HMACs (APP_SECRET, at least 32 bytes).
	Secret []byte
	// Rules are the login's limits; DefaultRules() when empty.
	Rules abuse.Rules
	// Logger receives the limiter's database errors; slog.Default() when nil.
	Logger *slog.Logger
	// NowFunc is the limiter's clock; time.Now when nil.
	NowFunc func() time.Time
}

// NewLimiter migrates postguard's limiter part (its counters table, recorded in postguard's own
// goose table, never in the app's goose_db_version) on config.Tables, and returns the login's
// limiter.
func NewLimiter(ctx context.Context, config *LimiterConfig) (Limiter, error) {
	if err := config.Tables.MigrateTables(ctx, &db.MigrateOpts{Parts: []db.Part{db.PartLimiter}}); err != nil {
		return nil, err
	}
	rules := config.Rules
	if len(rules.All()) == 0 {
		rules = DefaultRules()
	}
	limiter, err := abuse.NewLimiter(config.Tables, config.Secret, rules, &abuse.LimiterConfig{NowFunc: config.NowFunc})
	if err != nil {
		return nil, err
	}
	return &guard{guard: ginlimit.New(limiter, &ginlimit.Config{Logger: config.Logger})}, nil
}

// openLimiter is main's limiter: postguard's tables on the app's SQLite handle, the rules from
// the environment, and their expired counters pruned every minute until ctx ends.
func openLimiter(ctx context.Context, sqlDB *sql.DB, environ []string, logger *slog.Logger) (Limiter, error) {
	rules, err := DefaultRules().WithEnviron(environ)
	if err != nil {
		return nil, err
	}
	engine, err := sqlite.NewEngineFromDB(sqlDB, &sqlite.Config{Logger: logger})
	if err != nil {
		return nil, err
	}
	tables := db.NewTables(engine, &db.TablesConfig{Logger: logger})
	limiter, err := NewLimiter(ctx, &LimiterConfig{
		Tables: tables,
		Secret: []byte(lookup(environ, "APP_SECRET")),
		Rules:  rules,
		Logger: logger,
	})
	if err != nil {
		return nil, fmt.Errorf("error setting up the login's limiter: %w", err)
	}
	go (&pruner{tables: tables, logger: logger, now: time.Now}).run(ctx)
	return limiter, nil
}

// guard is the Limiter on ginlimit: each call answers 429 (or 503) itself when it must.
type guard struct{ guard *ginlimit.Guard }

// Spend implements Limiter.
func (g *guard) Spend(c *gin.Context, key string) bool {
	return g.guard.Spend(c, actionLogin, g.guard.Subject(c, abuse.Subject{Key: key}))
}

// Clear implements Limiter: the account's attempts, not the IP's, so that an attacker's own
// account does not reset a spray.
func (g *guard) Clear(c *gin.Context, key string) bool {
	return g.guard.Clear(c, actionLogin, abuse.Subject{Key: key})
}
