package claim_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/lua"
	"github.com/oncekey/oncekey/testkit/redisproc"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// The black-box tests of how often Do runs fn, per operation, in the cases
// Redis cannot stop a duplicate. Each runs twice: claiming first (the
// default) fn runs exactly once per record life, and never for a mismatch or
// a held key; with WithWriteAtCommit the business write still commits once,
// but fn may run more (its documented trade-off). The counts are logged.

// doMode is one way Do can be configured.
type doMode struct {
	name     string
	atCommit bool
}

// doModes are the two: claiming first (the default) and WithWriteAtCommit.
var doModes = []doMode{{"ClaimFirst", false}, {"WriteAtCommit", true}}

// forDoModes runs test as a parallel subtest in each of doModes.
func forDoModes(t *testing.T, test func(t *testing.T, m doMode)) {
	for _, m := range doModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			test(t, m)
		})
	}
}

// opts returns the options of m, then more.
func (m doMode) opts(more ...claim.Option) []claim.Option {
	if m.atCommit {
		return append([]claim.Option{claim.WithWriteAtCommit()}, more...)
	}
	return more
}

// countedFn is a Do function that counts its runs and writes one order.
// Its first run holds its transaction open until hold says the duplicates
// reached the database (or a bound passes), so that they are in flight
// together: the hold widens the window, nothing is asserted on time.
type countedFn struct {
	e    *env
	runs atomic.Int64
	body string
	hold func(ctx context.Context, runs *atomic.Int64)
	once sync.Once
}

func (f *countedFn) fn(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) {
	f.runs.Add(1)
	if f.hold != nil {
		f.once.Do(func() { f.hold(ctx, &f.runs) })
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+f.e.schema.Name+`.orders (op, n) VALUES ($1, 1)`, op.ID); err != nil {
		return durable.Result{}, err
	}
	body := f.body
	if body == "" {
		body = `{"order":"` + op.ID + `"}`
	}
	return result(body), nil
}

