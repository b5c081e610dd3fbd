package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

// keyBook tracks the keys a storm variant issued and, for the library, how
// often each executed.
type keyBook struct {
	dups      int64 // requests per key
	perRound  int64 // key budget of one round
	keysAll   atomic.Int64
	keysTimed atomic.Int64
	execs     sync.Map // operation ID → *atomic.Int64
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

// executed is the storm's business write: it counts executions per
// operation.
func (b *keyBook) executed(_ context.Context, _ pgx.Tx, op claim.Op) (durable.Result, error) {
	v, _ := b.execs.LoadOrStore(op.ID, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
	return result, nil
}

// check returns the most executions of one key, the keys executed more
// than once, and the keys issued but never executed.
func (b *keyBook) check() (most, twice, never int64) {
	var executed int64
	b.execs.Range(func(_, v any) bool {
		n := v.(*atomic.Int64).Load()
		executed++
		most = max(most, n)
		if n > 1 {
			twice++
		}
		return true
	})
	return most, twice, max(0, b.keysAll.Load()-executed)
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
	newBook := func() *keyBook {
		return &keyBook{dups: int64(e.cfg.dups), perRound: max(1, int64((e.cfg.keys+rounds-1)/rounds))}
	}
	lib, noRedis, floor := newBook(), newBook(), newBook()
	w := &workload{
		name: "storm",
		about: fmt.Sprintf("up to %d keys × %d duplicates, %d workers taking requests in order (Do, FailFast); "+
			"floors: bare EVALSHA of claim.lua, and the library with Redis off", e.cfg.keys, e.cfg.dups, e.cfg.concurrency),
		variants: []*variant{
			{name: "library", vs: "floor-evalsha", target: 0.85, op: stormDo(lib, e.withRedis), after: lib.after},
			{name: "library-no-redis", vs: "floor-evalsha", op: stormDo(noRedis, e.noRedis), after: noRedis.after},
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
	w.finish = func(context.Context) ([]extra, error) {
		var out []extra
		for _, x := range []struct {
			name   string
			b      *keyBook
			v      *variant
			target bool
		}{{"library", lib, w.variants[0], true}, {"library-no-redis", noRedis, w.variants[1], false}} {
			most, twice, never := x.b.check()
			out = append(out, extra{
				Name: x.name + ": most executions of one key", Value: float64(most), Target: "== 1", Check: true,
				Failed: twice > 0 || most != 1,
				Note:   fmt.Sprintf("%d keys, %d executed twice or more, %d never (failed requests)", x.b.keysAll.Load(), twice, never),
			})
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
			Note: fmt.Sprintf("library %d, library-no-redis %d, floor-evalsha %d", lib.keysTimed.Load(),
				noRedis.keysTimed.Load(), floor.keysTimed.Load())})
		return out, nil
	}
	return w
}
