package jobs_test

import (
	"fmt"
	"log/slog"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/jobs"
	"github.com/postguard/postguard/jobs/mail"
)

// An unsubscribe link's token names its user and proves the app made it.
func ExampleParseUnsubscribeToken() {
	secret := []byte("an example secret of 32 bytes...")

	tok := jobs.UnsubscribeToken(secret, 42)
	userID, ok := jobs.ParseUnsubscribeToken(secret, tok)
	fmt.Println(userID, ok)

	_, ok = jobs.ParseUnsubscribeToken(secret, "43"+tok[2:])
	fmt.Println(ok)
	// Output:
	// 42 true
	// false
}

// A verification link's token is derived from its job; only its hash is stored.
func ExampleVerifyToken() {
	secret := []byte("an example secret of 32 bytes...")

	raw := jobs.VerifyToken(secret, 7)
	fmt.Println(len(raw), raw == jobs.VerifyToken(secret, 7), raw == jobs.ResetToken(secret, 7))
	fmt.Println(len(jobs.HashToken(raw)))
	// Output:
	// 43 true false
	// 32
}

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
