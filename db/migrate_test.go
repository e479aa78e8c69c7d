package db_test

import (
	"context"
	"database/sql"
	"io/fs"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/email"
	"github.com/postguard/postguard/internal/dbtest"
)

// revision2 brings host's empty database to version of revision 2's history.
func revision2(t *testing.T, host *hostTables, version int64) {
	t.Helper()
	dbtest.MigrateRevision2(t, host.sqlDB, host.tables.Engine(), version)
}

// schema describes host's tables, their columns in order, their constraints and indexes, as the
// engine's catalog has them, but for goose's tables: two databases with equal schemas serve
// postguard's statements alike.
func schema(t *testing.T, host *hostTables) []string {
	t.Helper()
	var queries []string
	switch host.tables.Engine() {
	case "postgres":
		queries = []string{
			`SELECT c.relname || ' ' || coalesce(array_to_string(c.reloptions, ','), '') || ': ' || a.attnum || ' ' || a.attname || ' ' ||
				format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END ||
				coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '') || CASE WHEN a.attidentity <> '' THEN ' identity ' || a.attidentity::text ELSE '' END
			FROM pg_attribute a
			JOIN pg_class c ON c.oid = a.attrelid
			LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
			WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
			ORDER BY c.relname, a.attnum`,
			`SELECT conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
			FROM pg_constraint WHERE connamespace = current_schema()::regnamespace ORDER BY conrelid::regclass::text, conname`,
			`SELECT replace(indexdef, current_schema() || '.', '') FROM pg_indexes WHERE schemaname = current_schema() ORDER BY indexname`,
		}
	case "sqlite":
		queries = []string{
			// A table's statement as SQLite keeps it: columns added by ALTER TABLE are appended
			// to it, and a renamed table's name is quoted, so white space and quotes are dropped.
			`SELECT type || ' ' || name || ': ' || replace(sql, '"', '') FROM sqlite_master WHERE sql IS NOT NULL ORDER BY type, name`,
			`SELECT t.name || ': ' || c.cid || ' ' || c.name || ' ' || c.type || ' ' || c."notnull" || ' ' || coalesce(c.dflt_value, '') || ' ' || c.pk
			FROM sqlite_master t, pragma_table_info(t.name) c WHERE t.type = 'table' ORDER BY t.name, c.cid`,
			`SELECT t.name || ': ' || i.name || ' ' || i."unique" || ' ' || i.origin || ' ' || i.partial
			FROM sqlite_master t, pragma_index_list(t.name) i WHERE t.type = 'table' ORDER BY t.name, i.name`,
		}
	}
	space := regexp.MustCompile(`\s+`)
	var lines []string
	for _, query := range queries {
		func() {
			rows, err := host.sqlDB.QueryContext(t.Context(), query)
			require.NoError(t, err)
			defer rows.Close()
			for rows.Next() {
				var line string
				require.NoError(t, rows.Scan(&line))
				if !strings.Contains(line, "db_version") && !strings.Contains(line, "sqlite_sequence") {
					lines = append(lines, space.ReplaceAllString(line, ""))
				}
			}
			require.NoError(t, rows.Err())
		}()
	}
	require.NotEmpty(t, lines)
	return lines
}

// revision2Rows writes a row to every table of postguard's as revision 2 wrote them, in SQL of
// its schema (the statements of today write columns it did not have).
func revision2Rows(t *testing.T, host *hostTables) {
	t.Helper()
	ts := func(at time.Time) any { return at }
	if host.tables.Engine() == "sqlite" {
		ts = func(at time.Time) any { return at.UnixMicro() }
	}
	for _, row := range []struct {
		query string
		args  []any
	}{
		{`INSERT INTO users (email, name, password_hash, created_at, updated_at, locale) VALUES ('ada@example.com', 'Ada', 'hash', $1, $2, 'fr')`, // id 1, the first
			[]any{ts(now), ts(now)}},
		{`INSERT INTO email_tokens (token_hash, user_id, purpose, job_id, sealed, expires_at, created_at) VALUES ($1, 1, 'reset', 41, $2, $3, $4)`,
			[]any{tokenHash("token"), []byte("sealed"), ts(now.Add(time.Hour)), ts(now)}},
		{`INSERT INTO email_messages (job_id, kind, user_id, idempotency_key, key_created_at, status, provider_id, accepted_at, created_at, updated_at, sent_at, locale, payload_sha256)
			VALUES (41, 'password_reset_email', 1, 'password_reset_email:1:x', $1, 'sent', 're_41', $2, $3, $4, $5, 'fr', $6)`,
			[]any{ts(now), ts(now), ts(now), ts(now), ts(now), tokenHash("payload")}},
		{`INSERT INTO email_suppressions (address_hash, reason, detail, email_id, suppressed_at, created_at) VALUES ($1, 'bounced', 'General', 're_40', $2, $3)`,
			[]any{tokenHash("address"), ts(now), ts(now)}},
		{`INSERT INTO webhook_events (svix_id, received_at) VALUES ('msg_1', $1)`, []any{ts(now)}},
		{`INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count) VALUES ($1, $2, $3, 1, 5)`,
			[]any{tokenHash("key"), ts(now), ts(now.Add(time.Hour))}},
		{`INSERT INTO send_pacer (name, tat_us, interval_us) VALUES ('resend', 0, 1000000)`, nil},
		{`INSERT INTO readiness_heartbeat (id, beat_at) VALUES (1, $1)`, []any{ts(now)}},
	} {
		_, err := host.sqlDB.ExecContext(t.Context(), row.query, row.args...)
		require.NoError(t, err, row.query)
	}
}

