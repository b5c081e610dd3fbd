package storetest

// Transactions and ambiguity: the caller's transaction, a blocked claimer,
// rollback, an unreachable store, round trips, a lost COMMIT acknowledgement
// and a refused COMMIT.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

var errRollback = errors.New("storetest: roll back")

// 9. Claim and Complete inside the caller's transaction: a rollback (or a
// panic) leaves no row; a commit leaves the completed row.
func (c *contract[TTx]) inTx(t *testing.T) {
	s, ctx, sc, ref := c.fresh(t)

	claimAndComplete := func(ctx context.Context, tx TTx) (fence.Token, error) {
		tok, err := claimInTx(ctx, s, tx, sc)
		if err != nil {
			return fence.Token{}, err
		}
		return tok, s.Complete(ctx, tx, ref, tok, sampleResult())
	}

	err := s.InTx(ctx, func(ctx context.Context, tx TTx) error {
		if _, err := claimAndComplete(ctx, tx); err != nil {
			return err
		}
		return errRollback
	})
	wantErr(t, "InTx returning an error", err, errRollback)
	mustNotFound(t, s, ref)

	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("InTx swallowed a panic")
			}
		}()
		_ = s.InTx(ctx, func(ctx context.Context, tx TTx) error {
			if _, err := claimAndComplete(ctx, tx); err != nil {
				return err
			}
			panic("storetest: panic inside InTx")
		})
	}()
	mustNotFound(t, s, ref)

	var tok fence.Token
	must(t, "InTx commit", s.InTx(ctx, func(ctx context.Context, tx TTx) (err error) {
		tok, err = claimAndComplete(ctx, tx)
		return err
	}))
	rec := mustGet(t, s, ref)
	checkState(t, "committed", rec, durable.Completed)
	checkToken(t, "committed", rec.Token, tok)
	if !equalResult(rec.Result, sampleResult()) {
		t.Fatalf("committed result %+v", rec.Result)
	}

	// Inside a transaction a finished record replays too; Fail in tx commits.
	must(t, "InTx replay", s.InTx(ctx, func(ctx context.Context, tx TTx) error {
		res, err := s.Claim(ctx, tx, params(sc, fp1, long, long))
		if err != nil {
			return err
		}
		if res.Acquired || res.Record == nil || res.Record.State != durable.Completed {
			return fmt.Errorf("claim in tx of a completed record = %+v; want the replay", res)
		}
		return nil
	}))
	sc2 := newScope()
	ref2 := mustRef(t, s, sc2)
	must(t, "InTx Fail in tx", s.InTx(ctx, func(ctx context.Context, tx TTx) error {
		res, err := s.Claim(ctx, tx, params(sc2, fp1, long, long))
		if err != nil {
			return err
		}
		return s.Fail(ctx, tx, ref2, res.Token, rejection())
	}))
	checkState(t, "Fail in tx committed", mustGet(t, s, ref2), durable.Failed)
}

// waitBlocked returns once a concurrent claimer is (very likely) blocked on
// the row: when the harness can tell, when a lock waiter shows up.
func (c *contract[TTx]) waitBlocked(s storeapi.Store[TTx], done <-chan outcome) error {
	if c.h.LockWaiters == nil {
		time.Sleep(100 * time.Millisecond)
		return nil
	}
	deadline := time.Now().Add(pollFor)
	for c.h.LockWaiters(s) < 1 {
		select {
		case o := <-done:
			return fmt.Errorf("the concurrent claim returned while the transaction was open: %+v, %v", o.res, o.err)
		default:
		}
		if time.Now().After(deadline) {
			return errors.New("the concurrent claim never waited for the row lock")
		}
		time.Sleep(pollEvery)
	}
	return nil
}

// A concurrent claimer of a scope claimed in an open transaction waits
// until the transaction commits, then sees the completed record (not a
// second acquisition).
func (c *contract[TTx]) claimTxBlocks(t *testing.T) {
	s, tctx, sc, ref := c.fresh(t)
	done := make(chan outcome, 1)
	var tok fence.Token
	err := s.InTx(tctx, func(ctx context.Context, tx TTx) error {
		var err error
		if tok, err = claimInTx(ctx, s, tx, sc); err != nil {
			return err
		}
		go func() {
			r, err := s.Claim(tctx, noTx[TTx](), params(sc, fp1, long, long))
			done <- outcome{r, err}
		}()
		if err := c.waitBlocked(s, done); err != nil {
			return err
		}
		select {
		case o := <-done:
			return fmt.Errorf("the concurrent claim returned while the transaction was open: %+v, %v", o.res, o.err)
		default:
		}
		return s.Complete(ctx, tx, ref, tok, sampleResult())
	})
	must(t, "InTx", err)
	var o outcome
	select {
	case o = <-done:
	case <-time.After(pollFor):
		t.Fatal("the concurrent claim never returned after the commit")
	}
	must(t, "concurrent claim", o.err)
	if o.res.Acquired || o.res.Record == nil {
		t.Fatalf("concurrent claim = %+v; want the committed record, not a second acquisition", o.res)
	}
	checkState(t, "concurrent claim", *o.res.Record, durable.Completed)
	checkToken(t, "concurrent claim", o.res.Record.Token, tok)
	if !equalResult(o.res.Record.Result, sampleResult()) {
		t.Fatalf("concurrent claim saw result %+v", o.res.Record.Result)
	}
}

