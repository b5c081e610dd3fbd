package main

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/lua"
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
	peer, lk := newBook("peer-redislock"), redislock.New(e.rdb)
	w := &workload{
		name: "storm",
		about: fmt.Sprintf("up to %d keys × %d duplicates, %d workers taking requests in order (Do, FailFast); "+
			"floors: bare EVALSHA of claim.lua, and the library with Redis off, claiming first (the default) and with WithWriteAtCommit; "+
			"the Redis-only peer: bsm/redislock's Obtain (no retry) on the same keys; "+
			"then %d bursts of %d keys × %d duplicates released together on a pool of %d, the library with default lua.Options against the bare EVALSHA",
			e.cfg.keys, e.cfg.dups, e.cfg.concurrency, burstOf(e.cfg).trials, burstOf(e.cfg).keys, burstOf(e.cfg).dups, burstPool),
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
			{name: "peer-redislock", vs: "floor-evalsha", after: peer.after,
				op: func(ctx context.Context, r *round, i int64) (outcome, error) {
					k, err := peer.keyOf(i)
					if err != nil {
						return oOther, err
					}
					return peerObtain(ctx, e, lk, r.key(k))
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
		out = append(out, peerRatio("library / peer-redislock", w.variants[0], w.variants[4], 0.95,
			"the storm's duplicates through Do against redislock's Obtain of the same keys (the issue's bar for the fastest Redis-only peer)"))
		burst, err := measureBurst(ctx, e, f)
		if err != nil {
			return nil, fmt.Errorf("storm: burst: %w", err)
		}
		out = append(out, burst...)
		out = append(out, extra{Name: "keys per variant (timed rounds)", Value: float64(lib.keysTimed.Load()),
			Note: fmt.Sprintf("library %d, library-no-redis %d, library-at-commit-no-redis %d, floor-evalsha %d, peer-redislock %d", lib.keysTimed.Load(),
				noRedis.keysTimed.Load(), atCommitNoRedis.keysTimed.Load(), floor.keysTimed.Load(), peer.keysTimed.Load())})
		return out, nil
	}
	return w
}

// The burst: the storm's duplicates released together rather than taken
// in order by a few workers, on a client whose pool is far smaller than the
// requests in flight, so that most calls queue for a connection. The
// library runs with default lua.Options (only Prefix set), whatever
// -redis-timeout says: it measures what the defaults do under queueing.
const burstPool = 20

// burstSize is the size of the burst: 3 bursts of each side, alternating,
// of 200 keys × 50 duplicates; -smoke, which checks correctness only, sends
// one of 40 × 10.
type burstSize struct{ trials, keys, dups int }

func burstOf(cfg config) burstSize {
	if cfg.smoke {
		return burstSize{trials: 1, keys: 40, dups: 10}
	}
	return burstSize{trials: 3, keys: 200, dups: 50}
}

// burstSide accumulates one side of the burst over its trials.
type burstSide struct {
	tally
	n       int64
	elapsed time.Duration
	cpu     time.Duration // this process's CPU while the side's bursts ran
}

// fire releases n requests at once, each on its own goroutine, and waits
// for all of them.
func (s *burstSide) fire(ctx context.Context, n int64, op func(ctx context.Context, i int64) (outcome, error)) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		start = make(chan struct{})
	)
	runtime.GC()
	for i := range n {
		wg.Go(func() {
			<-start
			t0 := time.Now()
			o, err := op(ctx, i)
			lat := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			s.n++
			s.add(lat, o, err)
		})
	}
	t0, cpu0 := time.Now(), processCPU()
	close(start)
	wg.Wait()
	s.elapsed += time.Since(t0)
	s.cpu += processCPU() - cpu0
}

// cpuPer is this process's CPU per request of the side, in µs.
func (s *burstSide) cpuPer() float64 {
	if s.n == 0 {
		return 0
	}
	return us(s.cpu) / float64(s.n)
}

func (s *burstSide) rate() float64 {
	if s.elapsed <= 0 {
		return 0
	}
	return float64(s.n) / s.elapsed.Seconds()
}

// burstEvalsha is floor-evalsha on client c.
func burstEvalsha(ctx context.Context, c *redis.Client, f *floors, key string) (outcome, error) {
	return f.evalshaOn(ctx, c, key)
}

