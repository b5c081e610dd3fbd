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

// runs is a Do function that counts its runs and returns body.
type runs struct {
	n    atomic.Int64
	body string
}

func (f *runs) fn(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
	f.n.Add(1)
	return result(f.body), nil
}

func mustDo(t *testing.T, c *claim.Claimer[pgx.Tx], r claim.Request, f *runs, want claim.Kind) claim.Outcome {
	t.Helper()
	out, err := c.Do(t.Context(), r, f.fn)
	if err != nil || out.Kind != want {
		t.Fatalf("Do = %v, %v; want %v", out.Kind, err, want)
	}
	return out
}

// TestReplayCache_AnswersWithoutTheStores shows a replay answered from
// process memory: both stores are closed, and a finished key still replays
// its result byte for byte while any other key fails. The same steps
// without the cache fail: the control that the stores were really out of
// reach.
func TestReplayCache_AnswersWithoutTheStores(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		for _, cacheOn := range []bool{true, false} {
			name := mode + "/cache"
			if !cacheOn {
				name = mode + "/no-cache"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				var size int64
				if cacheOn {
					size = 1 << 20
				}
				e := setup(t, mode, claim.WithReplayCache(size))
				f := &runs{body: `{"order":1}`}
				r := req("hot", "v1:a")
				first := mustDo(t, e.c, r, f, claim.Executed)

				e.pool.Close()
				if e.rdb != nil {
					e.rdb.Close()
				}
				out, err := e.c.Do(t.Context(), r, f.fn)
				if !cacheOn {
					if err == nil {
						t.Fatalf("without the cache, with both stores closed: Do = %v, nil; want an error", out.Kind)
					}
					return
				}
				if err != nil || out.Kind != claim.Replayed || !out.FromCache || out.State != durable.Completed ||
					string(out.Result.Body) != `{"order":1}` || out.OperationID != first.OperationID {
					t.Fatalf("Do with both stores closed = %+v, %v; want the cached replay", out, err)
				}
				if n := f.n.Load(); n != 1 {
					t.Fatalf("fn ran %d times, want 1", n)
				}
				// Claim and DoTx answer from it too.
				if out, err := e.c.Claim(t.Context(), r); err != nil || out.Kind != claim.Replayed {
					t.Fatalf("Claim = %v, %v; want Replayed", out.Kind, err)
				}
				// Another key, another payload, another tenant: the stores.
				other := req("hot", "v1:b")
				tenant := r
				tenant.Scope.Tenant = "globex"
				for what, r := range map[string]claim.Request{"another key": req("cold", "v1:a"), "another payload": other, "another tenant": tenant} {
					if out, err := e.c.Do(t.Context(), r, f.fn); err == nil {
						t.Errorf("%s with both stores closed: Do = %v, nil; want an error (only the cached key answers)", what, out.Kind)
					}
				}
			})
		}
	}
}

// TestReplayCache_KeepsTheStoresAnswers checks what the cache must not
// change: a mismatch is still refused, another tenant's key still runs, and
// a record that is not finished (processing, uncertain) is never replayed.
func TestReplayCache_KeepsTheStoresAnswers(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := setup(t, mode, claim.WithReplayCache(1<<20))
			f := &runs{body: `{"order":1}`}
			r := req("k", "v1:a")
			mustDo(t, e.c, r, f, claim.Executed)
			mustDo(t, e.c, r, f, claim.Replayed)

			if _, err := e.c.Do(t.Context(), req("k", "v1:b"), f.fn); !errors.Is(err, claim.ErrMismatch) {
				t.Fatalf("another payload: Do err = %v, want ErrMismatch", err)
			}
			tenant := r
			tenant.Scope.Tenant = "globex"
			mustDo(t, e.c, tenant, f, claim.Executed)
			if n := f.n.Load(); n != 2 {
				t.Fatalf("fn ran %d times, want 2 (one per tenant)", n)
			}

			p := req("pending", "v1:a")
			out := mustClaim(t, e.c, p, claim.Acquired)
			mustClaim(t, e.c, p, claim.InProgress)
			if err := out.Lease.MarkUncertain(t.Context()); err != nil {
				t.Fatal(err)
			}
			mustClaim(t, e.c, p, claim.Uncertain)
			mustClaim(t, e.c, p, claim.Uncertain)
		})
	}
}

