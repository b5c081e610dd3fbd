package main

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// counts is a snapshot of the statement and command counters.
type counts struct {
	sql    int64 // statements (round trips) to PostgreSQL, sweeps excluded
	claims int64 // of which durable claims (INSERT ... ON CONFLICT, or Do's record INSERT)
	sweeps int64 // Sweep statements
	redis  int64 // Redis commands
	opens  int64 // times the Redis breaker of the Redis Claimer opened
}

func (c counts) sub(o counts) counts {
	return counts{sql: c.sql - o.sql, claims: c.claims - o.claims, sweeps: c.sweeps - o.sweeps, redis: c.redis - o.redis,
		opens: c.opens - o.opens}
}

func (c counts) add(o counts) counts {
	return counts{sql: c.sql + o.sql, claims: c.claims + o.claims, sweeps: c.sweeps + o.sweeps, redis: c.redis + o.redis,
		opens: c.opens + o.opens}
}

// recorder records what a counter sees while capturing: the statements or
// the commands one function sends.
type recorder[T any] struct {
	capturing atomic.Bool
	mu        sync.Mutex
	captured  []T
	// answered holds the indexes in captured of the records answered so
	// far (answer), for a counter that sees the answers.
	answered map[int]bool
}

// record appends what v returns (a copy of what the counter sees), while
// capturing only, and returns its index in the capture (-1: none).
func (r *recorder[T]) record(v func() T) int {
	if !r.capturing.Load() {
		return -1
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.captured = append(r.captured, v())
	return len(r.captured) - 1
}

// answer notes that the record i (from record) was answered.
func (r *recorder[T]) answer(i int) {
	if i < 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answered == nil {
		r.answered = map[int]bool{}
	}
	r.answered[i] = true
}

// answeredSoFar returns the indexes of the records answered so far in
// this capture.
func (r *recorder[T]) answeredSoFar() map[int]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[int]bool, len(r.answered))
	for i := range r.answered {
		out[i] = true
	}
	return out
}

// seen reports whether anything recorded so far in this capture satisfies
// ok.
func (r *recorder[T]) seen(ok func(T) bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, v := range r.captured {
		if ok(v) {
			return true
		}
	}
	return false
}

// capture records what fn sends.
func (r *recorder[T]) capture(fn func() error) ([]T, error) {
	r.mu.Lock()
	r.captured, r.answered = nil, nil
	r.mu.Unlock()
	r.capturing.Store(true)
	err := fn()
	r.capturing.Store(false)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.captured, err
}

// sqlCounter is a pgx tracer counting statements: one per Query, QueryRow
// or Exec (BEGIN and COMMIT included), one per batch. While capturing, it
// also records each statement's text and arguments.
type sqlCounter struct {
	sql, claims, sweeps atomic.Int64

	recorder[pgx.TraceQueryStartData]

	// commits, when set, sees each completion become durable (watchCommit).
	commits atomic.Pointer[commitWatch]
}

// commitWatch notes when a completion (a statement setting a record's
// state to completed, or, as Do sends it since issue 44, the record's
// INSERT as finished, pipelined with the COMMIT) is durable: at the end of
// the statement or batch after which the connection that sent it is no
// longer in a transaction (the statement itself, sent alone; or the COMMIT
// of the transaction it was sent in). That is when the holder's commit returned, before any
// Redis step the library takes after it.
type commitWatch struct {
	mu    sync.Mutex
	armed map[*pgx.Conn]bool
	at    time.Time // the first completion seen durable
}

// watchCommit starts watching for completions; stop ends it and returns
// when the first one became durable (zero: none was seen).
func (c *sqlCounter) watchCommit() (stop func() time.Time) {
	w := &commitWatch{armed: map[*pgx.Conn]bool{}}
	c.commits.Store(w)
	return func() time.Time {
		c.commits.CompareAndSwap(w, nil)
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.at
	}
}

// isCompletionSQL tells the store's completion apart.
func isCompletionSQL(sql string) bool { return strings.Contains(sql, "SET state = 'completed'") }

