// Package db is the seam between postguard and its database. It owns the Tables, the one
// interface the limiter, the mail workers and the HTTP handlers talk to, and writes once
// everything that does not depend on the engine: transactions and the rule for running one
// again, the counters' chains, the migrations (goose) and their checks. An Engine, in
// db/postgres or db/sqlite, supplies the rest: its connections, its transactions, and its sqlc
// queries with their time and error conversions.
//
// Nothing here knows River: a host app runs River its own way on the same pool or *sql.DB, and
// postguard's server puts its River client beside the Tables in internal/riverstore.
//
// It also embeds the app's migrations of both engines, and defines the rows (User, EmailToken,
// EmailMessage, EmailSuppression) and the errors (ErrNotFound, ErrUnavailable, ...) every engine returns.
package db

import (
	"embed"
	"errors"
)

// Migrations holds the goose migrations of both engines, under postgres/ and sqlite/.
//
//go:embed migrations
var Migrations embed.FS

var (
	// ErrNotFound is returned when a row looked up does not exist (or a token is unusable).
	ErrNotFound = errors.New("not found")

	// ErrEmailTaken is returned by UserInsert when the email is already registered.
	ErrEmailTaken = errors.New("email already registered")

	// ErrExists is returned by an insert whose row exists already (EmailMessageInsert: another
	// attempt of the job created its message; WebhookEventInsert: a replayed delivery).
	ErrExists = errors.New("already exists")

	// ErrUnavailable wraps errors that mean the database cannot be reached or cannot serve right
	// now (a refused or dropped connection, a timeout, a server shutting down, out of connections
	// or read-only; SQLite busy, full or failing its I/O): a state that passes, answered 503, not
	// a bug. Each engine decides, at its boundary, which of its driver's errors these are, and
	// every store method's errors go through that decision.
	ErrUnavailable = errors.New("database unavailable")
)
