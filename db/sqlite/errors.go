package sqlite

import (
	"database/sql"
	"errors"
	"fmt"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/postguard/postguard/db"
)

// interpretError turns the driver's errors into the db package's, once, at the store's
// boundary: sql.ErrNoRows is db.ErrNotFound, and an error that says the database cannot serve
// right now (see unavailable) is wrapped in db.ErrUnavailable.
func interpretError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sql.ErrNoRows):
		return db.ErrNotFound
	case unavailable(err):
		return fmt.Errorf("%w: %w", db.ErrUnavailable, err)
	}
	return err
}

// unavailable says err is SQLite unable to serve for now, by its result code's primary part (the
// low byte; extended codes such as SQLITE_IOERR_WRITE or SQLITE_BUSY_SNAPSHOT share it):
//   - SQLITE_BUSY: another connection or process holds the write lock past the busy timeout;
//   - SQLITE_LOCKED: a table is locked by a conflicting use of the same database;
//   - SQLITE_FULL: the disk (or max_page_count) has no room left;
//   - SQLITE_IOERR: the operating system failed a read, write, sync or lock (a failing disk, a
//     file-size limit, a file system gone away).
//
// Each passes once the other process lets go, space is freed or the disk comes back, and none is
// the request's fault.
func unavailable(err error) bool {
	var sqliteErr *sqlite.Error
	if !errors.As(err, &sqliteErr) {
		return false
	}
	switch sqliteErr.Code() & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR:
		return true
	}
	return false
}
