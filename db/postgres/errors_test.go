package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
)

func TestInterpretError(t *testing.T) {
	t.Parallel()

	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, tt := range []struct {
		name            string
		err             error
		wantUnavailable bool
	}{
		{"ConnectionRefused", fmt.Errorf("x: %w", refused), true},
		{"ConnectError", fmt.Errorf("x: %w", &pgconn.ConnectError{Config: &pgconn.Config{}}), true},
		{"ConnectionClosedMidAnswer", io.ErrUnexpectedEOF, true},
		{"PooledConnectionClosed", pgconn.ErrConnClosed, true},
		{"AdminShutdown", fmt.Errorf("x: %w", &pgconn.PgError{Severity: "FATAL", Code: "57P01"}), true},
		{"CannotConnectNow", &pgconn.PgError{Code: "57P03"}, true},
		{"StatementCancelled", &pgconn.PgError{Code: "57014"}, true},
		{"ConnectionFailure", &pgconn.PgError{Code: "08006"}, true},
		{"TooManyConnections", &pgconn.PgError{Code: "53300"}, true},
		{"DiskFull", &pgconn.PgError{Code: "53100"}, true},
		{"ReadOnlyTransaction", &pgconn.PgError{Code: "25006"}, true},
		{"NotAcceptingConnectionsOutsideConnect", &pgconn.PgError{Code: "55000"}, false},
		{"UniqueViolation", &pgconn.PgError{Code: "23505"}, false},
		{"SyntaxError", &pgconn.PgError{Code: "42601"}, false},
		{"Bug", errors.New("nil pointer somewhere"), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			got := interpretError(tt.err)
			require.Equal(t, tt.wantUnavailable, errors.Is(got, db.ErrUnavailable), "%v", got)
			require.ErrorIs(t, got, tt.err, "the driver's error stays inspectable")
		})
	}

	t.Run("NoRowsIsNotFound", func(t *testing.T) {
		t.Parallel()

		require.ErrorIs(t, interpretError(pgx.ErrNoRows), db.ErrNotFound)
	})
}

func TestMayRetry(t *testing.T) {
	t.Parallel()

	terminated := fmt.Errorf("x: %w", &pgconn.PgError{Severity: "FATAL", Code: "57P01"})
	for _, tt := range []struct {
		name           string
		err            error
		wantIfLossSafe bool
		wantOtherwise  bool
	}{
		// The server closed the session (pg_terminate_backend): whether what was sent ran is
		// unknown, so only a read, an idempotent write or an uncommitted transaction runs again.
		{"Terminated", terminated, true, false},
		{"ConnClosed", pgconn.ErrConnClosed, true, false},
		{"EOF", fmt.Errorf("x: %w", io.EOF), true, false},
		{"Reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true, false},
		// Never connected: connecting again at once fails the same way.
		{"ConnectError", &pgconn.ConnectError{Config: &pgconn.Config{}}, false, false},
		// An ERROR leaves the session as it was: a statement's own failure is not retried.
		{"ReadOnly", &pgconn.PgError{Severity: "ERROR", Code: "25006"}, false, false},
		{"UniqueViolation", &pgconn.PgError{Severity: "ERROR", Code: "23505"}, false, false},
		// A timeout is the caller's deadline.
		{"Timeout", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			require.Equal(t, tt.wantIfLossSafe, mayRetry(t.Context(), tt.err, true), "loss safe")
			require.Equal(t, tt.wantOtherwise, mayRetry(t.Context(), tt.err, false), "not loss safe")
		})
	}

	t.Run("NotAfterTheContextEnded", func(t *testing.T) {
		t.Parallel()

		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		require.False(t, mayRetry(ctx, terminated, true))
	})
}
