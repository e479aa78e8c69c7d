package postgres_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/postgres"
	"github.com/postguard/postguard/internal/dbtest"
)

// TestMain gives the example a database: a schema of its own at TEST_DATABASE_URL.
func TestMain(m *testing.M) { os.Exit(dbtest.MainWithPostgres(m)) }

// A host app on PostgreSQL puts postguard's tables beside its own, on the pgx pool it keeps, and
// migrates the parts it uses: here the limiter's counters alone, which then cap a login at two
// attempts per account. DATABASE_URL is the host's database (its tests give this example a
// schema of its own).
func ExampleNewEngineFromPool() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // the host's own pool
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	quiet := slog.New(slog.DiscardHandler)
	engine, err := postgres.NewEngineFromPool(ctx, pool, &postgres.Config{Logger: quiet})
	if err != nil {
		panic(err)
	}
	tables := db.NewTables(engine, &db.TablesConfig{Logger: quiet})
	defer tables.Close() // the counters' small pool the engine made; the host's pool stays open
	if err := tables.MigrateTables(ctx, &db.MigrateOpts{Parts: []db.Part{db.PartLimiter}}); err != nil {
		panic(err)
	}

	rules := abuse.Rules{}.With(abuse.Rule{Action: "login", Scope: abuse.ScopeKey, Limit: 2, Window: 15 * time.Minute})
	now := func() time.Time { return time.Date(2026, 3, 1, 10, 5, 0, 0, time.UTC) } // a fixed clock, for the output
	limiter, err := abuse.NewLimiter(tables, []byte("the app's secret of 32 bytes, at least"), rules, &abuse.LimiterConfig{NowFunc: now})
	if err != nil {
		panic(err)
	}
	for attempt := 1; attempt <= 3; attempt++ {
		decision, err := limiter.Allow(ctx, "login", abuse.Subject{IP: netip.MustParseAddr("198.51.100.7"), Key: "account-42"})
		if err != nil {
			panic(err)
		}
		fmt.Printf("attempt %d: allowed %t, %d left, retry after %ds\n", attempt, decision.Allowed, decision.Remaining, decision.RetryAfterSeconds())
	}
	// Output:
	// attempt 1: allowed true, 1 left, retry after 600s
	// attempt 2: allowed true, 0 left, retry after 600s
	// attempt 3: allowed false, 0 left, retry after 600s
}
