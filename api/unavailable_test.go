package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/dbtest"
	"github.com/postguard/postguard/internal/riverstore"
)

func TestDatabaseUnavailable(t *testing.T) {
	t.Parallel()

	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"ConnectionRefused", fmt.Errorf("error beginning transaction: %w", refused), true},
		{"ConnectionClosedMidAnswer", fmt.Errorf("error pinging database: %w", io.ErrUnexpectedEOF), true},
		{"MarkedByStore", fmt.Errorf("error committing transaction: %w", fmt.Errorf("%w: conn closed", db.ErrUnavailable)), true},
		{"NotFound", fmt.Errorf("x: %w", db.ErrNotFound), false},
		{"Bug", errors.New("nil pointer somewhere"), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, databaseUnavailable(tt.err), "%v", tt.err)
		})
	}
}

// unreachableStore is a store whose database cannot be reached: every rate-limit check fails
// with a refused connection.
type unreachableStore struct{ riverstore.Store }

func (s *unreachableStore) RateLimitCounterConsumeChain(context.Context, *db.RateLimitCounterChainParams) (*db.RateLimitCounterChainResult, error) {
	return nil, fmt.Errorf("error consuming rate limit counters: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
}

// stalledStore is a store whose transactions never answer: InTx waits for its context, whose
// deadline it records.
type stalledStore struct {
	riverstore.Store
	deadline chan time.Time
}

func (s *stalledStore) InTx(ctx context.Context, _ func(ctx context.Context, tx riverstore.Tx) error) error {
	deadline, _ := ctx.Deadline()
	s.deadline <- deadline
	<-ctx.Done()
	return fmt.Errorf("error beginning transaction: %w", ctx.Err())
}

func TestServer_DatabaseUnavailable(t *testing.T) {
	t.Parallel()

	requireUnavailable := func(t *testing.T, router http.Handler) {
		t.Helper()
		rec := serve(t, router, jsonRequest(t, "/v1/auth/register", map[string]string{"email": uniqueEmail("down"), "password": "correct horse battery"}))
		decodeProblem(t, rec, http.StatusServiceUnavailable)
		require.Equal(t, "5", rec.Header().Get("Retry-After"))
	}

	t.Run("Unreachable", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, &unreachableStore{Store: dbtest.NewSQLite(t)}, nil)
		requireUnavailable(t, bundle.router)
		require.Contains(t, bundle.logs.String(), `"msg":"database unavailable"`)
		require.NotContains(t, bundle.logs.String(), `"level":"ERROR"`)
	})

	t.Run("StalledEndsAtRequestTimeout", func(t *testing.T) {
		t.Parallel()
		const timeout = 200 * time.Millisecond
		store := &stalledStore{Store: dbtest.NewSQLite(t), deadline: make(chan time.Time, 1)}
		bundle := setup(t, store, &setupOpts{
			configFunc: func(config *Config) { config.RequestTimeout = timeout },
		})
		before := time.Now()
		requireUnavailable(t, bundle.router) // answered: the deadline, not the client, ended it
		after := time.Now()
		// The database work ran under the request's deadline, RequestTimeout after it began.
		deadline := <-store.deadline
		require.False(t, deadline.Before(before.Add(timeout)) || deadline.After(after.Add(timeout)),
			"deadline %s not RequestTimeout after the request", deadline)
	})
}