// untilInFlight returns a hold that waits until want duplicates are in
// flight: waiting on a lock in the test's schema (a claim waiting on the
// claimed row, or an insert at commit waiting on the winner's), or running
// fn themselves. It gives up after 10s: the test then checks the counts of
// whatever overlapped.
func (e *env) untilInFlight(want int) func(context.Context, *atomic.Int64) {
	return func(ctx context.Context, runs *atomic.Int64) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			var waiting int
			err := e.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND position($1 in query) > 0`,
				e.schema.Name+".").Scan(&waiting)
			if err != nil || waiting+int(runs.Load()-1) >= want {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		e.t.Logf("only some duplicates were in flight after 10s")
	}
}

// widePool returns a store on the env's schema over a pool of n
// connections, so that n-1 duplicates can wait in the database at once.
func (e *env) widePool(n int32) durable.Store[pgx.Tx] {
	e.t.Helper()
	cfg := poolConfig(e.t, e.schema.URL)
	cfg.MaxConns = n
	pool, err := pgxpool.NewWithConfig(e.t.Context(), cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(pool.Close)
	st, err := postgres.New(pool, postgres.WithSchema(e.schema.Name))
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

type doAnswer struct {
	out claim.Outcome
	err error
}

// doAll runs n Do calls of r at once and returns their answers.
func doAll(c *claim.Claimer[pgx.Tx], r claim.Request, n int, fn func(context.Context, pgx.Tx, claim.Op) (durable.Result, error)) []doAnswer {
	answers := make([]doAnswer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range answers {
		wg.Go(func() {
			<-start
			answers[i].out, answers[i].err = c.Do(context.Background(), r, fn)
		})
	}
	close(start)
	wg.Wait()
	return answers
}

// doInTurn runs n Do calls of r one after the other, between (when not
// nil) before each but the first, and returns their answers.
func doInTurn(t *testing.T, c *claim.Claimer[pgx.Tx], r claim.Request, n int, fn func(context.Context, pgx.Tx, claim.Op) (durable.Result, error), between func()) []doAnswer {
	answers := make([]doAnswer, n)
	for i := range answers {
		if i > 0 && between != nil {
			between()
		}
		answers[i].out, answers[i].err = c.Do(t.Context(), r, fn)
	}
	return answers
}

// wantNoRun logs the runs of f for a request it must not run for (what
// says which, and why), and fails t if claiming first it ran at all.
func wantNoRun(t *testing.T, m doMode, f *countedFn, what string) {
	t.Helper()
	runs := f.runs.Load()
	t.Logf("%s: fn ran %d times %s (business writes committed: 0)", m.name, runs, what)
	if !m.atCommit && runs != 0 {
		t.Fatalf("fn ran %d times %s; want 0", runs, what)
	}
}

// wantRunOnce checks what both modes promise for answers of one operation
// (every answer Executed or Replayed with the one committed result, one
// business write), then the runs of fn: exactly one claiming first; with
// the write at commit at least one.
func wantRunOnce(t *testing.T, e *env, m doMode, f *countedFn, answers []doAnswer) {
	t.Helper()
	executed, op, body := 0, "", ""
	for i, a := range answers {
		if a.err != nil {
			t.Fatalf("answer %d: %v", i, a.err)
		}
		switch a.out.Kind {
		case claim.Executed:
			executed++
		case claim.Replayed:
		default:
			t.Fatalf("answer %d = %v, want Executed or Replayed", i, a.out.Kind)
		}
		if body == "" {
			op, body = a.out.OperationID, string(a.out.Result.Body)
		} else if string(a.out.Result.Body) != body {
			t.Fatalf("answer %d has another result than answer 0", i)
		}
	}
	if executed > 1 {
		t.Fatalf("%d answers Executed; at most one may be", executed)
	}
	e.wantOrders(t, op, 1)
	runs := f.runs.Load()
	t.Logf("%s: fn ran %d times for %d requests of one operation (business writes committed: 1)", m.name, runs, len(answers))
	if !m.atCommit && runs != 1 {
		t.Fatalf("fn ran %d times; claiming first it runs exactly once per record life", runs)
	}
	if m.atCommit && runs < 1 {
		t.Fatalf("fn ran %d times; the committed result must come from a run", runs)
	}
}

// concurrentDuplicates runs n duplicates of one key at once through c and
// checks the runs of fn.
func concurrentDuplicates(t *testing.T, e *env, m doMode, c *claim.Claimer[pgx.Tx], n, inFlight int) {
	f := &countedFn{e: e, hold: e.untilInFlight(inFlight)}
	wantRunOnce(t, e, m, f, doAll(c, req("storm", "v1:a"), n, f.fn))
}

// Without Redis, 100 duplicates at once (over 16 connections: 15 wait in
// the database while the first holds the key).
func TestClaimer_DoRunsOnce_NoRedis(t *testing.T) {
	t.Parallel()
	forDoModes(t, func(t *testing.T, m doMode) {
		e := setup(t, withoutRed)
		e.orders()
		c := e.newClaimer(e.widePool(16), m.opts()...)
		concurrentDuplicates(t, e, m, c, 100, 15)
	})
}

// Redis down: nothing listens on its address (the breaker opens after its
// default 5 failures), 50 duplicates at once.
func TestClaimer_DoRunsOnce_RedisDown(t *testing.T) {
	t.Parallel()
	forDoModes(t, func(t *testing.T, m doMode) {
		e := setup(t, withoutRed)
		e.orders()
		c, err := claim.New[pgx.Tx](e.widePool(16), m.opts(claim.WithRedis(deadRedis(t), lua.Options{Prefix: e.schema.Name}))...)
		if err != nil {
			t.Fatal(err)
		}
		concurrentDuplicates(t, e, m, c, 50, 15)
	})
}

// redisFault is how a Redis of its own fails while the first request runs
// fn: then 20 duplicates arrive. It runs on a client that ignores context
// deadlines (go-redis's default) and on one that honors them, whose calls
// beyond 4 in flight queue for a pipeline.
func doRunsOnceWhileRedisFails(t *testing.T, fail func(t *testing.T, srv *redisproc.Server)) {
	for _, ctxTimeouts := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", ctxTimeouts), func(t *testing.T) {
			doRunsOnceWhileRedisFailsOn(t, ctxTimeouts, fail)
		})
	}
}

func doRunsOnceWhileRedisFailsOn(t *testing.T, ctxTimeouts bool, fail func(t *testing.T, srv *redisproc.Server)) {
	forDoModes(t, func(t *testing.T, m doMode) {
		srv := redisproc.Start(t, redisproc.Options{})
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialTimeout: 100 * time.Millisecond,
			ContextTimeoutEnabled: ctxTimeouts})
		t.Cleanup(func() { rdb.Close() })
		e := setup(t, withoutRed)
		e.orders()
		c, err := claim.New[pgx.Tx](e.widePool(24), m.opts(claim.WithRedis(rdb, lua.Options{Prefix: e.schema.Name, Timeout: 100 * time.Millisecond}))...)
		if err != nil {
			t.Fatal(err)
		}
		const dups = 20
		r := req("redis-fails", "v1:a")
		f := &countedFn{e: e}
		inFlight := e.untilInFlight(dups)
		later := make(chan []doAnswer, 1)
		f.hold = func(ctx context.Context, runs *atomic.Int64) {
			// The first request got its claim through Redis; now Redis
			// fails, and the duplicates arrive while fn runs.
			fail(t, srv)
			go func() { later <- doAll(c, r, dups, f.fn) }()
			inFlight(ctx, runs)
		}
		first, err := c.Do(t.Context(), r, f.fn)
		wantRunOnce(t, e, m, f, append([]doAnswer{{first, err}}, <-later...))
		if !m.atCommit && first.Kind != claim.Executed {
			t.Fatalf("first = %v; want Executed (it holds the claim)", first.Kind)
		}
	})
}

// Redis killed while the first request runs fn.
func TestClaimer_DoRunsOnce_RedisKilled(t *testing.T) {
	t.Parallel()
	doRunsOnceWhileRedisFails(t, func(t *testing.T, srv *redisproc.Server) { srv.Kill() })
}

// Redis frozen (SIGSTOP: connections accepted, nothing answered) while the
// first request runs fn.
func TestClaimer_DoRunsOnce_RedisFrozen(t *testing.T) {
	t.Parallel()
	doRunsOnceWhileRedisFails(t, func(t *testing.T, srv *redisproc.Server) {
		if err := srv.Pause(); err != nil {
			t.Error(err)
		}
	})
}

// Redis emptied (the test's keys deleted) before each of 5 retries of a
// finished operation.
func TestClaimer_DoRunsOnce_RedisEmptied(t *testing.T) {
	t.Parallel()
	forDoModes(t, func(t *testing.T, m doMode) {
		e := setup(t, withRedis, m.opts()...)
		e.orders()
		f := &countedFn{e: e}
		r := req("emptied", "v1:a")
		wantRunOnce(t, e, m, f, doInTurn(t, e.c, r, 6, f.fn, e.flushRedis))
	})
}

// A result larger than MaxCachedBody is never cached in Redis: 5 retries
// after the first run replay it from the database.
func TestClaimer_DoRunsOnce_LargeResult(t *testing.T) {
	t.Parallel()
	forDoModes(t, func(t *testing.T, m doMode) {
		e := setup(t, withoutRed)
		e.orders()
		e.rdb, e.prefix = testenv.Redis(t)
		c := e.newClaimer(e.store, m.opts(claim.WithRedis(e.rdb, lua.Options{Prefix: e.prefix, Timeout: time.Second, MaxCachedBody: 1024}))...)
		f := &countedFn{e: e, body: `"` + strings.Repeat("x", 4096) + `"`}
		r := req("large", "v1:a")
		wantRunOnce(t, e, m, f, doInTurn(t, c, r, 6, f.fn, nil))
	})
}

// A request of another payload for a finished key Redis no longer knows is
// a mismatch: claiming first, fn never runs for it; with the write at
// commit it runs and its write rolls back.
func TestClaimer_DoRunsOnce_MismatchRunsNothing(t *testing.T) {
	t.Parallel()
	forDoModes(t, func(t *testing.T, m doMode) {
		e := setup(t, withRedis, m.opts()...)
		e.orders()
		first := &countedFn{e: e}
		out, err := e.c.Do(t.Context(), req("mismatch", "v1:a"), first.fn)
		if err != nil || out.Kind != claim.Executed {
			t.Fatalf("first = %v, %v", out.Kind, err)
		}
		e.flushRedis()
		other := &countedFn{e: e}
		if _, err := e.c.Do(t.Context(), req("mismatch", "v1:other"), other.fn); !errors.Is(err, claim.ErrMismatch) {
			t.Fatalf("another payload = %v; want ErrMismatch", err)
		}
		e.wantOrders(t, out.OperationID, 1)
		wantNoRun(t, m, other, "for the mismatching request")
	})
}

// A key another worker's Lease holds, which Redis no longer knows, is in
// progress: claiming first, fn never runs for it.
func TestClaimer_DoRunsOnce_HeldKeyRunsNothing(t *testing.T) {
	t.Parallel()
	forDoModes(t, func(t *testing.T, m doMode) {
		e := setup(t, withRedis, m.opts()...)
		e.orders()
		r := req("held-by-lease", "v1:a")
		lease := mustClaim(t, e.c, r, claim.Acquired).Lease
		e.flushRedis()
		f := &countedFn{e: e}
		out, err := e.c.Do(t.Context(), r, f.fn)
		if err != nil || out.Kind != claim.InProgress {
			t.Fatalf("Do on a held key = %v, %v; want InProgress", out.Kind, err)
		}
		e.wantOrders(t, out.OperationID, 0)
		wantNoRun(t, m, f, "while another worker's Lease held the key")
		if err := lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}
