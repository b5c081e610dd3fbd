package main

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

// keyBook tracks the keys a storm variant issued and, for the library, how
// often each executed: the effects its transactions committed (a row each
// in storm_effects), and how often fn ran (a duplicate in flight may run
// fn and roll back).
type keyBook struct {
	e         *env
	variant   string
	dups      int64 // requests per key
	perRound  int64 // key budget of one round
	keysAll   atomic.Int64
	keysTimed atomic.Int64
	runs      atomic.Int64 // fn calls
}

// keyOf returns the key index of request i, or errRoundDone past the
// round's budget.
func (b *keyBook) keyOf(i int64) (int64, error) {
	k := i / b.dups
	if k >= b.perRound {
		return 0, errRoundDone
	}
	return k, nil
}

// after books the keys of a round that ran n requests.
func (b *keyBook) after(_ context.Context, r *round, n int64) error {
	keys := (n + b.dups - 1) / b.dups
	b.keysAll.Add(keys)
	if r.n >= 0 {
		b.keysTimed.Add(keys)
	}
	return nil
}

// executed is the storm's business write: one row of the operation in
// storm_effects, in the transaction.
func (b *keyBook) executed(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) {
	b.runs.Add(1)
	if _, err := tx.Exec(ctx, "INSERT INTO "+b.e.schema+".storm_effects (variant, op) VALUES ($1, $2)", b.variant, op.ID); err != nil {
		return durable.Result{}, err
	}
	return result, nil
}

// check returns the most committed executions of one key, the keys
// executed more than once, and the keys issued but never executed.
func (b *keyBook) check(ctx context.Context) (most, twice, never int64, err error) {
	rows, err := b.e.pool.Query(ctx, "SELECT count(*) FROM "+b.e.schema+".storm_effects WHERE variant = $1 GROUP BY op", b.variant)
	if err != nil {
		return 0, 0, 0, err
	}
	counts, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, 0, 0, err
	}
	most, twice, never = b.tally(counts)
	return most, twice, never, nil
}

// tally judges the committed executions of each operation executed.
func (b *keyBook) tally(counts []int64) (most, twice, never int64) {
	for _, n := range counts {
		most = max(most, n)
		if n > 1 {
			twice++
		}
	}
	return most, twice, max(0, b.keysAll.Load()-int64(len(counts)))
}

func stormDo(b *keyBook, c *claim.Claimer[pgx.Tx]) func(ctx context.Context, r *round, i int64) (outcome, error) {
	return func(ctx context.Context, r *round, i int64) (outcome, error) {
		k, err := b.keyOf(i)
		if err != nil {
			return oOther, err
		}
		out, err := c.Do(ctx, request(r.key(k)), b.executed)
		if err != nil {
			return oOther, err
		}
		switch {
		case out.Kind == claim.Executed:
			return oExecuted, nil
		case out.Kind == claim.InProgress:
			return oInProgress, nil
		case out.Kind == claim.Replayed && out.FromCache:
			return oReplayRedis, nil
		case out.Kind == claim.Replayed:
			return oReplayDB, nil
		}
		return oOther, fmt.Errorf("%w: storm answered %v", ErrUnexpected, out.Kind)
	}
}

// stormWorkload: K keys, M duplicates each, taken in order by the workers,
// so a key's duplicates are in flight together.
func stormWorkload(e *env, f *floors) *workload {
	rounds, _ := plan(e.cfg, 3)
	newBook := func(variant string) *keyBook {
		return &keyBook{e: e, variant: variant, dups: int64(e.cfg.dups), perRound: max(1, int64((e.cfg.keys+rounds-1)/rounds))}
	}
	lib, noRedis, floor := newBook("library"), newBook("library-no-redis"), newBook("floor-evalsha")
	atCommitNoRedis := newBook("library-at-commit-no-redis")
	w := &workload{
		name: "storm",
		about: fmt.Sprintf("up to %d keys × %d duplicates, %d workers taking requests in order (Do, FailFast); "+
			"floors: bare EVALSHA of claim.lua, and the library with Redis off, claiming first (the default) and with WithWriteAtCommit",
			e.cfg.keys, e.cfg.dups, e.cfg.concurrency),
		variants: []*variant{
			{name: "library", vs: "floor-evalsha", target: 0.85, op: stormDo(lib, e.withRedis), after: lib.after},
			{name: "library-no-redis", vs: "library-at-commit-no-redis", op: stormDo(noRedis, e.noRedis), after: noRedis.after},
			{name: "library-at-commit-no-redis", vs: "floor-evalsha", op: stormDo(atCommitNoRedis, e.atCommitNoRedis), after: atCommitNoRedis.after},
			{name: "floor-evalsha", floor: true, after: floor.after,
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					k, err := floor.keyOf(i)
					if err != nil {
						return oOther, err
					}
					return f.evalsha(ctx, r.key(k))
				}},
		},
	}
	w.finish = func(ctx context.Context) ([]extra, error) {
		var out []extra
		for _, x := range []struct {
			name       string
			b          *keyBook
			v          *variant
			target     bool
			claimFirst bool
		}{{"library", lib, w.variants[0], true, true}, {"library-no-redis", noRedis, w.variants[1], false, true},
			{"library-at-commit-no-redis", atCommitNoRedis, w.variants[2], false, false}} {
			most, twice, never, err := x.b.check(ctx)
			if err != nil {
				return nil, fmt.Errorf("storm: %s: effects: %w", x.name, err)
			}
			out = append(out, extra{
				Name: x.name + ": most executions of one key", Value: float64(most), Target: "== 1", Check: true,
				Failed: twice > 0 || most != 1,
				Note: fmt.Sprintf("%d keys, %d executed twice or more, %d never (failed requests); fn ran %d times (claiming first once per key; with the write at commit a duplicate in flight may run fn and roll back)",
					x.b.keysAll.Load(), twice, never, x.b.runs.Load()),
			})
			if all := x.b.keysAll.Load(); all > 0 {
				ex := extra{Name: x.name + ": fn runs per key", Value: float64(x.b.runs.Load()) / float64(all),
					Note: fmt.Sprintf("fn ran %d times for %d keys", x.b.runs.Load(), all)}
				if x.claimFirst {
					// Claiming first, fn runs once per record life: a
					// duplicate waits on the claimed row and replays.
					ex.Target, ex.Check, ex.Failed = "== 1", true, x.b.runs.Load() != all
				}
				out = append(out, ex)
			}
			if keys := x.b.keysTimed.Load(); keys > 0 {
				perKey := float64(x.v.st.counts.claims) / float64(keys)
				ex := extra{Name: x.name + ": durable claims per key", Value: perKey,
					Note: fmt.Sprintf("%d claims for %d keys; %.2f statements per key", x.v.st.counts.claims, keys,
						float64(x.v.st.counts.sql)/float64(keys))}
				if x.target {
					ex.Target, ex.Meets = "<= 1.05", boolp(perKey <= 1.05)
				}
				out = append(out, ex)
			}
		}
		out = append(out, extra{Name: "keys per variant (timed rounds)", Value: float64(lib.keysTimed.Load()),
			Note: fmt.Sprintf("library %d, library-no-redis %d, library-at-commit-no-redis %d, floor-evalsha %d", lib.keysTimed.Load(),
				noRedis.keysTimed.Load(), atCommitNoRedis.keysTimed.Load(), floor.keysTimed.Load())})
		return out, nil
	}
	return w
}
