package claim_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

func TestReconciler(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed, claim.WithLease(time.Minute))

	// An uncertain record whose downstream call in fact succeeded.
	charged := req("r-charged", "v1:a")
	out := mustClaim(t, e.c, charged, claim.Acquired)
	if err := out.Lease.MarkUncertain(t.Context()); err != nil {
		t.Fatal(err)
	}
	// A stuck processing record whose worker died after the downstream
	// declined.
	stuck := req("r-stuck", "v1:a")
	stuckOut := mustClaim(t, e.c, stuck, claim.Acquired)
	e.expireLease(stuck)
	// An uncertain record the downstream system knows nothing about yet.
	unknown := req("r-unknown", "v1:a")
	u := mustClaim(t, e.c, unknown, claim.Acquired)
	if err := u.Lease.MarkUncertain(t.Context()); err != nil {
		t.Fatal(err)
	}

	truth := map[string]claim.Resolution{
		e.ref(charged).OperationID(): claim.Resolved(durable.Completed, result("charged")),
		e.ref(stuck).OperationID():   claim.Resolved(durable.Failed, durable.Result{StatusCode: 402, Body: []byte("declined")}),
	}
	var mu sync.Mutex
	var asked []string
	rec, err := claim.NewReconciler(e.c, func(ctx context.Context, r durable.Record) (claim.Resolution, error) {
		id := r.Ref.OperationID()
		mu.Lock()
		asked = append(asked, id)
		mu.Unlock()
		if r.Token.Generation == 0 {
			return claim.Unresolved(), errors.New("resolver got no token")
		}
		if res, ok := truth[id]; ok {
			return res, nil
		}
		return claim.Unresolved(), nil
	}, claim.WithStaleAfter(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := rec.RunOnce(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// Resolved: the charged one (completed) and the stuck one (failed), as
	// their replays below show.
	if rep.Scanned != 3 || rep.Resolved != 2 || rep.Unresolved != 1 || rep.Errors != 0 {
		t.Fatalf("report = %+v, asked %d", rep, len(asked))
	}
	if r := mustClaim(t, e.c, charged, claim.Replayed); string(r.Result.Body) != "charged" || r.State != durable.Completed {
		t.Fatalf("charged replay = %v %q", r.State, r.Result.Body)
	}
	if r := mustClaim(t, e.c, stuck, claim.Replayed); r.State != durable.Failed || r.Result.StatusCode != 402 {
		t.Fatalf("stuck replay = %v %+v", r.State, r.Result)
	}
	mustClaim(t, e.c, unknown, claim.Uncertain) // left alone, not guessed
	// The dead worker of the stuck record wakes up: it is fenced.
	if err := stuckOut.Lease.Complete(t.Context(), result("late")); !errors.Is(err, claim.ErrFenced) {
		t.Fatalf("late original owner = %v, want ErrFenced", err)
	}

	// Run until its context is done.
	runCtx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	start := func() { go func() { done <- rec.Run(runCtx, 10*time.Millisecond) }() }
	start()
	// A second Run is refused while the first runs. Until the first has
	// started, the probe (given a done context) runs once itself and
	// returns nil, and a first Run that starts meanwhile is the refused
	// one: start it again then.
	done2, cancel2 := context.WithCancel(t.Context())
	cancel2()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		err := rec.Run(done2, time.Second)
		if errors.Is(err, claim.ErrConfig) {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("second Run while running = %v, want ErrConfig", err)
		}
		select {
		case err := <-done:
			if !errors.Is(err, claim.ErrConfig) {
				t.Fatalf("first Run = %v before its context ended", err)
			}
			start()
		default:
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if err := rec.Run(t.Context(), 0); !errors.Is(err, claim.ErrConfig) {
		t.Errorf("Run with no interval = %v, want ErrConfig", err)
	}
	if _, err := claim.NewReconciler(e.c, nil); !errors.Is(err, claim.ErrConfig) {
		t.Errorf("NewReconciler without a resolve function = %v, want ErrConfig", err)
	}
	if _, err := claim.NewReconciler(e.c, func(context.Context, durable.Record) (claim.Resolution, error) {
		return claim.Unresolved(), nil
	}, claim.WithBatch(0)); !errors.Is(err, claim.ErrConfig) {
		t.Errorf("NewReconciler with a zero batch = %v, want ErrConfig", err)
	}
	var _ *claim.Reconciler[pgx.Tx] = rec
}

// Issue 27 #9. A record the Reconciler adopted and the application could
// not resolve stays uncertain: once the Reconciler's lease runs out a retry
// gets Uncertain, never a takeover that runs the work again. That holds for
// a stale processing record (its worker died after perhaps doing the
// work: it was left processing under the adopted lease before, and the
// retry took it over) and for an uncertain one. A later pass that learns
// the outcome settles it, and the dead worker stays fenced.
func TestReconciler_UnresolvedStaysUncertain(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed, claim.WithLease(time.Minute))
	ctx := t.Context()
	stale := req("unresolved-stale", "v1:a")
	dead := mustClaim(t, e.c, stale, claim.Acquired)
	e.expireLease(stale) // the worker died, its effect unknown
	unc := req("unresolved-uncertain", "v1:a")
	u := mustClaim(t, e.c, unc, claim.Acquired)
	if err := u.Lease.MarkUncertain(ctx); err != nil {
		t.Fatal(err)
	}

	var known sync.Map // operation id -> claim.Resolution, once the application knows
	var asked atomic.Int32
	rc, err := claim.NewReconciler(e.c, func(_ context.Context, r durable.Record) (claim.Resolution, error) {
		asked.Add(1)
		if res, ok := known.Load(r.Ref.OperationID()); ok {
			return res.(claim.Resolution), nil
		}
		return claim.Unresolved(), nil
	}, claim.WithStaleAfter(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := rc.RunOnce(ctx)
	if err != nil || rep.Scanned != 2 || rep.Unresolved != 2 || rep.Resolved != 0 || rep.Errors != 0 {
		t.Fatalf("first pass = %+v, %v; want 2 scanned, 2 unresolved", rep, err)
	}
	for _, r := range []claim.Request{stale, unc} {
		rec, err := e.store.Get(ctx, e.ref(r))
		if err != nil || rec.State != durable.Uncertain {
			t.Fatalf("%s after an unresolved pass: %v, %v; want uncertain", r.Scope.Key, rec.State, err)
		}
		// The Reconciler's lease runs out (it died, or its pass ended):
		// a retry must not take the operation over and run it again.
		e.expireLease(r)
		if out, err := e.c.Claim(ctx, r); err != nil || out.Kind != claim.Uncertain {
			if out.Lease != nil {
				_ = out.Lease.Release(ctx)
			}
			t.Fatalf("%s: retry after the Reconciler's lease = %v, %v; want Uncertain (no second run)", r.Scope.Key, out.Kind, err)
		}
	}

	// The application learns the outcomes: the next pass settles both.
	known.Store(e.ref(stale).OperationID(), claim.Resolved(durable.Completed, result("charged")))
	known.Store(e.ref(unc).OperationID(), claim.Resolved(durable.Failed, durable.Result{StatusCode: 402, Body: []byte("declined")}))
	rep, err = rc.RunOnce(ctx)
	if err != nil || rep.Scanned != 2 || rep.Resolved != 2 {
		t.Fatalf("second pass = %+v, %v; want both resolved", rep, err)
	}
	if r := mustClaim(t, e.c, stale, claim.Replayed); string(r.Result.Body) != "charged" {
		t.Fatalf("stale replay = %q", r.Result.Body)
	}
	if r := mustClaim(t, e.c, unc, claim.Replayed); r.State != durable.Failed {
		t.Fatalf("uncertain replay = %v", r.State)
	}
	if err := dead.Lease.Complete(ctx, result("late")); !errors.Is(err, claim.ErrFenced) {
		t.Fatalf("the dead worker's late Complete = %v; want ErrFenced", err)
	}
	if asked.Load() != 4 {
		t.Fatalf("resolve asked %d times; want 4", asked.Load())
	}
}

// The application's word that nothing happened (NothingHappened) releases
// the record, stale processing or uncertain alike: the next request with
// its key runs as a new operation, and the dead worker stays fenced.
func TestReconciler_NothingHappenedReleases(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed, claim.WithLease(time.Minute))
	ctx := t.Context()
	stale := req("nothing-stale", "v1:a")
	dead := mustClaim(t, e.c, stale, claim.Acquired)
	e.expireLease(stale)
	unc := req("nothing-uncertain", "v1:a")
	u := mustClaim(t, e.c, unc, claim.Acquired)
	if err := u.Lease.MarkUncertain(ctx); err != nil {
		t.Fatal(err)
	}
	rc, err := claim.NewReconciler(e.c, func(context.Context, durable.Record) (claim.Resolution, error) {
		return claim.NothingHappened(), nil
	}, claim.WithStaleAfter(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := rc.RunOnce(ctx)
	if err != nil || rep.Scanned != 2 || rep.Resolved != 2 || rep.Unresolved != 0 || rep.Errors != 0 {
		t.Fatalf("pass = %+v, %v; want both settled", rep, err)
	}
	for _, r := range []claim.Request{stale, unc} {
		rec, err := e.store.Get(ctx, e.ref(r))
		if err != nil || !rec.Released {
			t.Fatalf("%s after NothingHappened: %+v, %v; want released", r.Scope.Key, rec, err)
		}
		again := r
		again.Fingerprint = "v1:b" // a released key is free for any request
		out := mustClaim(t, e.c, again, claim.Acquired)
		if err := out.Lease.Complete(ctx, result("ran")); err != nil {
			t.Fatal(err)
		}
	}
	if err := dead.Lease.Complete(ctx, result("late")); !errors.Is(err, claim.ErrFenced) {
		t.Fatalf("the dead worker's late Complete = %v; want ErrFenced", err)
	}
	if err := u.Lease.Release(ctx); !errors.Is(err, claim.ErrFenced) {
		t.Fatalf("the original worker's Release after the new operation = %v; want ErrFenced", err)
	}
}
