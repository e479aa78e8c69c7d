// Command postguard guards a web app's auth routes: a transactional email queue on River and
// database-backed rate limits. See README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/postguard/postguard/cmd/internal/service"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	switch {
	case err == nil:
	case errors.Is(err, errUsage):
		os.Exit(2)
	default:
		fmt.Fprintf(os.Stderr, "postguard: %v\n", err)
		os.Exit(1)
	}
}

// errUsage is returned after the usage text has been printed for a wrong command line.
var errUsage = errors.New("usage")

const usage = `postguard guards a web app's auth routes.

Usage: postguard <command>

Commands:
  serve     API, workers and periodic jobs in one process (migrates the embedded default by itself)
  api       HTTP only: inserts jobs, works none (PostgreSQL)
  worker    workers and periodic jobs; HTTP_ADDR serves /healthz, /readyz, /metrics (PostgreSQL)
  migrate   apply River's migrations and then the app's (idempotent)
  mail preview --out DIR
            write every mail kind × locale, HTML and text, rendered with sample data
  secret reset --yes
            record this secret as the database's, in place of the one it was made with
  version   print the version

Configuration is read from the environment; see README.md.
`

// run is main without the process: it takes the command line, the environment (os.Environ's
// "KEY=value" form) and the output streams, so tests can call it.
func run(ctx context.Context, args []string, environ []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (len(args) > 1 && args[0] != "mail" && args[0] != "secret") {
		fmt.Fprint(stderr, usage)
		return errUsage
	}

	var cmd command
	switch args[0] {
	case "mail":
		preview, err := parseMailCommand(args[1:], stderr)
		if err != nil {
			return err
		}
		cmd = preview
	case "secret":
		reset, err := parseSecretCommand(args[1:], stderr)
		if err != nil {
			return err
		}
		cmd = reset
	case "serve":
		cmd = &serverCommand{role: service.RoleServe}
	case "api":
		cmd = &serverCommand{role: service.RoleAPI}
	case "worker":
		cmd = &serverCommand{role: service.RoleWorker}
	case "migrate":
		cmd = &migrateCommand{}
	case "version":
		cmd = &versionCommand{}
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprintf(stderr, "postguard: unknown command %q\n\n%s", args[0], usage)
		return errUsage
	}
	return cmd.Run(ctx, &commandEnv{Environ: environ, Stdout: stdout, Stderr: stderr})
}

// command is one subcommand.
type command interface {
	Run(ctx context.Context, env *commandEnv) error
}

// commandEnv is what a command gets from its process: the environment and the output streams.
type commandEnv struct {
	// Environ is the environment, in os.Environ's "KEY=value" form: RATE_LIMIT_ variables are
	// found by name, so the whole list is needed, not only lookups.
	Environ []string
	Stdout  io.Writer
	Stderr  io.Writer
}

// configure reads the configuration and builds the logger.
func (e *commandEnv) configure() (*config, *slog.Logger, error) {
	cfg, err := loadConfig(e.Environ)
	if err != nil {
		return nil, nil, fmt.Errorf("configuration error:\n%w", err)
	}
	return cfg, newLogger(cfg, e.Stderr), nil
}

// newLogger builds the process logger from LOG_FORMAT and LOG_LEVEL.
func newLogger(cfg *config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