// When the transaction holding the claim rolls back, the blocked claimer
// acquires: the rolled-back claim never existed.
func (c *contract[TTx]) claimTxRollback(t *testing.T) {
	s := c.h.New(t)
	tctx := ctxFor(t)
	sc := newScope()
	done := make(chan outcome, 1)
	err := s.InTx(tctx, func(ctx context.Context, tx TTx) error {
		if _, err := claimInTx(ctx, s, tx, sc); err != nil {
			return err
		}
		go func() {
			r, err := s.Claim(tctx, noTx[TTx](), params(sc, fp2, long, long))
			done <- outcome{r, err}
		}()
		if err := c.waitBlocked(s, done); err != nil {
			return err
		}
		return errRollback
	})
	wantErr(t, "InTx", err, errRollback)
	var o outcome
	select {
	case o = <-done:
	case <-time.After(pollFor):
		t.Fatal("the concurrent claim never returned after the rollback")
	}
	must(t, "concurrent claim", o.err)
	if !o.res.Acquired || o.res.Takeover || o.res.Restarted {
		t.Fatalf("concurrent claim after the rollback = %+v; want a fresh acquisition (the rolled-back claim never existed)", o.res)
	}
	rec := mustGet(t, s, o.res.Ref)
	checkToken(t, "after the rollback", rec.Token, o.res.Token)
	if rec.Takeovers != 0 || rec.Fingerprint != fp2 || o.res.Token.Generation < generationFloor(rec) {
		t.Fatalf("record after the rollback %+v; want the blocked claimer's fresh record", rec)
	}
}

// 9c (issue 27 #7). Inside a transaction its caller keeps open (DoTx), a
// claim with NoLockUnlessAcquired that does not acquire answers as usual
// (the holder's record in progress, a mismatch, a replay) and leaves
// nothing locked: the record's holder completes it while the transaction
// is still open. The transaction stays usable: a later claim in it
// acquires and commits with it. Where a transaction holds the database's
// write lock from its start (h.TxLocksDatabase: SQLite), the holder's
// write waits for the transaction whatever the claim did, and runs after
// it instead.
func (c *contract[TTx]) claimTxRefusedHoldsNothing(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	unlocked := func(sc durable.Scope, fp string) storeapi.ClaimParams {
		p := params(sc, fp, long, long)
		p.NoLockUnlessAcquired = true
		return p
	}
	held, finished, fresh := newScope(), newScope(), newScope()
	heldRef, finRef, freshRef := mustRef(t, s, held), mustRef(t, s, finished), mustRef(t, s, fresh)
	tok := mustAcquire(t, s, params(held, fp1, long, long))
	ftok := mustAcquire(t, s, params(finished, fp1, long, long))
	must(t, "Complete", s.Complete(ctx, noTx[TTx](), finRef, ftok, sampleResult()))

	var freshTok fence.Token
	err := s.InTx(ctx, func(ctx context.Context, tx TTx) error {
		res, err := s.Claim(ctx, tx, unlocked(held, fp1))
		switch {
		case err != nil:
			return err
		case res.Acquired || res.Record == nil || res.Record.State != durable.Processing || res.Record.Token != tok:
			return fmt.Errorf("claim in tx of a held record = %+v; want it in progress under %v", res, tok)
		}
		if _, err := s.Claim(ctx, tx, unlocked(held, fp2)); !errors.Is(err, durable.ErrMismatch) {
			return fmt.Errorf("claim in tx with another fingerprint = %v; want ErrMismatch", err)
		}
		res, err = s.Claim(ctx, tx, unlocked(finished, fp1))
		switch {
		case err != nil:
			return err
		case res.Acquired || res.Record == nil || res.Record.State != durable.Completed || !equalResult(res.Record.Result, sampleResult()):
			return fmt.Errorf("claim in tx of a finished record = %+v; want the replay", res)
		}
		res, err = s.Claim(ctx, tx, unlocked(fresh, fp1))
		switch {
		case err != nil:
			return err
		case !res.Acquired:
			return fmt.Errorf("claim in tx of a fresh scope after the refused ones = %+v; want it acquired", res.Record)
		}
		freshTok = res.Token
		if err := s.Complete(ctx, tx, freshRef, freshTok, sampleResult()); err != nil {
			return err
		}
		if c.h.TxLocksDatabase {
			return nil
		}
		// The holder finishes while tx is open: its write must not wait
		// on tx.
		done := make(chan error, 1)
		go func() { done <- s.Complete(ctx, noTx[TTx](), heldRef, tok, sampleResult()) }()
		deadline := time.Now().Add(pollFor)
		for {
			select {
			case err := <-done:
				if err != nil {
					return fmt.Errorf("the holder's Complete while the transaction is open: %w", err)
				}
				return nil
			default:
			}
			if c.h.LockWaiters != nil && c.h.LockWaiters(s) > 0 {
				return errors.New("the holder's Complete waits on a lock left by a claim in the open transaction that did not acquire")
			}
			if time.Now().After(deadline) {
				return errors.New("the holder's Complete did not return while the transaction was open")
			}
			time.Sleep(pollEvery)
		}
	})
	must(t, "InTx", err)
	if c.h.TxLocksDatabase {
		t.Log("a transaction of this backend holds the database's write lock from its start: the holder completes after it")
		must(t, "the holder's Complete", s.Complete(ctx, noTx[TTx](), heldRef, tok, sampleResult()))
	}
	rec := mustGet(t, s, heldRef)
	checkState(t, "the held record", rec, durable.Completed)
	checkToken(t, "the held record", rec.Token, tok)
	rec = mustGet(t, s, freshRef)
	checkState(t, "the record claimed in the transaction", rec, durable.Completed)
	checkToken(t, "the record claimed in the transaction", rec.Token, freshTok)
}

