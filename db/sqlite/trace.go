package sqlite

import (
	"context"
	"database/sql"

	"github.com/postguard/postguard/db/sqlite/dbsqlc"
)

// QueryTracer is told of each of the app's statements an Engine runs through its Queries (the
// rate limiter's counters excepted, which the Limiter's own trace covers, and River's, which go
// to the *sql.DB without this package), as pgx's QueryTracer is on PostgreSQL: TraceQueryStart
// before the statement, with its SQL (sqlc's, "-- name: UserInsert :one" first), and TraceQueryEnd
// with the context it returned once the statement ran (for a query, once its rows are ready to
// read, not read). It is given no argument of the statement.
type QueryTracer interface {
	TraceQueryStart(ctx context.Context, sql string) context.Context
	TraceQueryEnd(ctx context.Context, err error)
}

// tracedDBTX runs sqlc's statements on dbtx, telling tracer of each.
type tracedDBTX struct {
	dbtx   dbsqlc.DBTX
	tracer QueryTracer
}

// traced is dbtx with e's tracer told of its statements; dbtx itself without a tracer.
func (e *Engine) traced(dbtx dbsqlc.DBTX) dbsqlc.DBTX {
	if e.tracer == nil {
		return dbtx
	}
	return &tracedDBTX{dbtx: dbtx, tracer: e.tracer}
}

func (t *tracedDBTX) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	ctx = t.tracer.TraceQueryStart(ctx, query)
	result, err := t.dbtx.ExecContext(ctx, query, args...)
	t.tracer.TraceQueryEnd(ctx, err)
	return result, err
}

func (t *tracedDBTX) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	return t.dbtx.PrepareContext(ctx, query)
}

func (t *tracedDBTX) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	ctx = t.tracer.TraceQueryStart(ctx, query)
	rows, err := t.dbtx.QueryContext(ctx, query, args...)
	t.tracer.TraceQueryEnd(ctx, err)
	return rows, err
}

func (t *tracedDBTX) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	ctx = t.tracer.TraceQueryStart(ctx, query)
	row := t.dbtx.QueryRowContext(ctx, query, args...)
	t.tracer.TraceQueryEnd(ctx, row.Err())
	return row
}