// started arms the watch for conn when it sends a completion, or the
// record's INSERT as finished.
func (c *sqlCounter) started(conn *pgx.Conn, sql string) {
	if w := c.commits.Load(); w != nil && conn != nil && (isCompletionSQL(sql) || isInsertAtCommitSQL(sql)) {
		w.mu.Lock()
		w.armed[conn] = true
		w.mu.Unlock()
	}
}

// ended notes the time when conn, armed, has left its transaction.
func (c *sqlCounter) ended(conn *pgx.Conn) {
	w := c.commits.Load()
	if w == nil || conn == nil {
		return
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.armed[conn] && conn.PgConn().TxStatus() == 'I' {
		delete(w.armed, conn)
		if w.at.IsZero() {
			w.at = now
		}
	}
}

var (
	_ pgx.QueryTracer = (*sqlCounter)(nil)
	_ pgx.BatchTracer = (*sqlCounter)(nil)
)

// isClaimSQL tells the durable claim apart from other statements.
func isClaimSQL(sql string) bool { return strings.Contains(sql, "ON CONFLICT") }

// isInsertAtCommitSQL tells Do's record INSERT (sent with the COMMIT) apart:
// an INSERT of the record with no ON CONFLICT.
func isInsertAtCommitSQL(sql string) bool {
	return strings.Contains(sql, "INSERT INTO") && strings.Contains(sql, "operation_digest") && !isClaimSQL(sql)
}

// isSweepSQL tells a Sweep (a DELETE of expired rows) apart.
func isSweepSQL(sql string) bool {
	return strings.HasPrefix(sql, "WITH v AS") && strings.Contains(sql, "DELETE FROM")
}

func (c *sqlCounter) count(sql string) {
	switch {
	case isSweepSQL(sql):
		c.sweeps.Add(1)
		return
	case isClaimSQL(sql), isInsertAtCommitSQL(sql):
		c.claims.Add(1)
	}
	c.sql.Add(1)
}

// recordStmt records a statement's text and a copy of its arguments,
// while capturing only.
func (c *sqlCounter) recordStmt(sql string, args []any) {
	c.record(func() pgx.TraceQueryStartData {
		return pgx.TraceQueryStartData{SQL: sql, Args: append([]any(nil), args...)}
	})
}

// TraceQueryStart counts a statement.
func (c *sqlCounter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.count(d.SQL)
	c.recordStmt(d.SQL, d.Args)
	c.started(conn, d.SQL)
	return ctx
}

// TraceQueryEnd tells a commit watch that the statement ended.
func (c *sqlCounter) TraceQueryEnd(_ context.Context, conn *pgx.Conn, _ pgx.TraceQueryEndData) {
	c.ended(conn)
}

// TraceBatchStart counts a batch as one round trip.
func (c *sqlCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.sql.Add(1)
	return ctx
}

// TraceBatchQuery counts a claim sent in a batch, and records the statement
// while capturing.
func (c *sqlCounter) TraceBatchQuery(_ context.Context, conn *pgx.Conn, d pgx.TraceBatchQueryData) {
	if isClaimSQL(d.SQL) || isInsertAtCommitSQL(d.SQL) {
		c.claims.Add(1)
	}
	c.recordStmt(d.SQL, d.Args)
	c.started(conn, d.SQL)
}

// TraceBatchEnd tells a commit watch that the batch ended.
func (c *sqlCounter) TraceBatchEnd(_ context.Context, conn *pgx.Conn, _ pgx.TraceBatchEndData) {
	c.ended(conn)
}

// redisCounter is a go-redis hook counting commands (each command of a
// pipeline counts). While capturing, it records each command's arguments.
type redisCounter struct {
	n atomic.Int64

	recorder[[]any]
}

var _ redis.Hook = (*redisCounter)(nil)

// DialHook passes dials through.
func (c *redisCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

// ProcessHook counts one command, and while capturing records it and
// notes when it was answered.
func (c *redisCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		i := c.record(func() []any { return append([]any(nil), cmd.Args()...) })
		err := next(ctx, cmd)
		c.answer(i)
		return err
	}
}

// ProcessPipelineHook counts every command of the pipeline.
func (c *redisCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}
