package db_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/sqlite"
)

// A host app keeps its own database handle and puts postguard's tables beside its own (a pgx
// pool works the same, with postgres.NewEngineFromPool). MigrateTables applies the migrations of
// the parts the host names, and nothing else: here the limiter's counters and the mail workers'
// tables, beside the host's own users table, each part in a goose table of postguard's own so
// that none mixes with the host's goose history. River's migrations are the host's to run.
func ExampleNewTables() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "db-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	sqlDB, err := sql.Open("sqlite", filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		panic(err)
	}
	defer sqlDB.Close()
	sqlDB.SetMaxOpenConns(1)
	if _, err := sqlDB.ExecContext(ctx, `CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT NOT NULL UNIQUE)`); err != nil {
		panic(err)
	}

	quiet := slog.New(slog.DiscardHandler)
	engine, err := sqlite.NewEngineFromDB(sqlDB, &sqlite.Config{Logger: quiet})
	if err != nil {
		panic(err)
	}
	tables := db.NewTables(engine, &db.TablesConfig{Logger: quiet})
	if err := tables.MigrateTables(ctx, &db.MigrateOpts{Parts: []db.Part{db.PartLimiter, db.PartMail}}); err != nil {
		panic(err)
	}
	if err := tables.Close(); err != nil { // the engine's, not the host's handle
		panic(err)
	}

	rows, err := sqlDB.QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name`)
	if err != nil {
		panic(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			panic(err)
		}
		fmt.Println(name)
	}
	if err := rows.Err(); err != nil {
		panic(err)
	}
	// Output:
	// email_messages
	// email_suppressions
	// email_tokens
	// postguard_limiter_db_version
	// postguard_mail_db_version
	// rate_limit_counters
	// rate_limit_device_revocations
	// send_pacer
	// users
	// webhook_events
}
