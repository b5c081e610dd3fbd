package claim_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/lua"
)

// hintSetup returns setup's env for mode, with its orders table, and a
// Claimer over a store that records the ExpectNew hint of every durable
// claim, with setup's Redis in front (for BreakerOpen, one that never
// answers).
func hintSetup(t *testing.T, mode string) (*env, *claim.Claimer[pgx.Tx], *hints) {
	t.Helper()
	e := setup(t, mode)
	e.orders()
	h := &hints{Store: e.store}
	if mode != breakerOpen {
		return e, e.newClaimer(h), h
	}
	c, err := claim.New[pgx.Tx](h, claim.WithRedis(deadRedis(t), lua.Options{Prefix: "dead", BreakerFailures: 1, BreakerCoolDown: time.Hour}))
	if err != nil {
		t.Fatal(err)
	}
	return e, c, h
}

// want fails the test unless the durable claims since the last call
// carried the ExpectNew hints want.
func (h *hints) want(t *testing.T, what string, want ...bool) {
	t.Helper()
	if got := h.take(); !slices.Equal(got, want) {
		t.Fatalf("%s: store claims carried ExpectNew %v; want %v", what, got, want)
	}
}

// hints records the ExpectNew hint of every durable claim a Claimer sends.
type hints struct {
	storeapi.Store[pgx.Tx]
	mu   sync.Mutex
	seen []bool
}

func (h *hints) Claim(ctx context.Context, tx pgx.Tx, p storeapi.ClaimParams) (storeapi.ClaimResult, error) {
	h.mu.Lock()
	h.seen = append(h.seen, p.ExpectNew)
	h.mu.Unlock()
	return h.Store.Claim(ctx, tx, p)
}

// take returns the hints recorded since the last take.
func (h *hints) take() []bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.seen
	h.seen = nil
	return s
}

// The Claimer tells the store to expect a new record (ExpectNew: on
// PostgreSQL, a plain insert first, the full claim only if it inserted
// nothing) when Redis has just granted the key. Without Redis's grant (no
// Redis, or its breaker open) a Claimer starts with the full claim first,
// so a replay the database answers stays one statement, and sets the hint
// only once its recent claims were mostly new keys
// (TestClaimer_ExpectNewLearnsWithoutRedis). Outcomes never depend on the
// hint (the store contract runs with it on every claim,
// TestContractExpectNew); this test forces when it is set, for each entry
// point. Redis emptied after a completion grants the key again: the hint
// is then wrong, and the store must still replay, not run fn again.
func TestClaimer_ExpectNewWhenRedisGranted(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e, c, h := hintSetup(t, mode)
			ctx := t.Context()
			granted := mode == withRedis
			want := func(what string, w ...bool) { t.Helper(); h.want(t, what, w...) }

			if out, err := c.Claim(ctx, req("en-claim", "v1:a")); err != nil || out.Kind != claim.Acquired {
				t.Fatalf("Claim = %v, %v", out.Kind, err)
			}
			want("fresh Claim", granted)

			r := req("en-do", "v1:a")
			out, err := c.Do(ctx, r, e.insertOrder)
			if err != nil || out.Kind != claim.Executed {
				t.Fatalf("Do = %v, %v", out.Kind, err)
			}
			want("fresh Do", granted)

			tx, err := e.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			txOut, finish, err := c.DoTx(ctx, tx, req("en-dotx", "v1:a"), e.insertOrder)
			if err != nil || txOut.Kind != claim.Executed {
				t.Fatalf("DoTx = %v, %v", txOut.Kind, err)
			}
			err = tx.Commit(ctx)
			finish(ctx, err)
			if err != nil {
				t.Fatal(err)
			}
			want("fresh DoTx", granted)

			// Redis loses the finished record: it grants the key again,
			// the hint says new, and the store finds the record.
			e.flushRedis()
			rep, err := c.Do(ctx, r, e.insertOrder)
			if err != nil || rep.Kind != claim.Replayed || string(rep.Result.Body) != string(out.Result.Body) {
				t.Fatalf("Do after Redis lost the record = %v, %v; want the replay", rep.Kind, err)
			}
			if mode == withRedis {
				want("Do after Redis lost the record", true)
			} else {
				want("Do of a finished key", false)
			}
			e.wantOrders(t, out.OperationID, 1)
			rec, err := e.store.Get(ctx, e.ref(r))
			if err != nil || rec.State != durable.Completed {
				t.Fatalf("record = %v, %v; want completed", rec.State, err)
			}
		})
	}
}

