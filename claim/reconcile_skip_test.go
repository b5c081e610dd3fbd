package claim_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

// WithSkip keeps a pass off the records skip names (counted as
// skipped, left as they were: not adopted), asks about the others, and an
// error of skip counts as that record's error.
func TestReconciler_SkipLeavesRecordsAlone(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed, claim.WithLease(time.Minute))
	ctx := t.Context()
	owned := req("skip-owned", "v1:a")
	mustClaim(t, e.c, owned, claim.Acquired)
	e.expireLease(owned) // its worker died; another mechanism retries it
	free := req("skip-free", "v1:a")
	mustClaim(t, e.c, free, claim.Acquired)
	e.expireLease(free)
	before, err := e.store.Get(ctx, e.ref(owned))
	if err != nil {
		t.Fatal(err)
	}
	var failSkip atomic.Bool
	var asked atomic.Int32
	rc, err := claim.NewReconciler(e.c, func(_ context.Context, r durable.Record) (claim.Resolution, error) {
		asked.Add(1)
		return claim.Resolved(durable.Completed, result("done")), nil
	}, claim.WithStaleAfter(time.Millisecond), claim.WithSkip(func(_ context.Context, r durable.Record) (bool, error) {
		if failSkip.Load() {
			return false, errors.New("queue unreachable")
		}
		return r.Ref == e.ref(owned), nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := rc.RunOnce(ctx)
	if err != nil || rep.Scanned != 2 || rep.Resolved != 1 || rep.Errors != 0 || asked.Load() != 1 {
		t.Fatalf("pass = %+v, %v, resolver asked %d; want 2 scanned, 1 resolved, asked once", rep, err, asked.Load())
	}
	after, err := e.store.Get(ctx, e.ref(owned))
	if err != nil || after.State != durable.Processing || after.Token != before.Token {
		t.Fatalf("skipped record: %v %v, %v; want processing under %v (not adopted)", after.State, after.Token, err, before.Token)
	}
	failSkip.Store(true)
	if rep, err := rc.RunOnce(ctx); err != nil || rep.Errors != 1 || asked.Load() != 1 {
		t.Fatalf("pass with a failing skip = %+v, %v, asked %d; want 1 error, not asked", rep, err, asked.Load())
	}
	if _, err := claim.NewReconciler(e.c, func(context.Context, durable.Record) (claim.Resolution, error) {
		return claim.Unresolved(), nil
	}, claim.WithSkip(nil)); !errors.Is(err, claim.ErrConfig) {
		t.Fatalf("WithSkip(nil) = %v; want ErrConfig", err)
	}
}
