package claim_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
)

// orders makes the business table the Do tests write to, deliberately
// without a unique constraint: a duplicate effect would show as a second row.
func (e *env) orders() {
	e.t.Helper()
	if _, err := e.pool.Exec(e.t.Context(), `CREATE TABLE `+e.schema.Name+`.orders (op text NOT NULL, n int NOT NULL)`); err != nil {
		e.t.Fatal(err)
	}
}

// wantOrders fails t unless op wrote n orders.
func (e *env) wantOrders(t *testing.T, op string, n int) {
	t.Helper()
	if got := e.orderCount(op); got != n {
		t.Fatalf("orders of %s = %d, want %d", op, got, n)
	}
}

func (e *env) orderCount(op string) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.schema.Name+`.orders WHERE op = $1`, op).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func (e *env) insertOrder(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) {
	if _, err := tx.Exec(ctx, `INSERT INTO `+e.schema.Name+`.orders (op, n) VALUES ($1, 1)`, op.ID); err != nil {
		return durable.Result{}, err
	}
	return result(`{"order":"` + op.ID + `"}`), nil
}

// insertThenFail returns a Do function that writes its order, then fails
// with fail.
func (e *env) insertThenFail(fail error) func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
	return func(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) {
		if _, err := e.insertOrder(ctx, tx, op); err != nil {
			return durable.Result{}, err
		}
		return durable.Result{}, fail
	}
}

// retryExecutesOnce does r again (what names the retry) and fails t unless
// it executed and its operation wrote exactly one order.
func (e *env) retryExecutesOnce(t *testing.T, r claim.Request, what string) {
	t.Helper()
	out, err := e.c.Do(t.Context(), r, e.insertOrder)
	if err != nil || out.Kind != claim.Executed {
		t.Fatalf("%s = %v, %v; want Executed", what, out.Kind, err)
	}
	e.wantOrders(t, out.OperationID, 1)
}

func TestClaimer_Do(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := setup(t, mode)
			e.orders()

			t.Run("ExecutesOnceAndReplays", func(t *testing.T) {
				r := req("d-once", "v1:a")
				out, err := e.c.Do(t.Context(), r, e.insertOrder)
				if err != nil || out.Kind != claim.Executed || out.State != durable.Completed {
					t.Fatalf("Do = %v %v, %v", out.Kind, out.State, err)
				}
				body := string(out.Result.Body)
				for range 3 {
					rep, err := e.c.Do(t.Context(), r, e.insertOrder)
					if err != nil || rep.Kind != claim.Replayed || string(rep.Result.Body) != body {
						t.Fatalf("retry = %v %q, %v", rep.Kind, rep.Result.Body, err)
					}
				}
				e.wantOrders(t, out.OperationID, 1)
			})

			t.Run("TransientErrorStoresNothingAndFreesTheKey", func(t *testing.T) {
				r := req("d-transient", "v1:a")
				boom := errors.New("dependency down")
				_, err := e.c.Do(t.Context(), r, e.insertThenFail(boom))
				if !errors.Is(err, boom) {
					t.Fatalf("Do err = %v, want the function's error", err)
				}
				if _, err := e.store.Get(t.Context(), e.ref(r)); !errors.Is(err, durable.ErrNotFound) {
					t.Fatalf("record after rollback: %v, want ErrNotFound", err)
				}
				// The rolled back insert must not count.
				e.retryExecutesOnce(t, r, "retry after transient error")
			})

			t.Run("RejectIsStoredAsFailedAndReplayed", func(t *testing.T) {
				r := req("d-reject", "v1:a")
				declined := durable.Result{StatusCode: 402, Body: []byte(`{"error":"declined"}`)}
				out, err := e.c.Do(t.Context(), r, func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
					return durable.Result{}, claim.Reject(declined)
				})
				if err != nil || out.Kind != claim.Executed || out.State != durable.Failed || out.Result.StatusCode != 402 {
					t.Fatalf("Do = %v %v %+v, %v", out.Kind, out.State, out.Result, err)
				}
				rep, err := e.c.Do(t.Context(), r, e.insertOrder)
				if err != nil || rep.Kind != claim.Replayed || rep.State != durable.Failed || string(rep.Result.Body) != `{"error":"declined"}` {
					t.Fatalf("retry = %v %v %q, %v", rep.Kind, rep.State, rep.Result.Body, err)
				}
			})

			t.Run("PanicReleasesTheKeyAndRePanics", func(t *testing.T) {
				r := req("d-panic", "v1:a")
				func() {
					defer func() {
						if v := recover(); v != "handler bug" {
							t.Fatalf("recovered %v, want the function's panic", v)
						}
					}()
					_, _ = e.c.Do(t.Context(), r, func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
						panic("handler bug")
					})
				}()
				out, err := e.c.Do(t.Context(), r, e.insertOrder)
				if err != nil || out.Kind != claim.Executed {
					t.Fatalf("retry after panic = %v, %v", out.Kind, err)
				}
			})

			t.Run("ConcurrentDuplicatesExecuteOnce", func(t *testing.T) {
				r := req("d-concurrent", "v1:a")
				var wg sync.WaitGroup
				var executed, failed atomic.Int64
				for range 20 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						out, err := e.c.Do(context.Background(), r, e.insertOrder)
						if err != nil {
							failed.Add(1)
							t.Errorf("Do: %v", err)
							return
						}
						if out.Kind == claim.Executed {
							executed.Add(1)
						}
					}()
				}
				wg.Wait()
				if executed.Load() != 1 {
					t.Fatalf("executed = %d, want 1", executed.Load())
				}
				ref := e.ref(r)
				if n := e.orderCount(ref.OperationID()); n != 1 {
					t.Fatalf("orders = %d, want 1", n)
				}
			})
		})
	}
}

