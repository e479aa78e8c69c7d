package db_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/dbtest"
)

// The batching of checks: the engines' batch statements answer what the chains one by one would,
// all or nothing, and the Tables form batches as NewTables says (gated, never timed).

// batchWindow is a window of the batch tests: key's counter in now's window, at most limit.
func batchWindow(key string, limit int64) db.RateLimitCounterConsumeParams {
	return db.RateLimitCounterConsumeParams{KeyHash: tokenHash(key), WindowStart: now, WindowEnd: now.Add(15 * time.Minute), LimitCount: limit}
}

func batchCount(t *testing.T, store db.Counters, key string) int64 {
	t.Helper()
	n, err := store.RateLimitCounterGet(t.Context(), &db.RateLimitCounterGetParams{KeyHash: tokenHash(key), WindowStart: now, WindowEnd: now.Add(15 * time.Minute)})
	require.NoError(t, err)
	return n
}

// batchStore is a migrated store of engine with a user, ada@example.com, and a revocation of the
// devices of "revoked-account".
func batchStore(t *testing.T, engine string) *dbtest.Store {
	t.Helper()
	var store *dbtest.Store
	if engine == "postgres" {
		store = dbtest.NewPostgres(t)
	} else {
		store = dbtest.NewSQLite(t)
	}
	userInsert(t.Context(), t, store, "ada@example.com")
	require.NoError(t, store.RateLimitDeviceRevocationUpsert(t.Context(), tokenHash("revoked-account")))
	return store
}

// randomChains are n chains drawn with seed from a few keys of each position, so that many share
// keys and hit their limits: an IP; then perhaps an email, perhaps a key, perhaps a device in
// place of the key (standing or revoked), perhaps a user to read.
func randomChains(seed uint64, n int) []*db.RateLimitCounterChainParams {
	r := rand.New(rand.NewPCG(seed, 0))
	pick := func(prefix string, of int) string { return fmt.Sprintf("%s%d", prefix, r.IntN(of)) }
	chains := make([]*db.RateLimitCounterChainParams, n)
	for i := range chains {
		chain := &db.RateLimitCounterChainParams{Windows: []db.RateLimitCounterConsumeParams{batchWindow(pick("ip", 12), 4)}}
		if r.IntN(4) > 0 {
			chain.Windows = append(chain.Windows, batchWindow(pick("email", 20), 2))
		}
		if r.IntN(2) == 0 {
			chain.Windows = append(chain.Windows, batchWindow(pick("key", 8), 3))
			if r.IntN(2) == 0 {
				account, since := "standing-account", now
				if r.IntN(2) == 0 {
					account, since = "revoked-account", time.Unix(0, 0)
				}
				chain.Device = &db.RateLimitDeviceParams{
					Window: len(chain.Windows) - 1, KeyHash: tokenHash(pick("device", 6)),
					RevocationHash: tokenHash(account), Since: since,
				}
			}
		}
		switch r.IntN(3) {
		case 0:
			chain.UserEmail = "ada@example.com"
		case 1:
			chain.UserEmail = "nobody@example.com"
		}
		chains[i] = chain
	}
	return chains
}

// batchesOf cuts chains, in order, into batches in which no key is twice, as the Tables do.
func batchesOf(chains []*db.RateLimitCounterChainParams) [][]*db.RateLimitCounterChainParams {
	var batches [][]*db.RateLimitCounterChainParams
	var current []*db.RateLimitCounterChainParams
	seen := map[string]bool{}
	for _, chain := range chains {
		var keys []string
		for _, w := range chain.Windows {
			keys = append(keys, string(w.KeyHash))
		}
		if chain.Device != nil {
			keys = append(keys, string(chain.Device.KeyHash))
		}
		if slices.ContainsFunc(keys, func(k string) bool { return seen[k] }) {
			batches, current, seen = append(batches, current), nil, map[string]bool{}
		}
		for _, k := range keys {
			seen[k] = true
		}
		current = append(current, chain)
	}
	return append(batches, current)
}

// outcome is a result as the two stores can both say it: the user by email (ids differ).
type outcome struct {
	Counts        []int64
	DeviceTrusted bool
	UserEmail     string
}

func outcomeOf(result *db.RateLimitCounterChainResult) outcome {
	o := outcome{Counts: result.Counts, DeviceTrusted: result.DeviceTrusted}
	if result.User != nil {
		o.UserEmail = result.User.Email
	}
	return o
}

