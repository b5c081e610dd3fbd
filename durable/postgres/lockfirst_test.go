package postgres_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// lockFirst is claimParams with LockFirst: Do's default protocol.
func lockFirst(sc durable.Scope) storeapi.ClaimParams {
	p := claimParams(sc, time.Second)
	p.LockFirst = true
	return p
}

// counted wraps fn and counts its runs.
func counted(n *atomic.Int64, fn func(context.Context, pgx.Tx) (durable.State, durable.Result, error)) func(context.Context, pgx.Tx) (durable.State, durable.Result, error) {
	return func(ctx context.Context, tx pgx.Tx) (durable.State, durable.Result, error) {
		n.Add(1)
		return fn(ctx, tx)
	}
}

// holdingFn starts an InsertAtCommit of p whose fn writes key, closes
// inFn and waits for release; it returns once fn is running, with the
// insert's result to come. runs, when not nil, counts fn's runs.
func holdingFn(ctx context.Context, w storeapi.CommitWriter[pgx.Tx], p storeapi.ClaimParams, key string, inFn, release chan struct{}, runs *atomic.Int64) <-chan error {
	fn := func(ctx context.Context, tx pgx.Tx) (durable.State, durable.Result, error) {
		st, res, err := write(key, durable.Completed)(ctx, tx)
		close(inFn)
		<-release
		return st, res, err
	}
	if runs != nil {
		fn = counted(runs, fn)
	}
	done := make(chan error, 1)
	go func() { done <- w.InsertAtCommit(ctx, p, freshToken(), fn) }()
	<-inFn
	return done
}

// TestLockFirst_WritesOnceInTwoRoundTrips: with LockFirst a fresh key costs
// the BEGIN's round trip (the lock and the check ride in it), fn's
// statements, and the INSERT with the COMMIT: the record is written once.
func TestLockFirst_WritesOnceInTwoRoundTrips(t *testing.T) {
	f, w, ctx := commitFixture(t, fixtureOpts{})
	sc := scope()
	ref, _ := f.s.Ref(sc)
	before := f.stmts.Count()
	if err := w.InsertAtCommit(ctx, lockFirst(sc), freshToken(), write(sc.Key, durable.Completed)); err != nil {
		t.Fatal(err)
	}
	if n := f.stmts.Count() - before; n != 3 {
		t.Fatalf("InsertAtCommit with LockFirst took %d round trips; want 3 (BEGIN with the lock and the check, fn's INSERT, the record's INSERT with COMMIT)", n)
	}
	if rec, err := f.s.Get(ctx, ref); err != nil || rec.State != durable.Completed {
		t.Fatalf("Get = %+v, %v; want the completed record", rec, err)
	}
	settled(t, f, 1)
}

// TestLockFirst_ExistingRecordRunsNothing: a record of the scope, whatever
// its state, stops fn before it runs.
func TestLockFirst_ExistingRecordRunsNothing(t *testing.T) {
	f, w, ctx := commitFixture(t, fixtureOpts{})
	finished, processing := scope(), scope()
	ref, _ := f.s.Ref(finished)
	tok := acquire(t, f.s, claimParams(finished, time.Hour))
	if err := f.s.Complete(ctx, nil, ref, tok, result); err != nil {
		t.Fatal(err)
	}
	acquire(t, f.s, claimParams(processing, time.Hour))
	var runs atomic.Int64
	for _, sc := range []durable.Scope{finished, processing} {
		err := w.InsertAtCommit(ctx, lockFirst(sc), freshToken(), counted(&runs, write(sc.Key, durable.Completed)))
		if !errors.Is(err, storeapi.ErrExists) {
			t.Fatalf("InsertAtCommit with LockFirst over a record = %v; want ErrExists", err)
		}
	}
	if n := runs.Load(); n != 0 {
		t.Fatalf("fn ran %d times over existing records; want 0", n)
	}
	settled(t, f, 0)
}

// TestLockFirst_DuplicateWaitsAndRunsNothing: two requests of one key, both
// lock first. The second waits for the first's COMMIT, then finds its
// record: fn ran once. A claim of the key (the workflow's, in autocommit)
// waits the same way and then replays.
func TestLockFirst_DuplicateWaitsAndRunsNothing(t *testing.T) {
	if n := duplicateRuns(t, true); n != 1 {
		t.Fatalf("fn ran %d times; want 1", n)
	}
}

