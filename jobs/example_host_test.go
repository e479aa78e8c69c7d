package jobs_test

import (
	"context"
	"database/sql"
	"errors"
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

// printSender prints what it is given to send, in place of Resend.
type printSender struct{}

func (printSender) Send(_ context.Context, msg *mail.Message) (string, error) {
	fmt.Printf("sent %s to %s\n", msg.Kind, msg.To)
	return "printed", nil
}

// A host app with its own database, users table and River client runs postguard's mail jobs:
// the workers read its accounts through Recipients, are registered on its river.Workers, and
// their jobs are inserted with its client's InsertTx in the transaction that creates the
// account, so both commit or roll back together. (SQLite here; PostgreSQL the same, with
// postgres.NewEngineFromPool and riverpgxv5.)
func ExampleNewWorkers() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "jobs-host-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	quiet := slog.New(slog.DiscardHandler)

	// The host's database: its own accounts table, River's tables, postguard's tables.
	sqlDB, err := sql.Open("sqlite", filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		panic(err)
	}
	defer sqlDB.Close()
	sqlDB.SetMaxOpenConns(1)
	if _, err := sqlDB.ExecContext(ctx, `CREATE TABLE accounts (id INTEGER PRIMARY KEY, email TEXT NOT NULL, display_name TEXT NOT NULL)`); err != nil {
		panic(err)
	}
	migrator, err := rivermigrate.New(riversqlite.New(sqlDB), &rivermigrate.Config{Logger: quiet})
	if err != nil {
		panic(err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		panic(err)
	}
	engine, err := sqlite.NewEngineFromDB(sqlDB, &sqlite.Config{Logger: quiet})
	if err != nil {
		panic(err)
	}
	tables := db.NewTables(engine, &db.TablesConfig{Logger: quiet})
	if err := tables.MigrateTables(ctx, &db.MigrateOpts{Parts: []db.Part{db.PartMail}}); err != nil {
		panic(err)
	}

	// postguard's workers, reading the host's accounts, on the host's registry and client.
	accounts := jobs.RecipientsFunc(func(ctx context.Context, userID int64) (*jobs.Recipient, error) {
		var r jobs.Recipient
		err := sqlDB.QueryRowContext(ctx, `SELECT email, display_name FROM accounts WHERE id = ?`, userID).Scan(&r.Email, &r.Name)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("account %d: %w", userID, jobs.ErrNoRecipient)
		}
		return &r, err
	})
	workers, err := jobs.NewWorkers(&jobs.Deps{Store: tables, Recipients: accounts, Sender: printSender{}, Logger: quiet}, &jobs.Config{
		AppURL: "https://app.example.com",
		Secret: []byte("the app's secret of 32 bytes, at least"),
	})
	if err != nil {
		panic(err)
	}
	registry := river.NewWorkers()
	if err := workers.Register(registry); err != nil {
		panic(err)
	}
	client, err := river.NewClient(riversqlite.New(sqlDB), &river.Config{
		Logger:  quiet,
		Queues:  map[string]river.QueueConfig{jobs.QueueEmail: {MaxWorkers: 1}},
		Workers: registry,
	})
	if err != nil {
		panic(err)
	}

	// Sign-ups: the account and its welcome job in one of the host's transactions.
	signUp := func(email, name string, fail bool) error {
		tx, err := sqlDB.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // a no-op once committed
		var id int64
		if err := tx.QueryRowContext(ctx, `INSERT INTO accounts (email, display_name) VALUES (?, ?) RETURNING id`, email, name).Scan(&id); err != nil {
			return err
		}
		if _, err := client.InsertTx(ctx, tx, jobs.WelcomeEmailArgs{UserID: id}, nil); err != nil {
			return err
		}
		if fail {
			return errors.New("the rest of the sign-up failed")
		}
		return tx.Commit()
	}
	fmt.Println(signUp("grace@example.com", "Grace", true))
	fmt.Println(signUp("ada@example.com", "Ada", false))

	completed, cancel := client.Subscribe(river.EventKindJobCompleted)
	defer cancel()
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	event := <-completed
	fmt.Println(event.Job.Kind, event.Job.State)
	if err := client.Stop(ctx); err != nil {
		panic(err)
	}
	var accountCount int
	if err := sqlDB.QueryRowContext(ctx, `SELECT count(*) FROM accounts`).Scan(&accountCount); err != nil {
		panic(err)
	}
	fmt.Println("accounts:", accountCount)
	// Output:
	// the rest of the sign-up failed
	// <nil>
	// sent welcome_email to ada@example.com
	// welcome_email completed
	// accounts: 1
}