// TestReplayCache_EndsWithTheRecord shows an entry dropped no later than its
// record: once the retention has passed, the key runs again, on the
// Claimer that executed it (the entry from its own commit) and on another
// that learned the result from a replay (from Redis's answer, or the
// database's).
func TestReplayCache_EndsWithTheRecord(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			const retention = 3 * time.Second
			opts := []claim.Option{claim.WithReplayCache(1 << 20), claim.WithLease(time.Second), claim.WithRetention(retention)}
			e := setup(t, mode, opts...)
			other := e.newClaimer(e.store, opts...)
			f := &runs{body: `{"order":1}`}
			r := req("short", "v1:a")
			mustDo(t, e.c, r, f, claim.Executed)
			// The record lives for the retention from its finish, which
			// came before Do returned (a slow first call, the breaker
			// opening on a busy machine, must not leave it alive below).
			start := time.Now()
			mustDo(t, e.c, r, f, claim.Replayed)
			mustDo(t, other, r, f, claim.Replayed) // fills other's cache
			if out := mustDo(t, other, r, f, claim.Replayed); !out.FromCache {
				t.Fatal("other's second replay did not come from a cache")
			}

			time.Sleep(time.Until(start.Add(retention + 100*time.Millisecond)))
			f.body = `{"order":2}`
			mustDo(t, e.c, r, f, claim.Executed)
			// The record's second life: other must not answer the first's.
			out, err := other.Do(t.Context(), r, f.fn)
			if err != nil || out.Kind != claim.Replayed || string(out.Result.Body) != `{"order":2}` {
				t.Fatalf("other after the expiry = %v %q, %v; want the second life's replay", out.Kind, body(out), err)
			}
			if n := f.n.Load(); n != 2 {
				t.Fatalf("fn ran %d times, want 2 (once per record life)", n)
			}
		})
	}
}

func body(out claim.Outcome) string {
	if out.Result == nil {
		return ""
	}
	return string(out.Result.Body)
}

// TestDoTx_AReplayOfTheCallersOwnWriteIsNotCached: a second DoTx of a key in
// the transaction that executed it reads the caller's own, uncommitted
// record and replays it. That transaction may roll back, so neither Redis
// nor the replay cache may keep the result: after the rollback the key
// runs. (In Redis mode the first DoTx's Redis lease is let expire, so the
// second reaches the database and could refill Redis from what it read.)
func TestDoTx_AReplayOfTheCallersOwnWriteIsNotCached(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		for _, size := range []int64{1 << 20, 0} { // the cache on, and Redis alone
			t.Run(fmt.Sprintf("%s/cache=%d", mode, size), func(t *testing.T) {
				t.Parallel()
				doTxOwnWriteNotCached(t, mode, size)
			})
		}
	}
}

func doTxOwnWriteNotCached(t *testing.T, mode string, cacheSize int64) {
	const lease = 300 * time.Millisecond
	e := setup(t, mode, claim.WithReplayCache(cacheSize), claim.WithLease(lease), claim.WithStartMargin(10*time.Millisecond))
	ctx := t.Context()
	f := &runs{body: `{"order":1}`}
	fn := func(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) { return f.fn(ctx, tx, op) }
	r := req("in-tx", "v1:a")

	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, finish1, err := e.c.DoTx(ctx, tx, r, fn)
	if err != nil || out.Kind != claim.Executed {
		t.Fatalf("first DoTx = %v, %v", out.Kind, err)
	}
	time.Sleep(lease + 50*time.Millisecond) // the Redis lease expires
	out, finish2, err := e.c.DoTx(ctx, tx, r, fn)
	if err != nil || out.Kind != claim.Replayed {
		t.Fatalf("second DoTx in the same transaction = %v, %v; want Replayed (its own write)", out.Kind, err)
	}
	rbErr := errors.New("rolled back")
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	finish1(ctx, rbErr)
	finish2(ctx, rbErr)

	mustDo(t, e.c, r, f, claim.Executed)
	if n := f.n.Load(); n != 2 {
		t.Fatalf("fn ran %d times, want 2 (the rolled-back run and the new one)", n)
	}
}

// TestResume_CachesNoLongerThanTheRecord: a lease resumed by another
// Claimer (a River worker's, through Claimer.Driver().Resume) keeps the record's
// retention, that of the claim that created it, which may be shorter than
// the resuming Claimer's. Its result must be cached (Redis, the replay
// cache) no longer than the record lives: once the record expired, a retry
// on the worker is a new operation, as on a Claimer without a cache.
func TestResume_CachesNoLongerThanTheRecord(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{withRedis, withoutRed} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			const retention = 2 * time.Second
			e := setup(t, mode)
			ctx := t.Context()
			edge := e.newClaimer(e.store, claim.WithLease(time.Second), claim.WithRetention(retention))
			worker := e.newClaimer(e.store, claim.WithLease(time.Second), claim.WithRetention(time.Hour), claim.WithReplayCache(1<<20))
			r := req("resumed", "v1:a")

			var out claim.Outcome
			if err := edge.Driver().InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				var err error
				out, _, err = edge.Driver().ClaimTx(ctx, tx, r)
				return err
			}); err != nil || out.Kind != claim.Acquired {
				t.Fatalf("the edge's claim = %v, %v", out.Kind, err)
			}
			lease, _, err := worker.Driver().Resume(ctx, r.Scope.Tenant, out.OperationID, out.Lease.Token())
			if err != nil || lease == nil {
				t.Fatalf("Resume = %v, %v", lease, err)
			}
			if err := lease.Complete(ctx, result(`{"life":1}`)); err != nil {
				t.Fatal(err)
			}
			mustClaim(t, worker, r, claim.Replayed)

			time.Sleep(retention + 500*time.Millisecond)
			if rec, err := e.store.Get(ctx, e.ref(r)); err != nil || rec.ExpiresIn > 0 {
				t.Fatalf("the record after its retention: ExpiresIn %v, %v; want expired", rec.ExpiresIn, err)
			}
			got := mustClaim(t, worker, r, claim.Acquired)
			_ = got.Lease.Release(ctx)
		})
	}
}
