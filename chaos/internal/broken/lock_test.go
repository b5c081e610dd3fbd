package broken_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/chaos/internal/broken"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// wrapped returns the PostgreSQL store, in a schema of the test's own, with
// the bug of mode, and a counter of the locks DoSkipsLock dropped.
func wrapped(t *testing.T, mode broken.Mode) (*broken.Store, *atomic.Int64) {
	t.Helper()
	sch := testenv.Postgres(t)
	if err := postgres.Migrate(t.Context(), sch.Pool, postgres.WithSchema(sch.Name)); err != nil {
		t.Fatal(err)
	}
	st, err := postgres.New(sch.Pool, postgres.WithSchema(sch.Name), postgres.WithLockTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var skipped atomic.Int64
	b, err := broken.Wrap(st.(storeapi.Store[pgx.Tx]), sch.Pool, sch.Name+".idempotency_requests", mode,
		broken.OnLockSkipped(func() { skipped.Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	return b, &skipped
}

// lockFirst is Do's default request for sc: the key's lock first.
func lockFirst(sc durable.Scope) storeapi.ClaimParams {
	return storeapi.ClaimParams{Scope: sc, Fingerprint: "v1:fp", Owner: uuid.New(), Lease: time.Second, Retention: time.Hour, LockFirst: true}
}

func token() fence.Token {
	return fence.Token{Generation: uint64(time.Now().UnixMilli() - 30_000), Owner: uuid.New()}
}

// TestDoSkipsLock_DuplicateRunsBeside: two requests of one key, both asking
// for the lock first. With the bug the second's function starts while the
// first's still runs (the real store makes it wait for the COMMIT, then
// answers ErrExists without running it); one of the two commits, the other
// is refused at its insert and rolls back.
func TestDoSkipsLock_DuplicateRunsBeside(t *testing.T) {
	b, skipped := wrapped(t, broken.DoSkipsLock)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	sc := durable.Scope{Tenant: "t", Operation: "o", Key: testenv.Name("k")}
	var running atomic.Int64
	both := make(chan struct{})
	fn := func(context.Context, pgx.Tx) (durable.State, durable.Result, error) {
		if running.Add(1) == 2 {
			close(both)
		}
		select {
		case <-both:
		case <-time.After(2 * time.Second): // the other never started beside this one
		}
		return durable.Completed, durable.Result{StatusCode: 200, Body: []byte("ok")}, nil
	}
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- b.InsertAtCommit(ctx, lockFirst(sc), token(), fn) }()
	}
	e1, e2 := <-errs, <-errs
	select {
	case <-both:
	default:
		t.Fatalf("the two functions never ran at once (%d ran); want the duplicate beside the first", running.Load())
	}
	if (e1 == nil) == (e2 == nil) || !errors.Is(errors.Join(e1, e2), storeapi.ErrNotInserted) {
		t.Fatalf("InsertAtCommit = %v and %v; want one committed and one ErrNotInserted", e1, e2)
	}
	if n := skipped.Load(); n != 2 {
		t.Fatalf("%d locks reported skipped, want 2", n)
	}
}

// Under every other mode but commit-over-existing the store writes nothing
// at commit: fn does not run, ErrNotInserted sends Do to its claim.
func TestInsertAtCommit_OtherModesRunNothing(t *testing.T) {
	b, skipped := wrapped(t, broken.CompleteWithoutFence)
	sc := durable.Scope{Tenant: "t", Operation: "o", Key: testenv.Name("k")}
	ran := false
	err := b.InsertAtCommit(t.Context(), lockFirst(sc), token(), func(context.Context, pgx.Tx) (durable.State, durable.Result, error) {
		ran = true
		return durable.Completed, durable.Result{}, nil
	})
	if !errors.Is(err, storeapi.ErrNotInserted) || ran || skipped.Load() != 0 {
		t.Fatalf("InsertAtCommit = %v, fn ran: %v, locks skipped: %d; want ErrNotInserted, nothing run or skipped", err, ran, skipped.Load())
	}
}
