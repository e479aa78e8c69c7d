package api

import (
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// unavailableRetryAfterSeconds is the Retry-After of a 503: long enough for a database failover
// or restart to make progress, short enough that a user retrying by hand waits little.
const unavailableRetryAfterSeconds = 5

// databaseUnavailable says err is the database being unreachable or not answering, a state that
// passes (a 503, "retry later"), rather than a bug (a 500):
//   - the network failed: a refused, reset or timed-out connection is a net.Error, a connection
//     closed mid-answer an io.EOF;
//   - the driver found its connection closed by such a failure (pgconn.ErrConnClosed), or failed
//     before sending anything (pgconn.SafeToRetry), or timed out (pgconn.Timeout);
//   - the server said it cannot serve: SQLSTATE class 08 (connection exception), 53300 (too many
//     connections), 57P01-57P03 (shutting down, crashed, starting up).
//
// This is the one place where api knows the PostgreSQL driver: the store passes pgx's errors on
// wrapped (%w), and the classification needs its sentinels. (SQLite, one local file, has no
// such failures.) Were db to grow an ErrUnavailable that db/postgres wraps these errors in, this
// would shrink to an errors.Is.
func databaseUnavailable(err error) bool {
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
