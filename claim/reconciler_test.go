package claim_test

import (
	"context"
	"errors"
	"sync"
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
		e.ref(charged).OperationID(): {State: durable.Completed, Result: result("charged")},
		e.ref(stuck).OperationID():   {State: durable.Failed, Result: durable.Result{StatusCode: 402, Body: []byte("declined")}},
	}
	var mu sync.Mutex
	var asked []string
	rec, err := claim.NewReconciler(e.c, func(ctx context.Context, p claim.Pending) (claim.Resolution, error) {
		mu.Lock()
		asked = append(asked, p.OperationID)
		mu.Unlock()
		if p.Record.Token.Generation == 0 {
			return claim.Unknown, errors.New("resolver got no token")
		}
		if r, ok := truth[p.OperationID]; ok {
			return r, nil
		}
		return claim.Unknown, nil
	}, claim.ReconcilerOptions{StaleFor: time.Millisecond, Lease: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := rec.RunOnce(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Scanned != 3 || rep.Completed != 1 || rep.Failed != 1 || rep.Unknown != 1 || rep.Errors != 0 {
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

	// Run and Stop.
	done := make(chan error, 1)
	go func() { done <- rec.Run(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	rec.Stop()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	var _ *claim.Reconciler[pgx.Tx] = rec
}
