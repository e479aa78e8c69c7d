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

// interpretError turns pgx's errors into the db package's, once, at the store's boundary:
// pgx.ErrNoRows is db.ErrNotFound, and an error that says the database cannot serve right now
// (see unavailable) is wrapped in db.ErrUnavailable.
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

// unavailable says err is PostgreSQL being unreachable or unable to serve, a state that passes,
// rather than a bug:
//   - any failure to connect (pgconn.ConnectError): refused, timed out, or turned away by the
//     server, e.g. 55000 from a database that does not accept connections (ALLOW_CONNECTIONS
//     false, during a failover or maintenance), 57P03 while it starts, 53300 when it is full;
//   - the network failed: a reset or timed-out connection is a net.Error, a connection closed
//     mid-answer an io.EOF;
//   - pgx found its connection closed by such a failure (pgconn.ErrConnClosed), or failed before
//     sending anything (pgconn.SafeToRetry), or timed out (pgconn.Timeout);
//   - the server said it cannot serve: SQLSTATE class 08 (connection exception), 53
//     (insufficient resources: disk full, out of memory, too many connections), 57 (operator
//     intervention: shutting down, crashed, starting up, a statement cancelled), and 25006 (a
//     read-only server: a standby promoted to nothing yet, a primary demoted after a failover, or
//     default_transaction_read_only).
func unavailable(err error) bool {
	var (
		connectErr *pgconn.ConnectError
		netErr     net.Error
	)
	switch {
	case errors.As(err, &connectErr):
		return true
	case errors.As(err, &netErr), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	case errors.Is(err, pgconn.ErrConnClosed), pgconn.SafeToRetry(err), pgconn.Timeout(err):
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch state := pgErr.SQLState(); {
		case strings.HasPrefix(state, "08"), strings.HasPrefix(state, "53"), strings.HasPrefix(state, "57"):
			return true
		case state == "25006":
			return true
		}
	}
	return false
}

// sessionLost says err ended the connection's session before the statement that got it could
// have been answered: the server closed it (a FATAL error, such as 57P01 when the backend was
// terminated), or the network did (reset, end of file). It says nothing of whether the server
// ran what was sent; see retryOnce and db.TransactTx for when that is known.
func sessionLost(err error) bool {
	var (
		connectErr *pgconn.ConnectError
		netErr     net.Error
		pgErr      *pgconn.PgError
	)
	switch {
	case errors.As(err, &connectErr):
		// Never connected: nothing to lose, and connecting again now would fail the same way.
		return false
	case errors.Is(err, pgconn.ErrConnClosed), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	case errors.As(err, &pgErr):
		return strings.EqualFold(pgErr.Severity, "FATAL") || strings.EqualFold(pgErr.Severity, "PANIC")
	case errors.As(err, &netErr):
		// A timeout is the caller's deadline (pgx turns a context's end into one), not a loss.
		return !netErr.Timeout()
	}
	return false
}
