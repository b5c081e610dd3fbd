package claim_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

func TestClaimer_Sweep(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed, claim.WithSweepBatch(10))
	ctx := t.Context()
	for i := range 25 {
		out := mustClaim(t, e.c, req(fmt.Sprintf("s-%d", i), "v1:a"), claim.Acquired)
		if err := out.Lease.Complete(ctx, result("x")); err != nil {
			t.Fatal(err)
		}
	}
	stuck := mustClaim(t, e.c, req("s-stuck", "v1:a"), claim.Acquired)
	if err := stuck.Lease.MarkUncertain(ctx); err != nil {
		t.Fatal(err)
	}
	// Age every record as if it had been created long ago: past its
	// retention, with a generation of that time. (The store may keep
	// records with recent generations a while longer, to keep generations
	// monotonic across deletion; that is its contract suite's business.)
	if _, err := e.pool.Exec(ctx, `UPDATE `+e.schema.Name+`.idempotency_requests
		SET expires_at = clock_timestamp() - interval '1 second', generation = 1`); err != nil {
		t.Fatal(err)
	}
	rec, err := e.store.Get(ctx, e.ref(req("s-stuck", "v1:a")))
	if err != nil || rec.ExpiresIn > 0 {
		t.Fatalf("stuck record after ageing: %+v, %v; want past its retention", rec, err)
	}
	n, err := e.c.Sweep(ctx)
	if err != nil || n != 25 {
		t.Fatalf("Sweep = %d, %v; want the 25 finished records in batches of 10", n, err)
	}
	if _, err := e.store.Get(ctx, e.ref(req("s-3", "v1:a"))); !errors.Is(err, durable.ErrNotFound) {
		t.Fatalf("swept record still there: %v", err)
	}
	st, err := e.store.Stats(ctx)
	if err != nil || st.ExpiredStuck != 1 || st.ByState[durable.Uncertain] != 1 {
		t.Fatalf("Stats = %+v, %v; the uncertain record must stay and be reported", st, err)
	}
	if err := e.c.RunSweeper(ctx, -time.Second); !errors.Is(err, claim.ErrConfig) {
		t.Fatalf("RunSweeper with a negative interval = %v, want ErrConfig", err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.c.RunSweeper(runCtx, 10*time.Millisecond) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunSweeper = %v", err)
	}
}
