package api

import (
	"errors"
	"io"
	"net"

	"github.com/postguard/postguard/db"
)

// unavailableRetryAfterSeconds is the Retry-After of a 503: long enough for a database failover
// or restart to make progress, short enough that a user retrying by hand waits little.
const unavailableRetryAfterSeconds = 5

// databaseUnavailable says err is the database being unreachable or not answering, a state that
// passes (a 503, "retry later"), rather than a bug (a 500): an error the store marked
// db.ErrUnavailable (each engine knows its driver's errors), or a network failure that reached
// here unmarked.
func databaseUnavailable(err error) bool {
	var netErr net.Error
	return errors.Is(err, db.ErrUnavailable) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
