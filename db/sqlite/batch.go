package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"

	"github.com/postguard/postguard/db"
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
	upsertTail = " ON CONFLICT (key_hash, window_start) DO UPDATE" +
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

// maxPreparedUpsert is the largest upsert kept prepared: a batch of db.DefaultCounterBatchMax.
const maxPreparedUpsert = db.DefaultCounterBatchMax

// upserts are the batch's upserts prepared once on the engine's *sql.DB, one per size, so that a
// batch does not prepare its statements anew: a transaction's StmtContext takes the one prepared
// on its connection. They are prepared before the batch's transaction begins (the one connection
// is free then), up to the batch's size, the first time a batch is that large.
type upserts struct {
	db *sql.DB

	mu    sync.Mutex
	stmts []*sql.Stmt // stmts[n-1] upserts n rows
}

// prepare prepares the upserts of up to n rows not prepared yet.
func (u *upserts) prepare(ctx context.Context, n int) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	for size := len(u.stmts) + 1; size <= min(n, maxPreparedUpsert); size++ {
		stmt, err := u.db.PrepareContext(ctx, upsertQuery(size)) //nolint:sqlclosecheck // kept prepared: close closes it
		if err != nil {
			return failed("preparing a batch of rate limit checks", err)
		}
		u.stmts = append(u.stmts, stmt)
	}
	return nil
}

// close closes the prepared upserts (on a *sql.DB of the caller's, which stays open).
func (u *upserts) close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, stmt := range u.stmts {
		_ = stmt.Close() // frees the statement; its failure leaves nothing behind
	}
	u.stmts = nil
}

// stmt is the prepared upsert of n rows, nil when it is not prepared.
func (u *upserts) stmt(n int) *sql.Stmt {
	if u == nil {
		return nil
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if n > len(u.stmts) {
		return nil
	}
	return u.stmts[n-1]
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
	if q.upserts != nil {
		if err := q.upserts.prepare(ctx, len(chains)); err != nil {
			return nil, err
		}
	}
	tx, err := sqlDB.BeginTx(ctx, nil)
	if err != nil {
		return nil, failed("beginning a batch of rate limit checks", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit; the failure that led here is returned

	results := make([]*db.RateLimitCounterChainResult, len(chains))
	for i := range results {
		results[i] = &db.RateLimitCounterChainResult{}
	}
	if err := batchDevices(ctx, tx, chains, results); err != nil {
		return nil, err
	}

	live := make([]int, len(chains)) // the chains whose windows so far admitted
	for i := range live {
		live[i] = i
	}
	for position := range db.RateLimitChainMax {
		if live, err = batchUpsert(ctx, tx, q.upserts, chains, results, live, position); err != nil {
			return nil, err
		}
		if len(live) == 0 {
			break
		}
	}
	if err := batchUsers(ctx, tx, chains, results); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, failed("committing a batch of rate limit checks", err)
	}
	return results, nil
}

// batchDevices checks the chains' devices in one statement: a device stands while no revocation
// of its account is later than the one it was issued under.
func batchDevices(ctx context.Context, tx *sql.Tx, chains []*db.RateLimitCounterChainParams, results []*db.RateLimitCounterChainResult) error {
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
func batchUpsert(ctx context.Context, tx *sql.Tx, prepared *upserts, chains []*db.RateLimitCounterChainParams, results []*db.RateLimitCounterChainResult, live []int, position int) ([]int, error) {
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

	var rows *sql.Rows
	var err error
	if stmt := prepared.stmt(len(keys)); stmt != nil {
		// The transaction's statement is the one prepared on its connection: closing it leaves
		// that one prepared.
		inTx := tx.StmtContext(ctx, stmt)
		defer inTx.Close()
		rows, err = inTx.QueryContext(ctx, args...)
	} else {
		rows, err = tx.QueryContext(ctx, upsertQuery(len(keys)), args...)
	}
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
func batchUsers(ctx context.Context, tx *sql.Tx, chains []*db.RateLimitCounterChainParams, results []*db.RateLimitCounterChainResult) error {
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
