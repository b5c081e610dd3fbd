package claim_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
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

// fullSweeps is a store whose first full sweeps each take delay and delete
// a whole batch (without touching the database); the next ones delete
// nothing.
type fullSweeps struct {
	storeapi.Store[pgx.Tx]
	delay time.Duration
	full  int
	calls int
}

func (s *fullSweeps) Sweep(_ context.Context, limit int) (int, error) {
	s.calls++
	time.Sleep(s.delay)
	if s.calls <= s.full {
		return limit, nil
	}
	return 0, nil
}

// TestClaimer_SweepPacesItsBatches: between full batches the sweep pauses
// three times as long as the batch took (at most a quarter of its time
// deleting), not after the last one, never more than 100 batches, and a
// context that ends during a pause ends the sweep with what it deleted.
func TestClaimer_SweepPacesItsBatches(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed)
	const delay = 5 * time.Millisecond
	for _, tc := range []struct {
		full, calls, pauses, deleted int
	}{
		{full: 3, calls: 4, pauses: 3, deleted: 3000},
		{full: 1000, calls: 100, pauses: 99, deleted: 100_000},
	} {
		st := &fullSweeps{Store: e.store, delay: delay, full: tc.full}
		c, err := claim.New[pgx.Tx](st)
		if err != nil {
			t.Fatal(err)
		}
		var pauses []time.Duration
		claim.SetSweepPause(c, func(_ context.Context, d time.Duration) error {
			pauses = append(pauses, d)
			return nil
		})
		n, err := c.Sweep(t.Context())
		if err != nil || n != tc.deleted || st.calls != tc.calls || len(pauses) != tc.pauses {
			t.Fatalf("%d full batches: Sweep = %d, %v after %d batches and %d pauses; want %d after %d batches and %d pauses",
				tc.full, n, err, st.calls, len(pauses), tc.deleted, tc.calls, tc.pauses)
		}
		for i, d := range pauses {
			if d < 3*delay {
				t.Fatalf("pause %d = %v after a batch of at least %v: want at least 3 times the batch", i, d, delay)
			}
		}
	}

	st := &fullSweeps{Store: e.store, full: 10}
	c, err := claim.New[pgx.Tx](st)
	if err != nil {
		t.Fatal(err)
	}
	claim.SetSweepPause(c, func(context.Context, time.Duration) error { return context.Canceled })
	if n, err := c.Sweep(t.Context()); n != 1000 || !errors.Is(err, context.Canceled) || st.calls != 1 {
		t.Fatalf("Sweep ended during its first pause = %d, %v after %d batches; want 1000, context.Canceled after 1", n, err, st.calls)
	}
}
