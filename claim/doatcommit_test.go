package claim_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// On PostgreSQL with WithWriteAtCommit, Do writes the record once, finished, with the COMMIT: a
// fresh operation costs BEGIN, the business write and INSERT+COMMIT (plus
// one read when Redis did not answer), and a replay the database answers
// costs one read.
func TestClaimer_DoWritesTheRecordAtCommit(t *testing.T) {
	t.Parallel()
	for mode, want := range map[string]struct{ fresh, replay int64 }{
		withRedis:   {fresh: 3, replay: 0},
		withoutRed:  {fresh: 4, replay: 1},
		breakerOpen: {fresh: 4, replay: 1},
	} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := setup(t, mode, claim.WithWriteAtCommit())
			e.orders()
			r := req("at-commit", "v1:a")
			e.stmts.Reset()
			out, err := e.c.Do(t.Context(), r, e.insertOrder)
			if err != nil || out.Kind != claim.Executed {
				t.Fatalf("Do = %v, %v", out.Kind, err)
			}
			if n := e.stmts.Count(); n != want.fresh {
				t.Fatalf("fresh Do sent %d statements; want %d", n, want.fresh)
			}
			rec, err := e.store.Get(t.Context(), e.ref(r))
			if err != nil || rec.State != durable.Completed || rec.LeaseRemaining != 0 ||
				string(rec.Result.Body) != string(out.Result.Body) {
				t.Fatalf("record = %+v, %v; want completed with the result", rec, err)
			}
			e.stmts.Reset()
			rep, err := e.c.Do(t.Context(), r, e.insertOrder)
			if err != nil || rep.Kind != claim.Replayed || string(rep.Result.Body) != string(out.Result.Body) {
				t.Fatalf("retry = %v, %v", rep.Kind, err)
			}
			if n := e.stmts.Count(); n != want.replay {
				t.Fatalf("replay sent %d statements; want %d", n, want.replay)
			}
			e.wantOrders(t, out.OperationID, 1)
		})
	}
}

// Two requests of one key in flight at once, which Redis did not separate:
// both run fn, the first COMMIT wins, and the other rolls back its write and
// replays the winner's result.
func TestClaimer_DoDuplicateInFlightRollsBackAndReplays(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed, claim.WithWriteAtCommit())
	e.orders()
	r := req("in-flight", "v1:a")
	var runs atomic.Int64
	inFn, goOn := make(chan struct{}), make(chan struct{})
	type answer struct {
		out claim.Outcome
		err error
	}
	slow := make(chan answer, 1)
	go func() {
		out, err := e.c.Do(context.Background(), r, func(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) {
			runs.Add(1)
			if _, err := e.insertOrder(ctx, tx, op); err != nil {
				return durable.Result{}, err
			}
			close(inFn)
			<-goOn
			return result("slow"), nil
		})
		slow <- answer{out, err}
	}()
	<-inFn
	fast, err := e.c.Do(t.Context(), r, func(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) {
		runs.Add(1)
		if _, err := e.insertOrder(ctx, tx, op); err != nil {
			return durable.Result{}, err
		}
		return result("fast"), nil
	})
	if err != nil || fast.Kind != claim.Executed || string(fast.Result.Body) != "fast" {
		t.Fatalf("first to commit = %v %q, %v", fast.Kind, fast.Result.Body, err)
	}
	close(goOn)
	got := <-slow
	if got.err != nil || got.out.Kind != claim.Replayed || string(got.out.Result.Body) != "fast" {
		t.Fatalf("the slow duplicate = %v, %v; want Replayed with the winner's result", got.out.Kind, got.err)
	}
	if n := e.orderCount(fast.OperationID); n != 1 {
		t.Fatalf("orders = %d, want 1: the slow duplicate's write must roll back", n)
	}
	// fn ran for both (Do's documented contract): only its writes in tx are
	// exactly once.
	if n := runs.Load(); n != 2 {
		t.Fatalf("fn ran %d times; want 2 (both in flight)", n)
	}
}

// fn failing because the winner's business write conflicts with its own
// (a unique business key) is answered with the winner's result.
func TestClaimer_DoFailingOnTheWinnersWriteReplays(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed, claim.WithWriteAtCommit())
	if _, err := e.pool.Exec(t.Context(), `CREATE TABLE `+e.schema.Name+`.payments (op text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	pay := func(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO `+e.schema.Name+`.payments (op) VALUES ($1)`, op.ID); err != nil {
			return durable.Result{}, err
		}
		return result("paid"), nil
	}
	r := req("unique-business", "v1:a")
	inFn, goOn := make(chan struct{}), make(chan struct{})
	slow := make(chan error, 1)
	var slowOut claim.Outcome
	go func() {
		var err error
		slowOut, err = e.c.Do(context.Background(), r, func(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) {
			close(inFn)
			<-goOn
			return pay(ctx, tx, op) // the winner's row is committed by now
		})
		slow <- err
	}()
	<-inFn
	if out, err := e.c.Do(t.Context(), r, pay); err != nil || out.Kind != claim.Executed {
		t.Fatalf("winner = %v, %v", out.Kind, err)
	}
	close(goOn)
	if err := <-slow; err != nil || slowOut.Kind != claim.Replayed || string(slowOut.Result.Body) != "paid" {
		t.Fatalf("the duplicate whose write conflicted = %v, %v; want Replayed", slowOut.Kind, err)
	}
}

