package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"sync"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/db/sqlite/dbsqlc"
)

// The batch of checks (db's Tables batch the checks that arrive while one runs): one transaction
// of a few statements whatever the batch's size, a statement per position of the chains rather
// than per chain, since on SQLite each statement's cost is the CPU of preparing and stepping it.

// upsertValues is one window's row in the batch's upsert: its key, window and limit bound, a new
// counter at 1.
const upsertValues = "(?, ?, ?, 1, ?)"

// upsertHead and upsertTail wrap the batch's upsert of one position: RateLimitCounterConsume's
// statement over several rows. sqlc cannot write a VALUES list whose length varies. RETURNING
// gives the rows that admitted, each with its count; a window at its limit returns none.
const (
	upsertHead = "INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count) VALUES "
	upsertTail = " ON CONFLICT (window_end, key_hash, window_start) DO UPDATE" +
		" SET count = rate_limit_counters.count + 1" +
		" WHERE rate_limit_counters.count < excluded.limit_count" +
		" RETURNING key_hash, count"
)

// upsertQuery is the batch's upsert of n rows.
func upsertQuery(n int) string {
	var query strings.Builder
	query.Grow(len(upsertHead) + n*(len(upsertValues)+2) + len(upsertTail))
	query.WriteString(upsertHead)
	for i := range n {
		if i > 0 {
			query.WriteString(", ")
		}
		query.WriteString(upsertValues)
	}
	query.WriteString(upsertTail)
	return query.String()
}

// maxPrepared bounds the statements a stmtCache keeps: the upserts of every size a batch may
// have (db.DefaultCounterBatchMax), and the reads of users and of device revocations, whose IN
// lists have as many sizes.
const maxPrepared = 4 * db.DefaultCounterBatchMax

// stmtCache keeps the batch's statements prepared on the engine's *sql.DB, by their text, so that
// a batch does not prepare them anew: on SQLite preparing a statement costs as much as running
// it. A transaction's StmtContext takes the one prepared on its connection. The engine has one
// connection, which a transaction holds until it ends, so a statement met for the first time
// runs unprepared in its transaction and is prepared once the transaction is over (prepareMissed).
type stmtCache struct {
	db *sql.DB

	prepareMu sync.Mutex // held by prepareMissed

	mu     sync.Mutex
	stmts  map[string]*sql.Stmt
	missed []string // run unprepared, to prepare once the connection is free
}

func newStmtCache(sqlDB *sql.DB) *stmtCache {
	return &stmtCache{db: sqlDB, stmts: make(map[string]*sql.Stmt)}
}

// inTx is a dbsqlc.DBTX that runs tx's queries on the statements prepared for their text.
func (c *stmtCache) inTx(tx *sql.Tx) dbsqlc.DBTX { return &cachedTx{Tx: tx, cache: c} }

// lookup is the statement prepared for query, or nil, noting it as missed.
func (c *stmtCache) lookup(query string) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	stmt, ok := c.stmts[query]
	if !ok && len(c.stmts)+len(c.missed) < maxPrepared && !slices.Contains(c.missed, query) {
		c.missed = append(c.missed, query)
	}
	return stmt
}

// prepareMissed prepares the statements that ran unprepared. It runs outside any transaction,
// when the one connection is free, and without the cache's lock, which a batch's transaction
// may wait on while it holds the connection; prepareMu keeps two of it from preparing one text
// twice. A failure leaves a statement unprepared: it will run so again.
func (c *stmtCache) prepareMissed(ctx context.Context) {
	if c == nil {
		return
	}
	c.prepareMu.Lock()
	defer c.prepareMu.Unlock()
	c.mu.Lock()
	missed := c.missed
	c.missed = nil
	c.mu.Unlock()
	for _, query := range missed {
		c.mu.Lock()
		_, prepared := c.stmts[query]
		c.mu.Unlock()
		if prepared {
			continue
		}
		stmt, err := c.db.PrepareContext(ctx, query) //nolint:sqlclosecheck // kept prepared: close closes it
		if err != nil {
			return
		}
		c.mu.Lock()
		c.stmts[query] = stmt
		c.mu.Unlock()
	}
}

// close closes the prepared statements (on a *sql.DB of the caller's, which stays open).
func (c *stmtCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, stmt := range c.stmts {
		_ = stmt.Close() // frees the statement; its failure leaves nothing behind
	}
	clear(c.stmts)
	c.missed = nil
}

// cachedTx is a transaction whose queries run on the statements its cache prepared.
type cachedTx struct {
	*sql.Tx
	cache *stmtCache
}

// QueryContext implements dbsqlc.DBTX. The transaction's copy of the statement is closed when
// the transaction ends; the one prepared on the connection stays prepared.
func (t *cachedTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	stmt := t.cache.lookup(query)
	if stmt == nil {
		return t.Tx.QueryContext(ctx, query, args...)
	}
	return t.Tx.StmtContext(ctx, stmt).QueryContext(ctx, args...) //nolint:sqlclosecheck // the transaction closes its statements when it ends
}

