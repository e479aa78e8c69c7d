//go:build baseline

package main

import (
	"context"
	"database/sql"
	"log/slog"

	"github.com/gin-gonic/gin"
)

// The app without postguard, for scripts/librarycost, which measures what the limiter costs the
// app against it (`go build -tags baseline` without limiter.go): every login attempt goes
// through. Not an app to run.

type noLimiter struct{}

func (noLimiter) Spend(*gin.Context, string) bool { return true }
func (noLimiter) Clear(*gin.Context, string) bool { return true }

func openLimiter(context.Context, *sql.DB, []string, *slog.Logger) (Limiter, error) {
	return noLimiter{}, nil
}
