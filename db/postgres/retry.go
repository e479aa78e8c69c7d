package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ConnectTimeoutDefault bounds each new connection (TCP, TLS and start-up together) when
// DATABASE_URL sets no connect_timeout. pgx has no default: a connection attempt to a server
// whose packets are dropped would otherwise wait for the kernel to give up (minutes), holding a
// slot of the pool while requests queue behind it. It is shorter than a request's deadline, so a
// request whose first connection attempt is lost can still be answered.
const ConnectTimeoutDefault = 5 * time.Second

// The retry rule. A call that fails because its connection is gone is retried, once and on
// another connection, only when it cannot have taken effect, so that no write ever applies
// twice:
//
//   - The pools never hand out a connection the server has already closed (checkConn, when a
//     connection is acquired, without a round trip): after a restart, pg_terminate_backend or a
//     pooler recycling its connections, pgxpool destroys such a connection and takes another,
//     a new one if need be, before anything is sent on it.
//   - A call that failed before sending anything (pgconn.SafeToRetry) runs again.
//   - A transaction (db.TransactTx) whose connection was lost before COMMIT was sent runs again
//     from BEGIN: PostgreSQL rolls back a transaction whose session ends before COMMIT.
//   - A read, or a write that leaves the database as it found it when run twice (idempotent),
//     runs again after its session was lost, whenever that happened.
//
// Never retried, because it may have committed: a COMMIT whose answer was lost, and a single
// write statement (which commits by itself) whose connection was lost after it was sent. Those,
// and every failure of the retry itself, are answered as db.ErrUnavailable (503).

// checkConn is the pools' PrepareConn: false for a connection the server has already closed,
// which pgxpool then destroys before acquiring another.
func checkConn(_ context.Context, conn *pgx.Conn) (bool, error) {
	return !closedByServer(conn.PgConn().Conn()), nil
}

// retryOnce runs op, and runs it once more when its first failure is one the retry rule allows:
// it sent nothing, or op is idempotent and its session was lost.
func retryOnce[T any](ctx context.Context, idempotent bool, op func() (T, error)) (T, error) {
	res, err := op()
	if err != nil && mayRetry(ctx, err, idempotent) {
		res, err = op()
	}
	return res, err
}

// mayRetry says a call that failed with err may run again: unless ctx is done (no time left) or
// it never connected (connecting again at once fails the same way), when it sent nothing, or
// when whatever it sent was lost with its session and lossIsSafe (a read, an idempotent
// write, a transaction before COMMIT).
func mayRetry(ctx context.Context, err error, lossIsSafe bool) bool {
	var connectErr *pgconn.ConnectError
	if ctx.Err() != nil || errors.As(err, &connectErr) {
		return false
	}
	return pgconn.SafeToRetry(err) || lossIsSafe && sessionLost(err)
}