// RateLimitCounterConsumeBatch implements db.Counters in one transaction: the devices' check, then
// one upsert of every chain's first window, one of the second windows of the chains whose first
// admitted, one of the third, and one read of the users of the chains that admitted; then one
// commit for all. A failure rolls every chain back. No key is in two chains (db's Tables see to
// it), so a key's row in RETURNING is its chain's.
func (q *queries) RateLimitCounterConsumeBatch(ctx context.Context, chains []*db.RateLimitCounterChainParams) ([]*db.RateLimitCounterChainResult, error) {
	sqlDB, ok := q.dbtx.(*sql.DB)
	if !ok {
		return nil, errors.New("sqlite: a batch of checks runs on the engine's *sql.DB, in a transaction of its own")
	}
	tx, err := sqlDB.BeginTx(ctx, nil)
	if err != nil {
		return nil, failed("beginning a batch of rate limit checks", err)
	}
	defer q.stmts.prepareMissed(context.WithoutCancel(ctx))
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit; the failure that led here is returned
	var inTx dbsqlc.DBTX = tx
	if q.stmts != nil {
		inTx = q.stmts.inTx(tx)
	}

	results := make([]*db.RateLimitCounterChainResult, len(chains))
	for i := range results {
		results[i] = &db.RateLimitCounterChainResult{}
	}
	if err := batchDevices(ctx, inTx, chains, results); err != nil {
		return nil, err
	}

	live := make([]int, len(chains)) // the chains whose windows so far admitted
	for i := range live {
		live[i] = i
	}
	for position := range db.RateLimitChainMax {
		if live, err = batchUpsert(ctx, inTx, chains, results, live, position); err != nil {
			return nil, err
		}
		if len(live) == 0 {
			break
		}
	}
	if err := batchUsers(ctx, inTx, chains, results); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, failed("committing a batch of rate limit checks", err)
	}
	return results, nil
}

// batchDevices checks the chains' devices in one statement: a device stands while no revocation
// of its account is later than the one it was issued under.
func batchDevices(ctx context.Context, tx dbsqlc.DBTX, chains []*db.RateLimitCounterChainParams, results []*db.RateLimitCounterChainResult) error {
	var accounts [][]byte
	for _, chain := range chains {
		if chain.Device != nil {
			accounts = append(accounts, chain.Device.RevocationHash)
		}
	}
	if len(accounts) == 0 {
		return nil
	}
	rows, err := sqlc.RateLimitDeviceRevocationListTimes(ctx, tx, accounts)
	if err != nil {
		return failed("checking device revocations of a batch", err)
	}
	revokedAt := make(map[string]int64, len(rows))
	for _, row := range rows {
		revokedAt[string(row.KeyHash)] = row.RevokedAt
	}
	for i, chain := range chains {
		if chain.Device != nil {
			at, revoked := revokedAt[string(chain.Device.RevocationHash)]
			results[i].DeviceTrusted = !revoked || at <= us(chain.Device.Since)
		}
	}
	return nil
}

// batchUpsert spends the window at position of each live chain that has one, in one statement,
// and returns the chains whose window admitted and that have a window after it.
func batchUpsert(ctx context.Context, tx dbsqlc.DBTX, chains []*db.RateLimitCounterChainParams, results []*db.RateLimitCounterChainResult, live []int, position int) ([]int, error) {
	keys := make(map[string]int, len(live)) // key → chain
	args := make([]any, 0, 4*len(live))
	for _, i := range live {
		chain := chains[i]
		if position >= len(chain.Windows) {
			continue
		}
		w := chain.Windows[position]
		if results[i].DeviceTrusted && chain.Device.Window == position {
			w.KeyHash = chain.Device.KeyHash
		}
		keys[string(w.KeyHash)] = i
		args = append(args, w.KeyHash, us(w.WindowStart), us(w.WindowEnd), w.LimitCount)
	}
	if len(keys) == 0 {
		return nil, nil
	}

	rows, err := tx.QueryContext(ctx, upsertQuery(len(keys)), args...)
	if err != nil {
		return nil, failed("consuming rate limit counters of a batch", err)
	}
	defer rows.Close()

	next := live[:0:0]
	for rows.Next() {
		var key sql.RawBytes
		var count int64
		if err := rows.Scan(&key, &count); err != nil {
			return nil, failed("consuming rate limit counters of a batch", err)
		}
		i := keys[string(key)]
		results[i].Counts = append(results[i].Counts, count)
		if position+1 < len(chains[i].Windows) {
			next = append(next, i)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, failed("consuming rate limit counters of a batch", err)
	}
	return next, nil
}

// batchUsers reads, in one statement, the users of the chains that ask for one and whose every
// window admitted.
func batchUsers(ctx context.Context, tx dbsqlc.DBTX, chains []*db.RateLimitCounterChainParams, results []*db.RateLimitCounterChainResult) error {
	var emails []string
	for i, chain := range chains {
		if chain.UserEmail != "" && len(results[i].Counts) == len(chain.Windows) {
			emails = append(emails, chain.UserEmail)
		}
	}
	if len(emails) == 0 {
		return nil
	}
	rows, err := sqlc.UserListByEmails(ctx, tx, emails)
	if err != nil {
		return failed("getting users of a batch", err)
	}
	users := make(map[string]*db.User, len(rows))
	for _, row := range rows {
		u, _ := user(row, nil, "")
		users[u.Email] = u
	}
	for i, chain := range chains {
		if chain.UserEmail != "" && len(results[i].Counts) == len(chain.Windows) {
			results[i].User = users[chain.UserEmail]
		}
	}
	return nil
}