func TestClaimer_DoConnectionCutBeforeCommit(t *testing.T) {
	t.Parallel()
	e := setup(t, withRedis)
	e.orders()
	r := req("d-cut", "v1:a")
	_, err := e.c.Do(t.Context(), r, func(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) {
		if _, err := e.insertOrder(ctx, tx, op); err != nil {
			return durable.Result{}, err
		}
		var pid int
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return durable.Result{}, err
		}
		// Another session kills this transaction's connection before COMMIT.
		if _, err := e.pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid); err != nil {
			t.Fatal(err)
		}
		return result("never committed"), nil
	})
	if err == nil {
		t.Fatal("Do succeeded although its connection was killed before COMMIT")
	}
	e.retryExecutesOnce(t, r, "retry")
}

// lostAckStore commits every transaction, reports its COMMIT reply as lost,
// and never answers a read: the store a network partition leaves behind.
type lostAckStore struct {
	storeapi.Store[pgx.Tx]
}

func (s lostAckStore) InTx(ctx context.Context, fn func(context.Context, pgx.Tx) error) error {
	if err := s.Store.InTx(ctx, fn); err != nil {
		return err
	}
	return fmt.Errorf("%w: commit reply lost", durable.ErrUnavailable)
}

func (s lostAckStore) Get(ctx context.Context, _ durable.Ref) (durable.Record, error) {
	<-ctx.Done()
	return durable.Record{}, fmt.Errorf("%w: %w", durable.ErrUnavailable, ctx.Err())
}

// A COMMIT whose reply was lost is settled by a read; when the store does
// not answer that read either, Do returns "unknown" (ErrUnavailable) after
// a bounded wait instead of hanging, even though the caller's context has
// no deadline.
func TestClaimer_DoLostCommitReplyAndSilentStoreIsUnknownNotAHang(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed)
	e.orders()
	c, err := claim.New[pgx.Tx](lostAckStore{e.store})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Do(context.Background(), req("d-silent", "v1:a"), e.insertOrder)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, claim.ErrUnavailable) {
			t.Fatalf("Do err = %v, want ErrUnavailable (outcome unknown)", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Do still waits on a read the store never answers")
	}
}