func TestStore_RateLimitCounterConsumeBatch(t *testing.T) {
	t.Parallel()

	for _, engine := range []string{"postgres", "sqlite"} {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()

			t.Run("AnswersAsTheChainsOneByOne", func(t *testing.T) {
				t.Parallel()

				ctx := t.Context()
				batched, alone := batchStore(t, engine), batchStore(t, engine)
				chains := randomChains(26, 400)
				batches := batchesOf(chains)
				require.Less(t, len(batches), len(chains)/2, "the draw should make batches of several chains")

				var got, want []outcome
				for _, batch := range batches {
					results, err := batched.RateLimitCounterConsumeBatch(ctx, batch)
					require.NoError(t, err)
					require.Len(t, results, len(batch))
					for _, result := range results {
						got = append(got, outcomeOf(result))
					}
				}
				for _, chain := range chains {
					result, err := alone.RateLimitCounterConsumeChain(ctx, chain)
					require.NoError(t, err)
					want = append(want, outcomeOf(result))
				}
				require.Equal(t, want, got)

				// Every kind of answer was drawn: refusals at each position, devices standing and
				// revoked, users read and not.
				lengths, trusted, users := map[int]bool{}, map[bool]bool{}, map[string]bool{}
				for i, o := range got {
					lengths[len(o.Counts)] = true
					if chains[i].Device != nil {
						trusted[o.DeviceTrusted] = true
					}
					users[o.UserEmail] = true
				}
				require.Len(t, lengths, 4, "counts' lengths 0 to 3")
				require.Len(t, trusted, 2)
				require.Len(t, users, 2)

				for _, prefix := range []string{"ip", "email", "key", "device"} {
					for i := range 20 {
						key := fmt.Sprintf("%s%d", prefix, i)
						require.Equal(t, batchCount(t, alone, key), batchCount(t, batched, key), key)
					}
				}
			})

			t.Run("FailingStatementSpendsNothing", func(t *testing.T) {
				t.Parallel()

				ctx := t.Context()
				store := batchStore(t, engine)
				_, _, err := store.RateLimitCounterConsume(ctx, func() *db.RateLimitCounterConsumeParams { w := batchWindow("ip0", 10); return &w }())
				require.NoError(t, err)

				var chains []*db.RateLimitCounterChainParams
				for i := range 100 {
					chains = append(chains, &db.RateLimitCounterChainParams{Windows: []db.RateLimitCounterConsumeParams{
						batchWindow(fmt.Sprintf("ip%d", i), 10), batchWindow(fmt.Sprintf("email%d", i), 10),
					}})
				}
				// The database fails once the statement has spent most of the batch.
				failWritesAt(t, store, engine, "email99")

				_, err = store.RateLimitCounterConsumeBatch(ctx, chains)
				require.ErrorIs(t, err, db.ErrUnavailable, "a full disk is an outage (503)")
				require.Equal(t, int64(1), batchCount(t, store, "ip0"), "spent by a batch that failed")
				for i := range 100 {
					require.Zero(t, batchCount(t, store, fmt.Sprintf("ip%d", i+1)), "spent by a batch that failed")
					require.Zero(t, batchCount(t, store, fmt.Sprintf("email%d", i)), "spent by a batch that failed")
				}
			})

			t.Run("RefusesAKeyInTwoChains", func(t *testing.T) {
				t.Parallel()

				store := batchStore(t, engine)
				_, err := store.RateLimitCounterConsumeBatch(t.Context(), []*db.RateLimitCounterChainParams{
					{Windows: []db.RateLimitCounterConsumeParams{batchWindow("ip0", 5), batchWindow("email0", 5)}},
					{Windows: []db.RateLimitCounterConsumeParams{batchWindow("ip1", 5), batchWindow("email0", 5)}},
				})
				require.ErrorContains(t, err, "chain 2 of a batch: a key of an earlier chain")
				require.Zero(t, batchCount(t, store, "ip0"))
			})
		})
	}
}

// failWritesAt makes store's database fail part-way through a batch of fresh keys, as a full disk
// does: on PostgreSQL key's insert answers disk_full (53100, see failInsertOf); SQLite is held to
// the pages it has (max_page_count), so its inserts run out of room once the free space on them
// is used. Both engines report it as db.ErrUnavailable.
func failWritesAt(t *testing.T, store *dbtest.Store, engine, key string) {
	t.Helper()
	if engine == "postgres" {
		failInsertOf(t, store, engine, key)
		return
	}
	ctx := t.Context()
	sqlDB := store.SQLiteOrPostgresDB(t)
	// VACUUM first: the pages the migrations freed (the tables they rebuilt) would take the
	// batch's rows without the file growing.
	_, err := sqlDB.ExecContext(ctx, `VACUUM`)
	require.NoError(t, err)
	var pages int
	require.NoError(t, sqlDB.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&pages))
	_, err = sqlDB.ExecContext(ctx, fmt.Sprintf(`PRAGMA max_page_count = %d`, pages))
	require.NoError(t, err)
}

