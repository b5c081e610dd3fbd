package claim_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

var errRolledBack = errors.New("the caller rolled back")

// DoTx on PostgreSQL: the claim, the business write and the completion ride
// in the caller's transaction (invisible to others until it commits); a
// commit replays, a rollback leaves nothing and the retry runs again; a
// transient error and a rejection behave as with Do; finish caches the
// result in Redis after the commit and frees the Redis lease after a
// rollback.
func TestClaimer_DoTxPostgres(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := setup(t, mode)
			e.orders()
			ctx := t.Context()
			begin := func() pgx.Tx {
				t.Helper()
				tx, err := e.pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
				return tx
			}

			t.Run("CommitStoresTheResultWithTheBusinessWrite", func(t *testing.T) {
				r := req("tx-commit", "v1:a")
				tx := begin()
				out, finish, err := e.c.DoTx(ctx, tx, r, e.insertOrder)
				if err != nil || out.Kind != claim.Executed || out.State != durable.Completed {
					t.Fatalf("DoTx = %v %v, %v", out.Kind, out.State, err)
				}
				// Nothing is visible outside the caller's transaction yet.
				if _, err := e.store.Get(ctx, e.ref(r)); !errors.Is(err, durable.ErrNotFound) {
					t.Fatalf("before the caller's commit Get = %v; want ErrNotFound", err)
				}
				if n := e.orderCount(out.OperationID); n != 0 {
					t.Fatalf("before the caller's commit: %d orders visible", n)
				}
				err = tx.Commit(ctx)
				finish(ctx, err)
				if err != nil {
					t.Fatal(err)
				}
				rec, err := e.store.Get(ctx, e.ref(r))
				if err != nil || rec.State != durable.Completed || string(rec.Result.Body) != string(out.Result.Body) {
					t.Fatalf("after commit: %v %v", rec.State, err)
				}
				rep, err := e.c.Claim(ctx, r)
				if err != nil || rep.Kind != claim.Replayed || string(rep.Result.Body) != string(out.Result.Body) {
					t.Fatalf("retry = %v, %v; want the replay", rep.Kind, err)
				}
				if mode == withRedis && !rep.FromCache {
					t.Error("finish did not cache the result in Redis")
				}
				e.wantOrders(t, out.OperationID, 1)
			})

			t.Run("RollbackLeavesNothingAndTheRetryRunsAgain", func(t *testing.T) {
				r := req("tx-rollback", "v1:a")
				tx := begin()
				out, finish, err := e.c.DoTx(ctx, tx, r, e.insertOrder)
				if err != nil || out.Kind != claim.Executed {
					t.Fatalf("DoTx = %v, %v", out.Kind, err)
				}
				if err := tx.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
				finish(ctx, errRolledBack)
				if _, err := e.store.Get(ctx, e.ref(r)); !errors.Is(err, durable.ErrNotFound) {
					t.Fatalf("after rollback Get = %v; want ErrNotFound", err)
				}
				// The retry is not held back by the rolled-back claim's
				// Redis lease: it runs at once.
				e.retryExecutesOnce(t, r, "retry after rollback")
			})

			t.Run("TransientErrorIsReturnedForTheCallerToRollBack", func(t *testing.T) {
				r := req("tx-transient", "v1:a")
				tx := begin()
				boom := errors.New("dependency down")
				_, finish, err := e.c.DoTx(ctx, tx, r, e.insertThenFail(boom))
				if !errors.Is(err, boom) {
					t.Fatalf("DoTx err = %v; want fn's", err)
				}
				_ = tx.Rollback(ctx)
				finish(ctx, err) // a no-op after an error
				e.retryExecutesOnce(t, r, "retry")
			})

			t.Run("RejectionIsStoredAsFailed", func(t *testing.T) {
				r := req("tx-reject", "v1:a")
				tx := begin()
				out, finish, err := e.c.DoTx(ctx, tx, r, func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
					return durable.Result{}, claim.Reject(durable.Result{StatusCode: 402, Body: []byte(`{"declined":true}`)})
				})
				if err != nil || out.Kind != claim.Executed || out.State != durable.Failed {
					t.Fatalf("DoTx = %v %v, %v", out.Kind, out.State, err)
				}
				err = tx.Commit(ctx)
				finish(ctx, err)
				rep, err := e.c.Claim(ctx, r)
				if err != nil || rep.Kind != claim.Replayed || rep.State != durable.Failed || rep.Result.StatusCode != 402 {
					t.Fatalf("retry = %v %v, %v", rep.Kind, rep.State, err)
				}
			})

			t.Run("DuplicateInAnotherTransactionWaitsAndReplays", func(t *testing.T) {
				if mode == withRedis {
					t.Skip("with Redis the duplicate is answered in progress by Redis without waiting")
				}
				r := req("tx-dup", "v1:a")
				var runs atomic.Int32
				fn := func(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) {
					runs.Add(1)
					return e.insertOrder(ctx, tx, op)
				}
				tx1 := begin()
				out, finish, err := e.c.DoTx(ctx, tx1, r, fn)
				if err != nil || out.Kind != claim.Executed {
					t.Fatalf("first = %v, %v", out.Kind, err)
				}
				dup := make(chan claim.Outcome, 1)
				go func() {
					tx2, err := e.pool.Begin(ctx)
					if err != nil {
						dup <- claim.Outcome{}
						return
					}
					defer tx2.Rollback(context.Background())
					o, fin, err := e.c.DoTx(ctx, tx2, r, fn)
					fin(ctx, errRolledBack)
					if err != nil {
						t.Errorf("duplicate: %v", err)
					}
					dup <- o
				}()
				waitFor(t, "the duplicate to wait on the claimed row", func() bool { return lockWaiters(t, e) > 0 })
				err = tx1.Commit(ctx)
				finish(ctx, err)
				if o := <-dup; o.Kind != claim.Replayed || string(o.Result.Body) != string(out.Result.Body) {
					t.Fatalf("duplicate = %v; want the committed result replayed", o.Kind)
				}
				if runs.Load() != 1 {
					t.Fatalf("fn ran %d times; want 1", runs.Load())
				}
			})

			// Issue 27 #7: a DoTx that finds the key held by another
			// worker's Lease answers InProgress, and its caller's
			// transaction, still open, holds nothing of the record: the
			// owner's Complete goes through before that transaction ends
			// (it waited on the claim statement's row lock before). A
			// mismatch, and an uncertain record the Reconciler settles,
			// likewise. With Redis the in-progress answer comes from Redis
			// and the store is not asked; the test holds all the same.
			t.Run("KeyHeldElsewhereLeavesItsOwnerFreeToFinish", func(t *testing.T) {
				// finishes runs finish (the owner's or the reconciler's
				// write) while tx is open and requires it to return
				// before tx ends: it fails as soon as finish waits on a
				// lock, which only tx can hold.
				finishes := func(what string, finish func() error) {
					t.Helper()
					done := make(chan error, 1)
					go func() { done <- finish() }()
					for {
						select {
						case err := <-done:
							if err != nil {
								t.Fatalf("%s while the DoTx caller's transaction is open: %v", what, err)
							}
							return
						default:
						}
						if lockWaiters(t, e) > 0 {
							t.Fatalf("%s waits on a lock held by the DoTx caller's open transaction", what)
						}
						time.Sleep(2 * time.Millisecond)
					}
				}
				var runs atomic.Int32
				fn := func(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) {
					runs.Add(1)
					return e.insertOrder(ctx, tx, op)
				}

				r := req("tx-held", "v1:a")
				own := mustClaim(t, e.c, r, claim.Acquired)
				tx := begin()
				out, fin, err := e.c.DoTx(ctx, tx, r, fn)
				if err != nil || out.Kind != claim.InProgress || out.OperationID != own.OperationID {
					t.Fatalf("DoTx on a held key = %v %q, %v; want InProgress %q", out.Kind, out.OperationID, err, own.OperationID)
				}
				// Another fingerprint in the same transaction: a mismatch,
				// which holds nothing either.
				if _, _, err := e.c.DoTx(ctx, tx, req("tx-held", "v1:other"), fn); !errors.Is(err, claim.ErrMismatch) {
					t.Fatalf("DoTx with another fingerprint = %v; want ErrMismatch", err)
				}
				finishes("the owner's Complete", func() error { return own.Lease.Complete(ctx, result(`{"owner":1}`)) })
				// The caller's transaction is still usable and ends as the
				// caller decides.
				if err := tx.Commit(ctx); err != nil {
					t.Fatalf("the caller's commit: %v", err)
				}
				fin(ctx, nil)
				if rep := mustClaim(t, e.c, r, claim.Replayed); string(rep.Result.Body) != `{"owner":1}` {
					t.Fatalf("retry = %s; want the owner's result", rep.Result.Body)
				}

				// An uncertain record: DoTx answers Uncertain; the
				// Reconciler adopts and completes it meanwhile.
				u := req("tx-uncertain", "v1:a")
				uo := mustClaim(t, e.c, u, claim.Acquired)
				if err := uo.Lease.MarkUncertain(ctx); err != nil {
					t.Fatal(err)
				}
				tx = begin()
				out, fin, err = e.c.DoTx(ctx, tx, u, fn)
				if err != nil || out.Kind != claim.Uncertain {
					t.Fatalf("DoTx on an uncertain key = %v, %v; want Uncertain", out.Kind, err)
				}
				rc, err := claim.NewReconciler(e.c, func(context.Context, durable.Record) (claim.Resolution, error) {
					return claim.Resolved(durable.Completed, result(`{"reconciled":1}`)), nil
				})
				if err != nil {
					t.Fatal(err)
				}
				finishes("the Reconciler's pass", func() error {
					rep, err := rc.RunOnce(ctx)
					if err == nil && rep.Resolved != 1 {
						err = fmt.Errorf("report %+v; want 1 resolved", rep)
					}
					return err
				})
				if err := tx.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
				fin(ctx, errRolledBack)
				if rep := mustClaim(t, e.c, u, claim.Replayed); string(rep.Result.Body) != `{"reconciled":1}` {
					t.Fatalf("retry = %s; want the reconciled result", rep.Result.Body)
				}
				if runs.Load() != 0 {
					t.Fatalf("fn ran %d times for keys held elsewhere; want 0", runs.Load())
				}
			})

			t.Run("NilTransactionOrFunctionIsAConfigError", func(t *testing.T) {
				if _, _, err := e.c.DoTx(ctx, nil, req("tx-nil", "v1:a"), e.insertOrder); !errors.Is(err, claim.ErrConfig) {
					t.Fatalf("nil tx: %v", err)
				}
				if _, _, err := e.c.DoTx(ctx, begin(), req("tx-nil", "v1:a"), nil); !errors.Is(err, claim.ErrConfig) {
					t.Fatalf("nil fn: %v", err)
				}
			})
		})
	}
}

func lockWaiters(t *testing.T, e *env) int {
	var n int
	if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		AND wait_event_type = 'Lock' AND query LIKE '%`+e.schema.Name+`%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
