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
// deploy may run `river migrate-up` before it, or not at all.
type migrateCommand struct{}

func (c *migrateCommand) Run(ctx context.Context, env *commandEnv) error {
	// A deploy step migrates with DATABASE_URL alone, without the service's APP_SECRET or mailer
	// settings (README: `DATABASE_URL=… scripts/migrate.sh`).
	cfg, err := loadDatabaseConfig(env.Environ)
	if err != nil {
		return fmt.Errorf("configuration error:\n%w", err)
	}
	logger := newLogger(cfg, env.Stderr)

	store, err := service.OpenStore(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer store.Close()

	if err := store.Migrate(ctx); err != nil {
		return fmt.Errorf("error migrating %s database: %w", store.Engine(), err)
	}
	_, err = fmt.Fprintf(env.Stdout, "postguard: %s schema is up to date (River's migrations and postguard's)\n", store.Engine())
	return err
}
