package jobs_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riversqlite"

	"github.com/postguard/postguard/db/sqlite"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs"
	"github.com/postguard/postguard/jobs/mail"
)

// NewRiverConfig is the River configuration of the store it is built for: the store hands itself
// to its workers.
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
	store, _, err := riverstore.New(engine, riversqlite.New(engine.DB()), &riverstore.Config{
		Logger: quiet,
		RiverConfigFunc: func(store riverstore.Store) (*river.Config, error) {
			return jobs.NewRiverConfig(&jobs.Deps{Store: store, Jobs: store.Jobs(), Sender: mail.NewLogSender(quiet, nil), Logger: quiet}, &jobs.Config{
				AppURL: "https://app.example.com",
				MaxRPS: 2,
				Secret: []byte("an example secret of 32 bytes..."),
			})
		},
	})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}

	res, err := store.JobInsert(ctx, jobs.WelcomeEmailArgs{UserID: 1}, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Job.Kind, res.Job.Queue, res.Job.MaxAttempts)
	// Output:
	// welcome_email email 5
}
