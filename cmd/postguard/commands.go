package main

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/postguard/postguard/cmd/internal/service"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3".
var version = "dev"

// versionCommand prints the version and the build's module versions of River.
type versionCommand struct{}

func (c *versionCommand) Run(_ context.Context, env *commandEnv) error {
	river := "unknown"
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "github.com/riverqueue/river" {
				river = dep.Version
			}
		}
	}
	_, err := fmt.Fprintf(env.Stdout, "postguard %s (river %s)\n", version, river)
	return err
}

// migrateCommand applies River's migrations and then the app's, under a lock; idempotent, so a
// deploy may run `river migrate-up` before it, or not at all. Given the secret (APP_SECRET, or
// the embedded default's file), it checks it against the database's too, and records it on a
// database that has none.
type migrateCommand struct{}

func (c *migrateCommand) Run(ctx context.Context, env *commandEnv) error {
	// A deploy step may migrate with DATABASE_URL alone, without the service's mailer settings
	// (README: `DATABASE_URL=… scripts/migrate.sh`); APP_SECRET is optional.
	cfg, err := loadDatabaseConfig(env.Environ)
	if err != nil {
		return fmt.Errorf("configuration error:\n%w", err)
	}
	checked, err := service.Migrate(ctx, cfg, newLogger(cfg, env.Stderr))
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(env.Stdout, "postguard: %s schema is up to date (River's migrations and postguard's)\n", cfg.Engine); err != nil {
		return err
	}
	if checked {
		_, err = fmt.Fprintf(env.Stdout, "postguard: %s is the database's secret\n", service.SecretSource(cfg))
	} else {
		_, err = fmt.Fprintln(env.Stdout, "postguard: APP_SECRET not given: the first api, worker or serve checks its secret against the database's (and records it on a database that has none)")
	}
	return err
}
