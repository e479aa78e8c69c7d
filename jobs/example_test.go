package jobs_test

import (
	"log/slog"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/jobs"
	"github.com/postguard/postguard/jobs/mail"
)

// NewRiverConfig builds the River config a store's client is configured with.
func ExampleNewRiverConfig() {
	var store db.Store // from postgres.New or sqlite.Open

	riverConfig, err := jobs.NewRiverConfig(&jobs.Deps{
		Logger: slog.Default(),
		Sender: mail.NewLogSender(slog.Default()),
		Store:  store,
	}, &jobs.Config{
		AppURL: "https://app.example.com",
		MaxRPS: 2,
		Secret: []byte("an example secret of 32 bytes..."),
	})
	if err != nil {
		panic(err)
	}
	if err := store.ConfigureRiver(riverConfig); err != nil {
		panic(err)
	}
}
