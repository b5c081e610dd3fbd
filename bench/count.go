package main

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"

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
}

// record appends what v returns (a copy of what the counter sees), while
// capturing only.
func (r *recorder[T]) record(v func() T) {
	if r.capturing.Load() {
		r.mu.Lock()
		r.captured = append(r.captured, v())
		r.mu.Unlock()
	}
}

// capture records what fn sends.
func (r *recorder[T]) capture(fn func() error) ([]T, error) {
	r.mu.Lock()
	r.captured = nil
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
func (c *sqlCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.count(d.SQL)
	c.recordStmt(d.SQL, d.Args)
	return ctx
}

// TraceQueryEnd does nothing.
func (c *sqlCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart counts a batch as one round trip.
func (c *sqlCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.sql.Add(1)
	return ctx
}

// TraceBatchQuery counts a claim sent in a batch, and records the statement
// while capturing.
func (c *sqlCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if isClaimSQL(d.SQL) || isInsertAtCommitSQL(d.SQL) {
		c.claims.Add(1)
	}
	c.recordStmt(d.SQL, d.Args)
}

// TraceBatchEnd does nothing.
func (c *sqlCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

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

// ProcessHook counts one command.
func (c *redisCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		c.record(func() []any { return append([]any(nil), cmd.Args()...) })
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts every command of the pipeline.
func (c *redisCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}