// 10a. A store whose database cannot be reached returns ErrUnavailable from
// every method.
func (c *contract[TTx]) unreachable(t *testing.T) {
	s := c.h.Unreachable(t)
	ctx := ctxFor(t)
	sc := newScope()
	ref, err := s.Ref(sc)
	must(t, "Ref (needs no database)", err)
	tok := fence.Token{Generation: 1, Owner: uuid.New()}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, durable.ErrUnavailable) {
			t.Errorf("%s on an unreachable store = %v; want ErrUnavailable", what, err)
		}
	}
	_, err = s.Claim(ctx, noTx[TTx](), params(sc, fp1, long, long))
	check("Claim", err)
	check("Complete", s.Complete(ctx, noTx[TTx](), ref, tok, sampleResult()))
	check("Fail", s.Fail(ctx, noTx[TTx](), ref, tok, rejection()))
	check("MarkUncertain", s.MarkUncertain(ctx, ref, tok))
	check("Renew", s.Renew(ctx, ref, tok, long))
	check("Release", s.Release(ctx, noTx[TTx](), ref, tok))
	_, err = s.Adopt(ctx, ref, uuid.New(), 0, long)
	check("Adopt", err)
	_, err = s.Pending(ctx, 0, 10)
	check("Pending", err)
	_, err = s.Get(ctx, ref)
	check("Get", err)
	_, err = s.Sweep(ctx, 10)
	check("Sweep", err)
	_, err = s.Stats(ctx)
	check("Stats", err)
	called := false
	check("InTx", s.InTx(ctx, func(context.Context, TTx) error { called = true; return nil }))
	if called {
		t.Error("InTx ran fn without a transaction")
	}
}

// The documented round trips: one statement each for a fresh Claim, a
// Complete, a replaying Claim and a Get.
func (c *contract[TTx]) roundTrips(t *testing.T) {
	if c.h.Statements == nil {
		t.Log("Harness.Statements is nil: round trips are not counted for this backend")
		return
	}
	s, ctx, sc, ref := c.fresh(t)
	count := func(what string, most int64, fn func()) {
		t.Helper()
		before := c.h.Statements(s)
		fn()
		if n := c.h.Statements(s) - before; n < 1 || n > most {
			t.Fatalf("%s took %d statements; want 1 to %d", what, n, most)
		}
	}
	// With ExpectNew, a replay may first try the insert (one more).
	replay := int64(1)
	if c.h.ExpectNew {
		replay = 2
	}
	var tok fence.Token
	count("a fresh Claim", 1, func() { tok = mustAcquire(t, s, params(sc, fp1, long, long)) })
	count("Complete", 1, func() { must(t, "Complete", s.Complete(ctx, noTx[TTx](), ref, tok, sampleResult())) })
	count("a replaying Claim", replay, func() { mustNotAcquire(t, s, params(sc, fp1, long, long)) })
	count("Get", 1, func() { mustGet(t, s, ref) })
}