// A key the database knows is never run before it is claimed when Redis
// did not answer: a live lease answers in progress, another payload is a
// mismatch, a released record restarts.
func TestClaimer_DoReadsFirstWithoutRedis(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed, claim.WithWriteAtCommit())
	e.orders()
	never := func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
		t.Error("fn ran for a key the database knows")
		return durable.Result{}, errors.New("ran")
	}

	held := req("held", "v1:a")
	lease := mustClaim(t, e.c, held, claim.Acquired).Lease
	if out, err := e.c.Do(t.Context(), held, never); err != nil || out.Kind != claim.InProgress {
		t.Fatalf("Do on a held key = %v, %v; want InProgress", out.Kind, err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	out, err := e.c.Do(t.Context(), held, e.insertOrder)
	if err != nil || out.Kind != claim.Executed {
		t.Fatalf("Do on a released key = %v, %v; want Executed", out.Kind, err)
	}
	if _, err := e.c.Do(t.Context(), req("held", "v1:other"), never); !errors.Is(err, claim.ErrMismatch) {
		t.Fatalf("Do with another payload = %v; want ErrMismatch", err)
	}
}

// Redis that lost a finished key (a failover, an eviction) lets fn run; its
// write rolls back and Do replays the stored result.
func TestClaimer_DoAfterRedisLostTheKeyReplays(t *testing.T) {
	t.Parallel()
	e := setup(t, withRedis, claim.WithWriteAtCommit())
	e.orders()
	r := req("lost-in-redis", "v1:a")
	out, err := e.c.Do(t.Context(), r, e.insertOrder)
	if err != nil || out.Kind != claim.Executed {
		t.Fatalf("Do = %v, %v", out.Kind, err)
	}
	e.flushRedis()
	rep, err := e.c.Do(t.Context(), r, e.insertOrder)
	if err != nil || rep.Kind != claim.Replayed || string(rep.Result.Body) != string(out.Result.Body) {
		t.Fatalf("Do after Redis lost the key = %v, %v; want Replayed", rep.Kind, err)
	}
	e.wantOrders(t, out.OperationID, 1)
	// Redis has it again.
	e.stmts.Reset()
	if rep, err := e.c.Do(t.Context(), r, e.insertOrder); err != nil || !rep.FromCache {
		t.Fatalf("third Do = %+v, %v; want a replay from Redis", rep, err)
	}
}

// lostCommitAck commits Do's write at commit and reports its reply lost.
type lostCommitAck struct {
	storeapi.Store[pgx.Tx]
	cw storeapi.CommitWriter[pgx.Tx]
}

func (s lostCommitAck) InsertAtCommit(ctx context.Context, p storeapi.ClaimParams, tok fence.Token, fn func(context.Context, pgx.Tx) (durable.State, durable.Result, error)) error {
	if err := s.cw.InsertAtCommit(ctx, p, tok, fn); err != nil {
		return err
	}
	return fmt.Errorf("%w: commit reply lost", durable.ErrUnavailable)
}

// A write at commit whose COMMIT reply was lost is settled by reading the
// record: it applied, so Do answers Executed, and a retry replays it.
func TestClaimer_DoAtCommitLostReplyIsSettledByReading(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{withRedis, withoutRed} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := setup(t, mode, claim.WithWriteAtCommit())
			e.orders()
			cw, ok := e.store.(storeapi.CommitWriter[pgx.Tx])
			if !ok {
				t.Fatal("the PostgreSQL store does not write at commit")
			}
			c := e.newClaimer(lostCommitAck{Store: e.store, cw: cw}, claim.WithWriteAtCommit())
			r := req("lost-commit-ack", "v1:a")
			out, err := c.Do(t.Context(), r, e.insertOrder)
			if err != nil || out.Kind != claim.Executed {
				t.Fatalf("Do with its COMMIT reply lost = %v, %v; want Executed (the record shows it applied)", out.Kind, err)
			}
			rep, err := e.c.Do(t.Context(), r, e.insertOrder)
			if err != nil || rep.Kind != claim.Replayed || string(rep.Result.Body) != string(out.Result.Body) {
				t.Fatalf("retry = %v, %v; want Replayed", rep.Kind, err)
			}
			e.wantOrders(t, out.OperationID, 1)
		})
	}
}