// Without Redis's grant, the guess follows the Claimer's recent claims:
// the full claim in Do's transaction at first; the hint on after 16 new
// keys in a row (each then costs the plain insert alone), off again once
// found records outweigh new keys two to one; and once found records are
// well ahead, Do reads first: a replay is then one statement, a new key
// one more than in the transaction alone. Every outcome stays right while
// the guess is wrong: replays replay, and fn ran once per key.
func TestClaimer_ExpectNewLearnsWithoutRedis(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{withoutRed, breakerOpen} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e, c, h := hintSetup(t, mode)
			ctx := t.Context()
			var reqs []claim.Request
			var first []claim.Outcome
			fresh := func(i int) (stmts int64) {
				t.Helper()
				r := req(fmt.Sprintf("learn-%d", i), "v1:a")
				e.stmts.Reset()
				out, err := c.Do(ctx, r, e.insertOrder)
				if err != nil || out.Kind != claim.Executed {
					t.Fatalf("Do %d = %v, %v", i, out.Kind, err)
				}
				reqs, first = append(reqs, r), append(first, out)
				return e.stmts.Count()
			}
			replay := func(i int) (stmts int64) {
				t.Helper()
				e.stmts.Reset()
				rep, err := c.Do(ctx, reqs[i], e.insertOrder)
				if err != nil || rep.Kind != claim.Replayed || string(rep.Result.Body) != string(first[i].Result.Body) {
					t.Fatalf("replay of %d = %v, %v; want the first answer", i, rep.Kind, err)
				}
				return e.stmts.Count()
			}
			inTx := fresh(0) // cold: the full claim in the transaction
			for i := 1; i < 17; i++ {
				fresh(i)
			}
			h.want(t, "17 new keys", slices.Concat(slices.Repeat([]bool{false}, 16), []bool{true})...)

			// Replays: the first carries the hint (the insert finds the
			// record), and from the second the full claim goes first again.
			for i := range 3 {
				replay(i)
			}
			h.want(t, "3 replays after 17 new keys", true, false, false)
			// 14 more found records take the score below -16: Do reads first.
			for i := range 14 {
				if n := replay(3 + i); n != 3 {
					t.Fatalf("replay %d in Do's transaction sent %d statements; want BEGIN, the claim, COMMIT", 3+i, n)
				}
			}
			h.want(t, "14 more replays", slices.Repeat([]bool{false}, 14)...)
			if n := replay(0); n != 1 {
				t.Fatalf("a replay once found records are well ahead sent %d statements; want the read alone", n)
			}
			h.want(t, "a replay answered by the read")
			if n := fresh(17); n != inTx+1 {
				t.Fatalf("a new key while reading first sent %d statements; want the read and the transaction's %d", n, inTx)
			}
			h.want(t, "a new key after the read", false)
			for _, out := range first {
				e.wantOrders(t, out.OperationID, 1)
			}
		})
	}
}

