package jobs_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/sqlite"
	"github.com/postguard/postguard/jobs"
	"github.com/postguard/postguard/jobs/mail"
)

// laterClient is River's client once it exists: NewRiverConfig takes the client prune deletes
// finished jobs through before the client, built from that config, exists.
type laterClient struct{ *river.Client[*sql.Tx] }

// NewRiverConfig is the whole River configuration of a postguard process: its queues, workers,
// retry policy, the periodic prune (River's own job cleaner off) and the metrics. Its jobs are
// inserted with the client's Insert or InsertTx.
func ExampleNewRiverConfig() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "postguard-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	quiet := slog.New(slog.DiscardHandler)
	engine, err := sqlite.NewEngine(ctx, filepath.Join(dir, "postguard.db"), &sqlite.Config{Logger: quiet})
	if err != nil {
		panic(err)
	}
	tables := db.NewTables(engine, &db.TablesConfig{Logger: quiet})
	defer tables.Close()
	if err := tables.MigrateTables(ctx, &db.MigrateOpts{Parts: db.Parts()}); err != nil {
		panic(err)
	}
	migrator, err := rivermigrate.New(riversqlite.New(engine.DB()), &rivermigrate.Config{Logger: quiet})
	if err != nil {
		panic(err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		panic(err)
	}

	client := &laterClient{}
	config, err := jobs.NewRiverConfig(&jobs.Deps{Store: tables, Jobs: client, Sender: mail.NewLogSender(quiet, nil), Logger: quiet}, &jobs.Config{
		AppURL: "https://app.example.com",
		MaxRPS: 2,
		Secret: []byte("an example secret of 32 bytes..."),
	})
	if err != nil {
		panic(err)
	}
	if client.Client, err = river.NewClient(riversqlite.New(engine.DB()), config); err != nil {
		panic(err)
	}

	res, err := client.Insert(ctx, jobs.WelcomeEmailArgs{UserID: 1}, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Job.Kind, res.Job.Queue, res.Job.MaxAttempts)
	// Output:
	// welcome_email email 5
}
