package sqlite_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/sqlite"
)

// The embedded engine on a file of its own: postguard's tables in it, migrated by part (here the
// limiter's counters, whose statement counts a window while it is below its limit), and a
// generated APP_SECRET kept beside the file, never in it.
func ExampleNewEngine() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "sqlite-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	quiet := slog.New(slog.DiscardHandler)
	path := filepath.Join(dir, "app.db")
	engine, err := sqlite.NewEngine(ctx, path, &sqlite.Config{Logger: quiet})
	if err != nil {
		panic(err)
	}
	tables := db.NewTables(engine, &db.TablesConfig{Logger: quiet})
	defer tables.Close()
	if err := tables.MigrateTables(ctx, &db.MigrateOpts{Parts: []db.Part{db.PartLimiter}}); err != nil {
		panic(err)
	}

	start := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	window := &db.RateLimitCounterConsumeParams{KeyHash: []byte("an HMAC of the key"), WindowStart: start, WindowEnd: start.Add(time.Minute), LimitCount: 2}
	for range 3 {
		count, ok, err := tables.RateLimitCounterConsume(ctx, window)
		if err != nil {
			panic(err)
		}
		if !ok {
			fmt.Println("refused: the window is at its limit, nothing counted")
			continue
		}
		fmt.Println("counted:", count)
	}

	secret, err := engine.AppSecret(ctx)
	if err != nil {
		panic(err)
	}
	_, err = os.Stat(sqlite.SecretPath(path))
	fmt.Println("secret:", len(secret), "bytes, in", filepath.Base(sqlite.SecretPath(path)), err == nil)
	// Output:
	// counted: 1
	// counted: 2
	// refused: the window is at its limit, nothing counted
	// secret: 32 bytes, in app.db.secret true
}