// requireRevision2Rows checks every row revision2Rows wrote is there, as it was.
func requireRevision2Rows(ctx context.Context, t *testing.T, tables db.Tables) {
	t.Helper()
	user, err := tables.UserGetByEmail(ctx, "ada@example.com")
	require.NoError(t, err)
	require.Equal(t, "fr", user.Locale)
	token, err := tables.EmailTokenGetByJob(ctx, 41)
	require.NoError(t, err)
	require.Equal(t, user.ID, token.UserID)
	require.Equal(t, []byte("sealed"), token.Sealed)
	message, err := tables.EmailMessageGetByProviderID(ctx, "re_41")
	require.NoError(t, err)
	require.Equal(t, "fr", message.Locale)
	require.Equal(t, email.StatusSent, message.Status)
	_, err = tables.EmailSuppressionGet(ctx, tokenHash("address"))
	require.NoError(t, err)
	require.ErrorIs(t, tables.WebhookEventInsert(ctx, "msg_1", now), db.ErrExists)
	count, err := tables.RateLimitCounterGet(ctx, &db.RateLimitCounterGetParams{KeyHash: tokenHash("key"), WindowStart: now, WindowEnd: now.Add(time.Hour)})
	require.NoError(t, err)
	require.Equal(t, int64(1), count)
}

// gooseVersions are the versions a goose table records as applied, in order.
func gooseVersions(t *testing.T, sqlDB *sql.DB, table string) []int64 {
	t.Helper()
	rows, err := sqlDB.QueryContext(t.Context(), "SELECT version_id FROM "+table+" WHERE is_applied ORDER BY id")
	require.NoError(t, err)
	defer rows.Close()
	var versions []int64
	for rows.Next() {
		var version int64
		require.NoError(t, rows.Scan(&version))
		versions = append(versions, version)
	}
	require.NoError(t, rows.Err())
	return versions
}