// 11. The connection is cut after COMMIT was sent: the caller learns the
// true outcome by reading, and a retried Complete with the same token
// succeeds instead of reporting ErrFenced.
func (c *contract[TTx]) lostCommitAck(t *testing.T) {
	if c.h.LoseCommitAck == nil {
		t.Log("not applicable: this backend's COMMIT cannot lose its acknowledgement (Harness.LoseCommitAck is nil)")
		return
	}
	s, arm := c.h.LoseCommitAck(t)
	ctx := ctxFor(t)

	// Claim and Complete in one transaction whose COMMIT ack is lost.
	sc := newScope()
	ref := mustRef(t, s, sc)
	var tok fence.Token
	arm()
	err := s.InTx(ctx, func(ctx context.Context, tx TTx) error {
		var err error
		if tok, err = claimInTx(ctx, s, tx, sc); err != nil {
			return err
		}
		return s.Complete(ctx, tx, ref, tok, sampleResult())
	})
	if !errors.Is(err, durable.ErrUnavailable) {
		t.Fatalf("InTx with a lost COMMIT ack = %v; want ErrUnavailable (outcome unknown)", err)
	}
	rec := mustGet(t, s, ref)
	checkState(t, "the truth after the lost ack", rec, durable.Completed)
	checkToken(t, "the truth after the lost ack", rec.Token, tok)
	if !equalResult(rec.Result, sampleResult()) {
		t.Fatalf("committed result %+v", rec.Result)
	}
	must(t, "retried Complete with the same token", s.Complete(ctx, noTx[TTx](), ref, tok, sampleResult()))
	if r := mustNotAcquire(t, s, params(sc, fp1, long, long)); r.State != durable.Completed {
		t.Fatalf("a retry of the request saw %+v; want the replay", r)
	}

	// The claim committed on its own; the Complete's COMMIT ack is lost.
	sc = newScope()
	ref = mustRef(t, s, sc)
	tok = mustAcquire(t, s, params(sc, fp1, long, long))
	arm()
	err = s.InTx(ctx, func(ctx context.Context, tx TTx) error { return s.Complete(ctx, tx, ref, tok, sampleResult()) })
	if !errors.Is(err, durable.ErrUnavailable) {
		t.Fatalf("InTx with a lost COMMIT ack = %v; want ErrUnavailable", err)
	}
	checkState(t, "the truth after the lost ack", mustGet(t, s, ref), durable.Completed)
	must(t, "retried Complete with the same token", s.Complete(ctx, noTx[TTx](), ref, tok, sampleResult()))
	wantErr(t, "Complete with the same token and another result", s.Complete(ctx, noTx[TTx](), ref, tok, rejection()), durable.ErrFenced)
}

// 11b (issue 13). A COMMIT the database refused (a deferred constraint
// violated, a serialization failure) rolled the transaction back: InTx
// returns that definite error, not ErrUnavailable ("outcome unknown"), and
// the store keeps working.
func (c *contract[TTx]) definiteCommitFailure(t *testing.T) {
	if c.h.BreakCommit == nil {
		t.Log("Harness.BreakCommit is nil: a definite COMMIT failure is not forced for this backend")
		return
	}
	s, ctx, sc, ref := c.fresh(t)
	err := s.InTx(ctx, func(ctx context.Context, tx TTx) error {
		res, err := s.Claim(ctx, tx, params(sc, fp1, long, long))
		if err != nil {
			return err
		}
		if err := s.Complete(ctx, tx, ref, res.Token, sampleResult()); err != nil {
			return err
		}
		return c.h.BreakCommit(ctx, tx)
	})
	if err == nil || errors.Is(err, durable.ErrUnavailable) {
		t.Fatalf("InTx whose COMMIT the database refused = %v; want its definite error, not ErrUnavailable", err)
	}
	mustNotFound(t, s, ref)
	// Nothing of the refused transaction lingers on any connection.
	for i := range 4 {
		sc := newScope()
		ref := mustRef(t, s, sc)
		must(t, fmt.Sprintf("InTx #%d after the refused COMMIT", i), s.InTx(ctx, func(ctx context.Context, tx TTx) error {
			res, err := s.Claim(ctx, tx, params(sc, fp1, long, long))
			if err != nil {
				return err
			}
			return s.Complete(ctx, tx, ref, res.Token, sampleResult())
		}))
		checkState(t, "after the refused COMMIT", mustGet(t, s, ref), durable.Completed)
	}
	a := mustAcquire(t, s, params(sc, fp1, long, long))
	must(t, "Complete", s.Complete(ctx, noTx[TTx](), ref, a, sampleResult()))
}
