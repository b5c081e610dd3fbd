package testenv

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// StatementCounter is a pgx tracer, for a pool's ConnConfig.Tracer, that
// counts the statements (round trips) sent to PostgreSQL: one per Query,
// QueryRow or Exec (BEGIN and COMMIT included), one per batch. Prepares
// done once per connection by the statement cache are not counted. The
// zero value counts every statement.
type StatementCounter struct {
	// Skip, when set, leaves out the statements sent on their own whose
	// SQL it reports true for (a batch always counts): a statement that
	// belongs to no operation under test, such as a one-time settings read.
	Skip func(sql string) bool

	n atomic.Int64
}

var (
	_ pgx.QueryTracer = (*StatementCounter)(nil)
	_ pgx.BatchTracer = (*StatementCounter)(nil)
)

// Count returns the statements counted since the pool was made or since
// the last [StatementCounter.Reset].
func (c *StatementCounter) Count() int64 { return c.n.Load() }

// Reset sets the count back to zero.
func (c *StatementCounter) Reset() { c.n.Store(0) }

// TraceQueryStart counts a statement, unless Skip leaves it out.
func (c *StatementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if c.Skip == nil || !c.Skip(d.SQL) {
		c.n.Add(1)
	}
	return ctx
}

// TraceQueryEnd does nothing.
func (c *StatementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart counts a batch as one round trip.
func (c *StatementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}

// TraceBatchQuery does nothing: the batch was counted.
func (c *StatementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd does nothing.
func (c *StatementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