func TestTables_MigrateTablesRevision2(t *testing.T) {
	t.Parallel()

	all := &db.MigrateOpts{Parts: db.Parts(), Revision2Table: db.Revision2GooseTable}

	hostEngines(t, func(t *testing.T, newHost func(t *testing.T) *hostTables) {
		// A database the new migrations made from nothing: what an upgraded one must equal.
		freshSchema := func(t *testing.T) []string {
			t.Helper()
			fresh := newHost(t)
			require.NoError(t, fresh.tables.MigrateTables(t.Context(), &db.MigrateOpts{Parts: db.Parts()}))
			return schema(t, fresh)
		}

		t.Run("UpgradesInPlace", func(t *testing.T) {
			t.Parallel()

			host := newHost(t)
			ctx := t.Context()
			revision2(t, host, 7)
			revision2Rows(t, host)
			revision2Versions := gooseVersions(t, host.sqlDB, db.Revision2GooseTable)

			behind, err := host.tables.MigrationsBehind(ctx, all)
			require.NoError(t, err)
			require.Equal(t, []string{"postguard's tables are as revision 2 migrated them (goose_db_version), before each part had a goose table of its own"}, behind)

			require.NoError(t, host.tables.MigrateTables(ctx, all))
			behind, err = host.tables.MigrationsBehind(ctx, all)
			require.NoError(t, err)
			require.Empty(t, behind)
			require.NoError(t, host.tables.MigrateTables(ctx, all), "idempotent")

			requireRevision2Rows(ctx, t, host.tables)
			require.Equal(t, freshSchema(t), schema(t, host), "an upgraded database is a new one")
			require.Equal(t, revision2Versions, gooseVersions(t, host.sqlDB, db.Revision2GooseTable), "revision 2's history is left as it was")
			for _, part := range db.Parts() {
				// The first migration recorded as applied, the later ones run: every one of the
				// part's files.
				files, err := fs.Glob(db.Migrations, "migrations/"+host.tables.Engine()+"/"+string(part)+"/*.sql")
				require.NoError(t, err)
				want := []int64{0}
				for i := range files {
					want = append(want, int64(i+1))
				}
				require.Equal(t, want, gooseVersions(t, host.sqlDB, part.GooseTable()), part)
			}
		})

		t.Run("UpgradesFromRevision1", func(t *testing.T) {
			t.Parallel()

			host := newHost(t)
			ctx := t.Context()
			revision2(t, host, 4) // revision 1's last
			if host.tables.Engine() == "postgres" {
				host.exec(t, "INSERT INTO users (email, password_hash) VALUES ('ada@example.com', 'hash')")
			} else {
				host.exec(t, "INSERT INTO users (email, password_hash, created_at, updated_at) VALUES ('ada@example.com', 'hash', 0, 0)")
			}

			require.NoError(t, host.tables.MigrateTables(ctx, all))
			_, err := host.tables.UserGetByEmail(ctx, "ada@example.com")
			require.NoError(t, err)
			require.Equal(t, freshSchema(t), schema(t, host))
			versions := gooseVersions(t, host.sqlDB, db.Revision2GooseTable)
			require.Equal(t, int64(7), versions[len(versions)-1], "brought to revision 2's last version first")
		})

		t.Run("AnotherAppsGooseTableIsLeftAlone", func(t *testing.T) {
			t.Parallel()

			// A host app's own goose history in goose_db_version, and no table of postguard's:
			// nothing to upgrade, whatever Revision2Table says.
			host := newHost(t)
			ctx := t.Context()
			host.exec(t, "CREATE TABLE goose_db_version (id INTEGER PRIMARY KEY, version_id BIGINT NOT NULL, is_applied BOOLEAN NOT NULL, tstamp TIMESTAMP)")
			host.exec(t, "INSERT INTO goose_db_version (id, version_id, is_applied) VALUES (1, 0, TRUE), (2, 1, TRUE)")

			behind, err := host.tables.MigrationsBehind(ctx, all)
			require.NoError(t, err)
			require.Len(t, behind, 3, "each part not migrated")
			require.NoError(t, host.tables.MigrateTables(ctx, all))
			require.Equal(t, []int64{0, 1}, gooseVersions(t, host.sqlDB, db.Revision2GooseTable))
			require.Equal(t, freshSchema(t), schema(t, host))
		})

		t.Run("WithoutRevision2TableNothingIsAdopted", func(t *testing.T) {
			t.Parallel()

			// Without Revision2Table, goose_db_version is never read: the revision-2 tables are
			// in the way of the parts' first migrations, and MigrateTables says so.
			host := newHost(t)
			ctx := t.Context()
			revision2(t, host, 7)
			err := host.tables.MigrateTables(ctx, &db.MigrateOpts{Parts: []db.Part{db.PartLimiter}})
			require.ErrorContains(t, err, "rate_limit_counters")
		})
	})
}

