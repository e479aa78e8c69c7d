// Command hostapp is a small Gin app that uses postguard as a Go library, in its own process,
// on its own database (PostgreSQL or SQLite) and accounts table: postguard's limiter guards its
// sign-up (Gin middleware) and its login (spent before the password is checked, a success
// refunded, the browser then a trusted device), and postguard's mail jobs run on its own River
// client, the welcome job inserted in the transaction that creates the account; the same client
// prunes the limiter's expired counters every minute. Request bodies are capped and the server
// cuts off slow clients. See README.md, "Using it as a library".
//
// The trusted-device cookie is __Host- prefixed and Secure: browsers keep it over HTTPS, and on
// http://localhost.
//
//	DATABASE_URL=postgres://… APP_SECRET=$(openssl rand -hex 32) go run ./examples/hostapp
//	DATABASE_URL=sqlite://hostapp.db APP_SECRET=$(openssl rand -hex 32) go run ./examples/hostapp
//
// Mail is printed to the log unless RESEND_API_KEY and RESEND_FROM_EMAIL are set.
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

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postguard/postguard/jobs/mail"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Environ()); err != nil {
		fmt.Fprintf(os.Stderr, "hostapp: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, environ []string) error {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	secret := os.Getenv("APP_SECRET")
	if len(secret) < 32 {
		return errors.New("APP_SECRET must be at least 32 bytes")
	}
	rules, err := DefaultRules().WithEnviron(environ)
	if err != nil {
		return err
	}
	var sender mail.Sender = mail.NewLogSender(logger, nil)
	if key := os.Getenv("RESEND_API_KEY"); key != "" {
		if sender, err = mail.NewResendSender(&mail.ResendConfig{APIKey: key, From: os.Getenv("RESEND_FROM_EMAIL")}); err != nil {
			return err
		}
	}

	config := &Config{
		Secret: []byte(secret),
		AppURL: cmp.Or(os.Getenv("APP_URL"), "http://localhost:8081"),
		Rules:  rules,
		Sender: sender,
		Logger: logger,
	}
	var app *App
	databaseURL := os.Getenv("DATABASE_URL")
	if path, ok := strings.CutPrefix(databaseURL, "sqlite://"); ok {
		// One connection, WAL, a busy timeout, BEGIN IMMEDIATE: as postguard's SQLite engine
		// and River's want a handle they share.
		sqlDB, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
		if err != nil {
			return err
		}
		defer sqlDB.Close()
		sqlDB.SetMaxOpenConns(1)
		if app, err = NewSQLiteApp(sqlDB, config); err != nil {
			return err
		}
	} else {
		pool, err := pgxpool.New(ctx, databaseURL)
		if err != nil {
			return err
		}
		defer pool.Close()
		if app, err = NewPostgresApp(ctx, pool, config); err != nil {
			return err
		}
	}
	defer app.Close()
	if err := app.Migrate(ctx); err != nil {
		return err
	}
	if err := app.River.Start(ctx); err != nil {
		return err
	}
	server := newServer(cmp.Or(os.Getenv("HTTP_ADDR"), ":8081"), app.Router)
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = server.Shutdown(shutdownCtx)
	}()
	logger.InfoContext(ctx, "hostapp started", slog.String("addr", server.Addr))
	serveErr := server.ListenAndServe()
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	stopErr := app.River.Stop(stopCtx)
	if !errors.Is(serveErr, http.ErrServerClosed) {
		return errors.Join(serveErr, stopErr)
	}
	return stopErr
}

// newServer is the app's HTTP server on addr: a client that sends its headers or body slowly, or
// holds an idle connection, is cut off, so a few slow clients cannot hold every connection.
func newServer(addr string, handler http.Handler) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
	}
}