// failInsertOf makes the insert of key's counter fail, and only it, with a trigger: on
// PostgreSQL as a full disk does (disk_full, 53100); on SQLite with RAISE(ABORT).
func failInsertOf(t *testing.T, store *dbtest.Store, engine, key string) {
	t.Helper()
	sqlDB := store.SQLiteOrPostgresDB(t)
	if engine != "postgres" {
		_, err := sqlDB.ExecContext(t.Context(), fmt.Sprintf(`
			CREATE TRIGGER fail_on_key BEFORE INSERT ON rate_limit_counters
			WHEN NEW.key_hash = x'%x' BEGIN SELECT RAISE(ABORT, 'fail_on_key'); END`, tokenHash(key)))
		require.NoError(t, err)
		return
	}
	_, err := sqlDB.ExecContext(t.Context(), fmt.Sprintf(`
		CREATE FUNCTION fail_on_key() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.key_hash = '\x%x'::bytea THEN
				RAISE EXCEPTION 'could not extend file' USING ERRCODE = '53100';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER fail_on_key BEFORE INSERT ON rate_limit_counters FOR EACH ROW EXECUTE FUNCTION fail_on_key();`,
		tokenHash(key)))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := sqlDB.ExecContext(context.Background(), `DROP TRIGGER fail_on_key ON rate_limit_counters; DROP FUNCTION fail_on_key()`)
		require.NoError(t, err)
	})
}

// gatedTables are Tables on store's engine whose batches of checks wait at a gate: each batch's
// size arrives on batches, and the batch runs once release receives. One batch runs at a time.
type gatedTables struct {
	db.Tables
	batches chan int
	release chan struct{}
	queued  chan int
}

func newGatedTables(t *testing.T, store *dbtest.Store) *gatedTables {
	t.Helper()
	g := &gatedTables{batches: make(chan int, 8), release: make(chan struct{}), queued: make(chan int, 16)}
	config := db.WithCounterBatchHooks(&db.TablesConfig{CounterBatchInFlight: 1},
		func(n int) { g.queued <- n },
		func(ctx context.Context, n int) {
			g.batches <- n
			select {
			case <-g.release:
			case <-ctx.Done():
			}
		})
	// The store keeps its engine and closes it; these Tables are a second view of it.
	if store.Postgres != nil {
		g.Tables = db.NewTables(store.Postgres, config)
	} else {
		g.Tables = db.NewTables(store.SQLite, config)
	}
	return g
}

// check is one RateLimitCounterConsumeChain in flight.
type check struct {
	cancel  context.CancelFunc
	answers chan checkAnswer
}

type checkAnswer struct {
	result *db.RateLimitCounterChainResult
	err    error
}

func (g *gatedTables) check(ctx context.Context, chain *db.RateLimitCounterChainParams) *check {
	ctx, cancel := context.WithCancel(ctx)
	c := &check{cancel: cancel, answers: make(chan checkAnswer, 1)}
	go func() {
		result, err := g.RateLimitCounterConsumeChain(ctx, chain)
		c.answers <- checkAnswer{result, err}
	}()
	return c
}

func (g *gatedTables) checkQueued(t *testing.T, chain *db.RateLimitCounterChainParams, n int) *check {
	t.Helper()
	c := g.check(t.Context(), chain)
	require.Equal(t, n, <-g.queued, "queue's length")
	return c
}

func (c *check) counts(t *testing.T) []int64 {
	t.Helper()
	a := <-c.answers
	require.NoError(t, a.err)
	return a.result.Counts
}