// The SQLite limiter's migrations 3 and 4 rebuild the counters: 3 as a rowid table whose new
// rows go at its end, 4 as one WITHOUT ROWID table in the order of the windows' ends. The
// counters a database holds come through both, and through 4's way down.
func TestMigrateTables_SQLiteCountersRebuilt(t *testing.T) {
	t.Parallel()

	ctx := t.Context()
	store := dbtest.NewSQLiteUnmigrated(t)
	sqlDB := store.SQLite.DB()
	migrations, err := fs.Sub(db.Migrations, "migrations/sqlite/limiter")
	require.NoError(t, err)
	provider, err := goose.NewProvider(goose.DialectSQLite3, sqlDB, migrations,
		goose.WithDisableGlobalRegistry(true), goose.WithTableName(db.PartLimiter.GooseTable()), goose.WithSlog(dbtest.Logger(t)))
	require.NoError(t, err)
	ddl := func() string {
		t.Helper()
		var ddl string
		require.NoError(t, sqlDB.QueryRowContext(ctx, `SELECT sql FROM sqlite_master WHERE name = 'rate_limit_counters'`).Scan(&ddl))
		return ddl
	}
	indexes := func() int {
		t.Helper()
		var n int
		require.NoError(t, sqlDB.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'rate_limit_counters'`).Scan(&n))
		return n
	}

	// Version 2's table, written as version 2's statements did: a counter at 2 and an expired one.
	_, err = provider.UpTo(ctx, 2)
	require.NoError(t, err)
	require.Contains(t, ddl(), "WITHOUT ROWID", "version 2's table")
	kept := &db.RateLimitCounterConsumeParams{KeyHash: tokenHash("kept"), WindowStart: now, WindowEnd: now.Add(time.Hour), LimitCount: 5}
	expired := &db.RateLimitCounterConsumeParams{KeyHash: tokenHash("expired"), WindowStart: now.Add(-2 * time.Hour), WindowEnd: now.Add(-time.Hour), LimitCount: 5}
	for _, c := range []struct {
		params *db.RateLimitCounterConsumeParams
		count  int
	}{{kept, 2}, {expired, 1}} {
		_, err := sqlDB.ExecContext(ctx, `INSERT INTO rate_limit_counters (key_hash, window_start, window_end, count, limit_count) VALUES (?, ?, ?, ?, ?)`,
			c.params.KeyHash, c.params.WindowStart.UnixMicro(), c.params.WindowEnd.UnixMicro(), c.count, c.params.LimitCount)
		require.NoError(t, err)
	}
	counted := func() {
		t.Helper()
		count, err := store.RateLimitCounterGet(ctx, &db.RateLimitCounterGetParams{KeyHash: kept.KeyHash, WindowStart: kept.WindowStart, WindowEnd: kept.WindowEnd})
		require.NoError(t, err)
		require.Equal(t, int64(2), count, "the counter came through the rebuild")
	}

	_, err = provider.UpTo(ctx, 3)
	require.NoError(t, err)
	require.NotContains(t, ddl(), "WITHOUT ROWID", "version 3's rowid table")
	require.Equal(t, 2, indexes(), "the primary key's and window_end's")

	require.NoError(t, store.MigrateTables(ctx, &db.MigrateOpts{Parts: []db.Part{db.PartLimiter}}))
	require.Contains(t, ddl(), "PRIMARY KEY (window_end, key_hash, window_start)")
	require.Contains(t, ddl(), "WITHOUT ROWID")
	require.Zero(t, indexes(), "the table is its only B-tree")
	counted()

	// Prune (queries/sqlite/rate_limit_counters.sql's RateLimitCounterDeleteExpired) reads the
	// front of the table, in its primary key's order, and deletes what it read by that key: no
	// other index, no sort, no scan.
	var plan strings.Builder
	rows, err := sqlDB.QueryContext(ctx, `EXPLAIN QUERY PLAN
		DELETE FROM rate_limit_counters
		WHERE (window_end, key_hash, window_start) IN (
			SELECT c.window_end, c.key_hash, c.window_start
			FROM rate_limit_counters AS c
			WHERE c.window_end < ?
			ORDER BY c.window_end
			LIMIT ?
		)`, now.UnixMicro(), 100)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var id, parent, unused int
		var detail string
		require.NoError(t, rows.Scan(&id, &parent, &unused, &detail))
		plan.WriteString(detail + "\n")
	}
	require.NoError(t, rows.Err())
	require.Contains(t, plan.String(), "SEARCH rate_limit_counters USING PRIMARY KEY (window_end=? AND key_hash=? AND window_start=?)\n")
	require.Contains(t, plan.String(), "SEARCH c USING PRIMARY KEY (window_end<?)\n")
	require.NotContains(t, plan.String(), "SCAN")
	require.NotContains(t, plan.String(), "TEMP B-TREE")

	deleted, err := store.RateLimitCounterDeleteExpired(ctx, now, 100)
	require.NoError(t, err)
	require.Equal(t, int64(1), deleted, "the expired counter")
	count, ok, err := store.RateLimitCounterConsume(ctx, kept)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(3), count, "and counts on")

	// Down to version 3: the rowid table again, its counters with it.
	_, err = provider.DownTo(ctx, 3)
	require.NoError(t, err)
	require.NotContains(t, ddl(), "WITHOUT ROWID")
	require.Equal(t, 2, indexes())
	var n int64
	require.NoError(t, sqlDB.QueryRowContext(ctx, `SELECT count FROM rate_limit_counters WHERE key_hash = ? AND window_start = ?`, kept.KeyHash, kept.WindowStart.UnixMicro()).Scan(&n))
	require.Equal(t, int64(3), n)
}