// Concurrent duplicates without Redis, with the guess at each of its three
// settings: new keys (the plain insert first), neither (the full claim in
// the transaction) and recorded keys (Do reads first). Each key's fn runs
// once, and every caller gets the first caller's answer, whether it waited
// on the row, read an uncommitted record as absent, or replayed from the
// read.
func TestClaimer_GuessUnderConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	for _, score := range []int32{32, 0, -32} {
		t.Run(fmt.Sprintf("score=%d", score), func(t *testing.T) {
			t.Parallel()
			e, c, _ := hintSetup(t, withoutRed)
			ctx := t.Context()
			const keys, dups = 12, 6
			var wg sync.WaitGroup
			outs := make([][dups]claim.Outcome, keys)
			errs := make(chan error, keys*dups)
			for k := range keys {
				for d := range dups {
					wg.Go(func() {
						claim.SetGuess(c, score) // held there: each call sees it
						out, err := c.Do(ctx, req(fmt.Sprintf("dup-%d", k), "v1:a"), e.insertOrder)
						if err != nil {
							errs <- fmt.Errorf("key %d, call %d: %w", k, d, err)
						}
						outs[k][d] = out
					})
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			for k := range keys {
				executed := 0
				for d, out := range outs[k] {
					switch out.Kind {
					case claim.Executed:
						executed++
					case claim.Replayed:
					default:
						t.Fatalf("key %d, call %d: %v; want executed or replayed", k, d, out.Kind)
					}
					if string(out.Result.Body) != string(outs[k][0].Result.Body) || out.OperationID != outs[k][0].OperationID {
						t.Fatalf("key %d: call %d answered %s (%s), call 0 %s (%s)", k, d,
							out.Result.Body, out.OperationID, outs[k][0].Result.Body, outs[k][0].OperationID)
					}
				}
				if executed != 1 {
					t.Fatalf("key %d executed %d times", k, executed)
				}
				e.wantOrders(t, outs[k][0].OperationID, 1)
			}
		})
	}
}

// With WithWriteAtCommit, Do reads first on its own when Redis did not
// answer; the guess adds no second read, whatever it says: a replay is the
// read alone, and a key another worker holds costs the same statements at
// every score.
func TestClaimer_GuessAddsNoReadToWriteAtCommit(t *testing.T) {
	t.Parallel()
	e := setup(t, withoutRed, claim.WithWriteAtCommit())
	e.orders()
	ctx := t.Context()
	done := req("at-commit-done", "v1:a")
	first, err := e.c.Do(ctx, done, e.insertOrder)
	if err != nil || first.Kind != claim.Executed {
		t.Fatalf("Do = %v, %v", first.Kind, err)
	}
	held := req("at-commit-held", "v1:a")
	lease := mustClaim(t, e.c, held, claim.Acquired).Lease
	t.Cleanup(func() { _ = lease.Release(context.WithoutCancel(ctx)) })
	stmts := map[int32][2]int64{}
	for _, score := range []int32{0, 32, -32} {
		claim.SetGuess(e.c, score)
		e.stmts.Reset()
		rep, err := e.c.Do(ctx, done, e.insertOrder)
		if err != nil || rep.Kind != claim.Replayed || string(rep.Result.Body) != string(first.Result.Body) {
			t.Fatalf("score %d: replay = %v, %v; want the first answer", score, rep.Kind, err)
		}
		replay := e.stmts.Count()
		e.stmts.Reset()
		busy, err := e.c.Do(ctx, held, e.insertOrder)
		if err != nil || busy.Kind != claim.InProgress {
			t.Fatalf("score %d: Do on a held key = %v, %v; want InProgress", score, busy.Kind, err)
		}
		stmts[score] = [2]int64{replay, e.stmts.Count()}
	}
	if stmts[0][0] != 1 {
		t.Errorf("a replay with the write at commit sent %d statements; want its read alone", stmts[0][0])
	}
	for _, score := range []int32{32, -32} {
		if stmts[score] != stmts[0] {
			t.Errorf("score %d: replay and held key sent %v statements; at score 0 %v", score, stmts[score], stmts[0])
		}
	}
	e.wantOrders(t, first.OperationID, 1)
}

// While Do reads first, a key reused with another payload is rejected
// from the read: ErrMismatch, one statement, fn not run.
func TestClaimer_ReadFirstRejectsAnotherPayload(t *testing.T) {
	t.Parallel()
	e, c, _ := hintSetup(t, withoutRed)
	ctx := t.Context()
	first, err := c.Do(ctx, req("read-first-reused", "v1:a"), e.insertOrder)
	if err != nil || first.Kind != claim.Executed {
		t.Fatalf("Do = %v, %v", first.Kind, err)
	}
	claim.SetGuess(c, -32)
	e.stmts.Reset()
	ran := false
	_, err = c.Do(ctx, req("read-first-reused", "v1:b"), func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
		ran = true
		return durable.Result{}, nil
	})
	if !errors.Is(err, durable.ErrMismatch) || ran {
		t.Fatalf("Do with another payload = %v, fn ran %v; want ErrMismatch, fn not run", err, ran)
	}
	if n := e.stmts.Count(); n != 1 {
		t.Errorf("the mismatch sent %d statements; want the read alone", n)
	}
	e.wantOrders(t, first.OperationID, 1)
}