func TestTables_BatchesChecks(t *testing.T) {
	t.Parallel()

	for _, engine := range []string{"postgres", "sqlite"} {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := batchStore(t, engine)
			g := newGatedTables(t, store)
			chain := func(windows ...db.RateLimitCounterConsumeParams) *db.RateLimitCounterChainParams {
				return &db.RateLimitCounterChainParams{Windows: windows}
			}
			for range 2 { // ipFull's window is at its limit
				_, _, err := store.RateLimitCounterConsume(ctx, func() *db.RateLimitCounterConsumeParams { w := batchWindow("ipFull", 2); return &w }())
				require.NoError(t, err)
			}

			// An idle check goes at once, alone.
			first := g.check(ctx, chain(batchWindow("ipA", 5), batchWindow("email0", 5)))
			require.Equal(t, 1, <-g.batches)

			// While it runs, checks wait in the queue.
			twiceFirst := g.checkQueued(t, chain(batchWindow("ipB", 5), batchWindow("email1", 5)), 1)
			twiceSecond := g.checkQueued(t, chain(batchWindow("ipB", 5), batchWindow("email2", 5)), 2)
			cancelledQueued := g.checkQueued(t, chain(batchWindow("ipC", 5), batchWindow("email3", 5)), 3)
			refusedFirst := g.checkQueued(t, chain(batchWindow("ipFull", 2), batchWindow("email4", 5)), 4)
			cancelledInFlight := g.checkQueued(t, chain(batchWindow("ipD", 5), batchWindow("email5", 5)), 5)
			withUser := g.check(ctx, &db.RateLimitCounterChainParams{
				Windows: []db.RateLimitCounterConsumeParams{batchWindow("ipE", 5), batchWindow("email6", 5)}, UserEmail: "ada@example.com",
			})
			require.Equal(t, 6, <-g.queued)

			// A check cancelled while it waits leaves the queue and is never spent.
			cancelledQueued.cancel()
			require.ErrorIs(t, (<-cancelledQueued.answers).err, context.Canceled)

			g.release <- struct{}{}
			require.Equal(t, []int64{1, 1}, first.counts(t))

			// The next batch: every waiting check but the second of ipB, which waits for the
			// first's batch (a key once per batch, in arrival order).
			require.Equal(t, 4, <-g.batches)
			// A check cancelled while its batch runs is answered at once; the batch goes on.
			cancelledInFlight.cancel()
			require.ErrorIs(t, (<-cancelledInFlight.answers).err, context.Canceled)
			g.release <- struct{}{}
			require.Equal(t, []int64{1, 1}, twiceFirst.counts(t))
			require.Empty(t, refusedFirst.counts(t), "IP first: the full IP refused")
			a := <-withUser.answers
			require.NoError(t, a.err)
			require.Equal(t, []int64{1, 1}, a.result.Counts)
			require.NotNil(t, a.result.User)
			require.Equal(t, "ada@example.com", a.result.User.Email)

			require.Equal(t, 1, <-g.batches)
			g.release <- struct{}{}
			require.Equal(t, []int64{2, 1}, twiceSecond.counts(t), "ipB's second check counts after its first")

			require.Zero(t, batchCount(t, store, "ipC"), "the check cancelled in the queue was spent")
			require.Zero(t, batchCount(t, store, "email3"), "the check cancelled in the queue was spent")
			require.Zero(t, batchCount(t, store, "email4"), "spent after its IP refused")
			require.Equal(t, int64(2), batchCount(t, store, "ipFull"))
			require.Equal(t, int64(1), batchCount(t, store, "email5"), "the batch of the check cancelled in flight went on")
		})
	}
}

// A batch that fails answers every check of it with the failure: the HTTP layer answers each a
// 503, since the engine marks a full disk db.ErrUnavailable.
func TestTables_FailedBatchFailsEachCheck(t *testing.T) {
	t.Parallel()

	for _, engine := range []string{"postgres", "sqlite"} {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()

			ctx := t.Context()
			store := batchStore(t, engine)
			g := newGatedTables(t, store)

			first := g.check(ctx, &db.RateLimitCounterChainParams{Windows: []db.RateLimitCounterConsumeParams{batchWindow("ip-first", 5)}})
			require.Equal(t, 1, <-g.batches)
			var checks []*check
			for i := range 50 {
				checks = append(checks, g.checkQueued(t, &db.RateLimitCounterChainParams{Windows: []db.RateLimitCounterConsumeParams{
					batchWindow(fmt.Sprintf("ip%d", i), 10), batchWindow(fmt.Sprintf("email%d", i), 10),
				}}, i+1))
			}
			g.release <- struct{}{}
			require.Equal(t, []int64{1}, first.counts(t))

			require.Equal(t, 50, <-g.batches)
			// The gate holds the batch before its statement (on SQLite, before its transaction:
			// the one connection is free).
			failWritesAt(t, store, engine, "email49")
			g.release <- struct{}{}

			for i, c := range checks {
				a := <-c.answers
				require.ErrorIs(t, a.err, db.ErrUnavailable, "check %d", i)
			}
			for i := range 50 {
				require.Zero(t, batchCount(t, store, fmt.Sprintf("ip%d", i)), "half-spent")
				require.Zero(t, batchCount(t, store, fmt.Sprintf("email%d", i)), "half-spent")
			}
		})
	}
}

// TestTables_FailedLoneCheckSpendsNothing: a check that runs alone is all or nothing too. On
// PostgreSQL it is one statement; on SQLite its statements share one transaction, so a failure
// at its second window leaves its first unspent.
func TestTables_FailedLoneCheckSpendsNothing(t *testing.T) {
	t.Parallel()

	for _, engine := range []string{"postgres", "sqlite"} {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()

			store := batchStore(t, engine)
			failInsertOf(t, store, engine, "email-lone")

			_, err := store.RateLimitCounterConsumeChain(t.Context(), &db.RateLimitCounterChainParams{
				Windows:   []db.RateLimitCounterConsumeParams{batchWindow("ip-lone", 5), batchWindow("email-lone", 5)},
				UserEmail: "ada@example.com",
			})
			require.Error(t, err)
			require.Zero(t, batchCount(t, store, "ip-lone"), "half-spent")
		})
	}
}
