package postgres

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/postguard/postguard/db"
)

// interpretError turns pgx's errors into the db package's, once, at the engine's boundary:
// pgx.ErrNoRows is db.ErrNotFound, and an error that says the database cannot serve right now
// (see unavailable) is wrapped in db.ErrUnavailable. nil stays nil.
func interpretError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return db.ErrNotFound
	case unavailable(err):
		return fmt.Errorf("%w: %w", db.ErrUnavailable, err)
	}
	return err
}

// unavailable says err is PostgreSQL being unreachable or not answering, a state that passes,
// rather than a bug:
//   - the network failed: a refused, reset or timed-out connection is a net.Error, a connection
//     closed mid-answer an io.EOF;
//   - pgx found its connection closed by such a failure (pgconn.ErrConnClosed), or failed before
//     sending anything (pgconn.SafeToRetry), or timed out (pgconn.Timeout);
//   - the server said it cannot serve: SQLSTATE class 08 (connection exception), 53300 (too many
//     connections), 57P01-57P03 (shutting down, crashed, starting up).
func unavailable(err error) bool {
	var netErr net.Error
	switch {
	case errors.As(err, &netErr), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	case errors.Is(err, pgconn.ErrConnClosed), pgconn.SafeToRetry(err), pgconn.Timeout(err):
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch state := pgErr.SQLState(); {
		case strings.HasPrefix(state, "08"), state == "53300", state == "57P01", state == "57P02", state == "57P03":
			return true
		}
	}
	return false
}
