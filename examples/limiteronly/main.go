// Command limiteronly is a Gin app with a users table of its own, migrated by its own goose
// history, on SQLite, whose login postguard's rate limiter guards, and nothing else of
// postguard's: no River, no mail, no server. It links what the limiter needs (db, db/sqlite,
// api/abuse, ginlimit) and adds one table, rate_limit_counters, recorded in postguard's own goose
// table beside the app's goose_db_version, whose expired counters it prunes every minute
// (prune.go). See README.md, "Using it as a library".
//
//	APP_SECRET=$(openssl rand -hex 32) go run ./examples/limiteronly
//
// DATABASE_PATH (default limiteronly.db) is the SQLite file, HTTP_ADDR (default :8082) the
// listen address; RATE_LIMIT_LOGIN_IP and RATE_LIMIT_LOGIN_KEY override the login's limits.
package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/pressly/goose/v3"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Environ()); err != nil {
		fmt.Fprintf(os.Stderr, "limiteronly: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, environ []string) error {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	sqlDB, err := OpenSQLite(cmp.Or(lookup(environ, "DATABASE_PATH"), "limiteronly.db"))
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	if err := MigrateApp(ctx, sqlDB, goose.DialectSQLite3); err != nil {
		return err
	}
	limiter, err := openLimiter(ctx, sqlDB, environ, logger)
	if err != nil {
		return err
	}
	app, err := NewApp(&Config{DB: sqlDB, Limiter: limiter, Logger: logger})
	if err != nil {
		return err
	}

	server := &http.Server{Addr: cmp.Or(lookup(environ, "HTTP_ADDR"), ":8082"), Handler: app.Router, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = server.Shutdown(shutdownCtx)
	}()
	logger.InfoContext(ctx, "limiteronly started", slog.String("addr", server.Addr))
	if err := server.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// OpenSQLite opens the app's database as postguard's SQLite engine wants a handle it shares: one
// connection, WAL, a busy timeout, and transactions that take the write lock at BEGIN.
func OpenSQLite(path string) (*sql.DB, error) {
	sqlDB, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("error opening %s: %w", path, err)
	}
	sqlDB.SetMaxOpenConns(1)
	return sqlDB, nil
}

// lookup is the value of the environment variable name in environ, "" when unset.
func lookup(environ []string, name string) string {
	for _, kv := range environ {
		if value, ok := strings.CutPrefix(kv, name+"="); ok {
			return value
		}
	}
	return ""
}