// measureBurst runs bursts (burstOf) of keys × duplicates requests
// through the library (Do, default lua.Options), as many of the bare
// EVALSHA and as many of the peer's Obtain, alternating, each side on a
// client of its own with a pool of burstPool connections, and reports the
// library's throughput ratios to the floor and the peer, its breaker
// openings and whether each key executed once.
func measureBurst(ctx context.Context, e *env, f *floors) ([]extra, error) {
	newClient := func() (*redis.Client, error) {
		ropt, err := redis.ParseURL(e.cfg.redis)
		if err != nil {
			return nil, err
		}
		ropt.PoolSize = burstPool
		ropt.ContextTimeoutEnabled = true
		return redis.NewClient(ropt), nil
	}
	libClient, err := newClient()
	if err != nil {
		return nil, err
	}
	defer libClient.Close()
	floorClient, err := newClient()
	if err != nil {
		return nil, err
	}
	defer floorClient.Close()
	peerClient, err := newClient()
	if err != nil {
		return nil, err
	}
	defer peerClient.Close()
	lk := redislock.New(peerClient)
	var opens atomic.Int64
	rc := fastpath.WithHooks(libClient, fastpath.Hooks{OnStateChange: func(s fastpath.BreakerState) {
		if s == fastpath.BreakerOpen {
			opens.Add(1)
		}
	}})
	c, err := claim.New[pgx.Tx](e.store, claim.WithLease(benchLease), claim.WithRetention(benchRetention),
		claim.WithRedis(rc, lua.Options{Prefix: e.prefix}))
	if err != nil {
		return nil, err
	}
	size := burstOf(e.cfg)
	book := &keyBook{e: e, variant: "burst-library", dups: int64(size.dups), perRound: int64(size.keys)}
	do := stormDo(book, c)
	var lib, floor, peer burstSide
	n, dups := int64(size.keys*size.dups), int64(size.dups)
	var claims, stmts int64
	for t := range size.trials {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r := &round{n: t, prefix: "burst-floor-" + randName("") + "-"}
		floor.fire(ctx, n, func(ctx context.Context, i int64) (outcome, error) {
			return burstEvalsha(ctx, floorClient, f, r.key(i/dups))
		})
		r = &round{n: t, prefix: "burst-peer-" + randName("") + "-"}
		peer.fire(ctx, n, func(ctx context.Context, i int64) (outcome, error) {
			return peerObtain(ctx, e, lk, r.key(i/dups))
		})
		r = &round{n: t, prefix: "burst-lib-" + randName("") + "-"}
		before := e.counts()
		lib.fire(ctx, n, func(ctx context.Context, i int64) (outcome, error) { return do(ctx, r, i) })
		claims += e.counts().claims - before.claims
		stmts += e.counts().sql - before.sql
		if err := book.after(ctx, r, n); err != nil {
			return nil, err
		}
	}
	if floor.errs > 0 {
		return nil, fmt.Errorf("floor-evalsha: %d of %d failed, first: %w", floor.errs, floor.n, floor.firstErr)
	}
	if peer.errs > 0 {
		return nil, fmt.Errorf("peer-redislock: %d of %d failed, first: %w", peer.errs, peer.n, peer.firstErr)
	}
	most, twice, never, err := book.check(ctx)
	if err != nil {
		return nil, err
	}
	vsFloor, vsPeer := ratio(lib.rate(), floor.rate()), ratio(lib.rate(), peer.rate())
	keys := book.keysAll.Load()
	out := []extra{
		{Name: "burst: library / floor-evalsha (released together, default lua.Options)", Value: vsFloor,
			Target: ">= 0.85", Meets: boolp(vsFloor >= 0.85),
			Note: fmt.Sprintf("%d bursts each of %d keys × %d duplicates on a pool of %d: library %.0f/s p50 %s p99 %s "+
				"(%d executed, %d replayed from redis, %d from the db, %d in progress, %d failed); floor-evalsha %.0f/s p50 %s p99 %s",
				size.trials, size.keys, size.dups, burstPool,
				lib.rate(), fmtDur(lib.h.quantile(0.5)), fmtDur(lib.h.quantile(0.99)),
				lib.outcomes[oExecuted], lib.outcomes[oReplayRedis], lib.outcomes[oReplayDB], lib.outcomes[oInProgress], lib.errs,
				floor.rate(), fmtDur(floor.h.quantile(0.5)), fmtDur(floor.h.quantile(0.99))) +
				fmt.Sprintf("; a request here costs this process %.0fµs of CPU against the floor's %.0fµs, and %.2f statements "+
					"(the executions' transactions, which share the machine with the servers)",
					lib.cpuPer(), floor.cpuPer(), float64(stmts)/float64(max(lib.n, 1)))},
		{Name: "burst: library / peer-redislock (released together, default options each)", Value: vsPeer,
			Target: ">= 0.95", Meets: boolp(vsPeer >= 0.95),
			Note: fmt.Sprintf("redislock's Obtain (no retry) on the same bursts: %.0f/s p50 %s p99 %s (%d acquired, %d busy); "+
				"this process's CPU %.0fµs per request",
				peer.rate(), fmtDur(peer.h.quantile(0.5)), fmtDur(peer.h.quantile(0.99)),
				peer.outcomes[oAcquired], peer.outcomes[oBusy], peer.cpuPer())},
		{Name: "burst: breaker openings", Value: float64(opens.Load()), Target: "== 0", Meets: boolp(opens.Load() == 0),
			Note: fmt.Sprintf("%d durable claims for %d keys", claims, keys)},
		{Name: "burst: most executions of one key", Value: float64(most), Target: "== 1", Check: true,
			Failed: twice > 0 || most != 1 || never > 0,
			Note:   fmt.Sprintf("%d keys, %d executed twice or more, %d never; fn ran %d times", keys, twice, never, book.runs.Load())},
	}
	if lib.errs > 0 {
		out[0].Note += fmt.Sprintf("; first library error: %v", lib.firstErr)
	}
	return out, nil
}