// TestLockFirst_NegativeControl: the same two requests without the lock
// (a write at commit, the WithWriteAtCommit opt-in): the duplicate does
// not wait and runs fn, whose writes then roll back. The test above would
// catch a Do that skipped the lock.
func TestLockFirst_NegativeControl(t *testing.T) {
	if n := duplicateRuns(t, false); n != 2 {
		t.Fatalf("without the lock fn ran %d times; want 2 (the duplicate's run rolled back)", n)
	}
}

// duplicateRuns runs a request of one key that holds the key inside fn, a
// duplicate of it, and a claim of the key, with or without LockFirst, and
// returns how often fn ran.
func duplicateRuns(t *testing.T, locked bool) int64 {
	f, w, ctx := commitFixture(t, fixtureOpts{})
	sc := scope()
	params := func() storeapi.ClaimParams {
		p := claimParams(sc, time.Second)
		p.LockFirst = locked
		return p
	}
	var runs atomic.Int64
	inFn, release := make(chan struct{}), make(chan struct{})
	first := holdingFn(ctx, w, params(), sc.Key, inFn, release, &runs)
	second := make(chan error, 1)
	go func() {
		second <- w.InsertAtCommit(ctx, params(), freshToken(), counted(&runs, write(sc.Key+"-dup", durable.Completed)))
	}()
	if !locked {
		// The duplicate runs fn beside the first; one of the two inserts
		// its record and the other fails, rolling its writes back.
		for deadline := time.Now().Add(5 * time.Second); runs.Load() < 2 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		close(release)
		e1, e2 := <-first, <-second
		if (e1 == nil) == (e2 == nil) || !errors.Is(errors.Join(e1, e2), storeapi.ErrNotInserted) {
			t.Fatalf("without the lock: %v and %v; want one committed and one ErrNotInserted", e1, e2)
		}
		settled(t, f, 1)
		return runs.Load()
	}
	claimed := make(chan storeapi.ClaimResult, 1)
	go func() {
		res, err := f.s.Claim(ctx, nil, claimParams(sc, time.Second))
		if err != nil {
			t.Error(err)
		}
		claimed <- res
	}()
	select {
	case err := <-second:
		t.Fatalf("the duplicate returned %v while the first held the key; want it to wait", err)
	case res := <-claimed:
		t.Fatalf("the claim returned %+v while the first held the key; want it to wait", res)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; !errors.Is(err, storeapi.ErrExists) {
		t.Fatalf("duplicate = %v; want ErrExists", err)
	}
	if res := <-claimed; res.Acquired || res.Record == nil || res.Record.State != durable.Completed {
		t.Fatalf("claim = %+v; want the completed record", res)
	}
	settled(t, f, 1)
	return runs.Load()
}

// TestLockFirst_ClaimHoldsTheLockInItsTransaction: a claim inside a
// transaction holds the key's lock until it ends, so a LockFirst request
// waits and then finds the record (here processing: fn does not run).
func TestLockFirst_ClaimHoldsTheLockInItsTransaction(t *testing.T) {
	f, w, ctx := commitFixture(t, fixtureOpts{})
	sc := scope()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if res, err := f.s.Claim(ctx, tx, claimParams(sc, time.Hour)); err != nil || !res.Acquired {
		t.Fatalf("Claim in tx = %+v, %v", res, err)
	}
	var runs atomic.Int64
	done := make(chan error, 1)
	go func() {
		done <- w.InsertAtCommit(ctx, lockFirst(sc), freshToken(), counted(&runs, write(sc.Key, durable.Completed)))
	}()
	select {
	case err := <-done:
		t.Fatalf("LockFirst returned %v while a transaction held the key; want it to wait", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, storeapi.ErrExists) {
		t.Fatalf("LockFirst after the claim committed = %v; want ErrExists", err)
	}
	if runs.Load() != 0 {
		t.Fatal("fn ran for a held key")
	}
}

// TestLockFirst_RefusedClaimUnderSavepointFreesTheLock: DoTx's claim that
// does not acquire rolls back to its savepoint, which must give the key's
// lock back too, or the caller's open transaction would hold every Do of
// the key.
func TestLockFirst_RefusedClaimUnderSavepointFreesTheLock(t *testing.T) {
	f, w, ctx := commitFixture(t, fixtureOpts{})
	sc := scope()
	acquire(t, f.s, claimParams(sc, time.Hour)) // another holder
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	p := claimParams(sc, time.Hour)
	p.NoLockUnlessAcquired = true
	if res, err := f.s.Claim(ctx, tx, p); err != nil || res.Acquired {
		t.Fatalf("Claim in tx = %+v, %v; want the holder's record", res, err)
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := w.InsertAtCommit(lctx, lockFirst(sc), freshToken(), write(sc.Key, durable.Completed)); !errors.Is(err, storeapi.ErrExists) {
		t.Fatalf("LockFirst while the refused claim's transaction is open = %v; want ErrExists at once", err)
	}
}

// TestLockFirst_FloorCheckedAtBegin: with LockFirst the clock floor is
// checked before fn runs, not at the INSERT after it. A generation below
// it runs nothing (ErrExists); one just above it commits even when fn
// outlasts the floor's move (a slow fn with a Redis proposal, 59 s behind
// the clock, used to fail its INSERT after 1 s and roll back fn's run).
func TestLockFirst_FloorCheckedAtBegin(t *testing.T) {
	f, w, ctx := commitFixture(t, fixtureOpts{})
	var runs atomic.Int64
	below := fence.Token{Generation: uint64(time.Now().UnixMilli() - 61_000), Owner: uuid.New()}
	sc := scope()
	if err := w.InsertAtCommit(ctx, lockFirst(sc), below, counted(&runs, write(sc.Key, durable.Completed))); !errors.Is(err, storeapi.ErrExists) {
		t.Fatalf("LockFirst below the floor = %v; want ErrExists", err)
	}
	if runs.Load() != 0 {
		t.Fatal("fn ran for a generation below the floor")
	}
	// 59.5 s behind: above the floor at BEGIN, below it 0.5 s later.
	near := fence.Token{Generation: uint64(time.Now().UnixMilli() - 59_500), Owner: uuid.New()}
	slow := func(ctx context.Context, tx pgx.Tx) (durable.State, durable.Result, error) {
		time.Sleep(time.Second)
		return write(sc.Key, durable.Completed)(ctx, tx)
	}
	if err := w.InsertAtCommit(ctx, lockFirst(sc), near, counted(&runs, slow)); err != nil {
		t.Fatalf("LockFirst with a slow fn = %v; want committed", err)
	}
	if runs.Load() != 1 {
		t.Fatalf("fn ran %d times; want 1", runs.Load())
	}
	settled(t, f, 1)
}

// TestLockFirst_WriteAtCommitWaitsForTheHolder: a write at commit (the
// WithWriteAtCommit opt-in, no lock first) of a key a lock-first Do holds
// waits at its insert for the holder's COMMIT, then fails on its record:
// it never commits beside the holder, whose duplicates the holder's Redis
// lease answers meanwhile.
func TestLockFirst_WriteAtCommitWaitsForTheHolder(t *testing.T) {
	f, w, ctx := commitFixture(t, fixtureOpts{})
	sc := scope()
	inFn, release := make(chan struct{}), make(chan struct{})
	first := holdingFn(ctx, w, lockFirst(sc), sc.Key, inFn, release, nil)
	atCommit := make(chan error, 1)
	go func() {
		atCommit <- w.InsertAtCommit(ctx, claimParams(sc, time.Second), freshToken(), write(sc.Key+"-at-commit", durable.Completed))
	}()
	select {
	case err := <-atCommit:
		t.Fatalf("the write at commit returned %v while a lock-first Do held the key; want it to wait", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("the holder = %v; want committed", err)
	}
	if err := <-atCommit; !errors.Is(err, storeapi.ErrNotInserted) {
		t.Fatalf("the write at commit = %v; want ErrNotInserted", err)
	}
	settled(t, f, 1)
}
