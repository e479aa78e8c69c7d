// Package db is the seam between postguard and its database. It owns the Store, the one interface
// api and jobs talk to, and writes once everything that does not depend on the engine: River's
// client (built once, in NewStore), transactions that insert jobs with River's InsertTx, the
// schema checks and migrations (River's through rivermigrate, the app's through goose), River
// UI's endpoints. Tables (NewTables) are the same without River, for a host app that runs River
// itself on its own pool or *sql.DB. An Engine, in db/postgres or db/sqlite, supplies the rest: its connections,
// its River driver, its transactions, and its sqlc queries with their time and error
// conversions.
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

	// ErrSchemaBehind is returned by Store.CheckSchema when River's or the app's migrations have
	// not all been applied. The message tells the operator what to run.
	ErrSchemaBehind = errors.New("database schema is behind: run `postguard migrate`")
)
