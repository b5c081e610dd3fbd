package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/bsm/redislock"
	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/internal/fastpath"
)

// replayCacheBytes is the size of the replay cache of the
// library-replay-cache variant: room for every replay key many times over.
const replayCacheBytes = 64 << 20

// replayWorkload: completed keys retried, answered from Redis or from the
// database, against a bare EVALSHA and a bare SELECT.
func replayWorkload(e *env, f *floors) *workload {
	keys := make([]string, e.cfg.replayKeys)
	for i := range keys {
		keys[i] = "replay-" + strconv.Itoa(i)
	}
	key := func(i int64) string { return keys[i%int64(len(keys))] }
	// replay retries a completed key. Any replay is fine; so is "in
	// progress" (a Redis lease left behind by a Redis call that timed out
	// holds the key until it expires): both are legal answers, counted in
	// the outcomes. Only an error fails the request.
	replay := func(c *claim.Claimer[pgx.Tx], useDo bool) func(ctx context.Context, _ *round, i int64) (outcome, error) {
		cached := c == e.replayCache
		return func(ctx context.Context, _ *round, i int64) (outcome, error) {
			var (
				out claim.Outcome
				err error
			)
			if useDo {
				out, err = c.Do(ctx, request(key(i)), emptyWrite)
			} else {
				out, err = c.Claim(ctx, request(key(i)))
			}
			switch {
			case err != nil:
				return oOther, err
			case out.Kind == claim.Replayed && out.FromCache && cached:
				return oReplayCache, nil
			case out.Kind == claim.Replayed && out.FromCache:
				return oReplayRedis, nil
			case out.Kind == claim.Replayed:
				return oReplayDB, nil
			case out.Kind == claim.InProgress:
				return oInProgress, nil
			}
			return oOther, fmt.Errorf("%w: a completed key answered %v", ErrUnexpected, out.Kind)
		}
	}
	lk := redislock.New(e.rdb)
	w := &workload{
		name: "replay",
		about: fmt.Sprintf("%d completed keys retried round-robin; floors: bare EVALSHA of claim.lua (cached result), "+
			"the library's claim statement alone on the pool, a bare SELECT of the stored result; "+
			"the Redis-only peer: bsm/redislock's Obtain (no retry) of the same keys, each held since the workload began", len(keys)),
		variants: []*variant{
			{name: "library", vs: "floor-evalsha", target: 0.90, open: true, op: replay(e.withRedis, true)},
			// Hot keys with WithReplayCache: every key's result fits in
			// the cache, so after its first replay (from Redis) the
			// process answers.
			{name: "library-replay-cache", vs: "floor-evalsha", target: 3, op: replay(e.replayCache, true)},
			{name: "floor-evalsha", floor: true, open: true,
				op: func(ctx context.Context, _ *round, i int64) (outcome, error) { return f.evalsha(ctx, key(i)) }},
			{name: "peer-redislock", vs: "floor-evalsha",
				op: func(ctx context.Context, _ *round, i int64) (outcome, error) { return peerObtain(ctx, e, lk, key(i)) }},
			{name: "library-db-do", vs: "floor-select", target: 0.50, op: replay(e.noRedis, true)},
			{name: "library-db-claim", vs: "floor-claim-sql", op: replay(e.noRedis, false)},
			{name: "floor-claim-sql", floor: true, vs: "floor-select",
				op: func(ctx context.Context, _ *round, i int64) (outcome, error) { return f.claimRow(ctx, key(i)) }},
			{name: "floor-select", floor: true,
				op: func(ctx context.Context, _ *round, i int64) (outcome, error) { return f.selectRow(ctx, key(i)) }},
		},
	}
	// prepare completes every key once, through Redis (with the setup
	// Claimer's long timeout), so each is cached there and durable.
	w.prepare = func(ctx context.Context) error {
		var (
			next     atomic.Int64
			wg       sync.WaitGroup
			mu       sync.Mutex
			firstErr error
		)
		for range e.cfg.concurrency {
			wg.Go(func() {
				for {
					i := next.Add(1) - 1
					if i >= int64(len(keys)) || ctx.Err() != nil {
						return
					}
					if _, err := doFresh(ctx, e.setup, keys[i]); err != nil {
						mu.Lock()
						firstErr = err
						mu.Unlock()
						return
					}
				}
			})
		}
		wg.Wait()
		if firstErr != nil {
			return fmt.Errorf("bench: replay: completing the keys: %w", firstErr)
		}
		for _, k := range keys { // the peer's locks, held through the rounds
			o, err := peerObtain(ctx, e, lk, k)
			if err != nil {
				return fmt.Errorf("bench: replay: %w", err)
			}
			if o != oAcquired {
				return fmt.Errorf("%w: the peer's lock on a fresh key answered %s", ErrUnexpected, outcomeNames[o])
			}
		}
		return ensureCached(ctx, e, keys)
	}
	w.finish = func(context.Context) ([]extra, error) {
		return []extra{peerRatio("library / peer-redislock", w.variants[0], w.variants[3], 0,
			"replays from Redis through Do against redislock's Obtain of a held key: each one EVALSHA, the library's answering with the stored result")}, nil
	}
	return w
}

// ensureCached makes sure every key's result is in the Redis cache: a
// completion whose Redis call timed out (on a loaded machine) leaves it
// uncached, and maybe a lease behind. The lease is dropped and the library
// refills the cache from the database. It uses the setup Claimer, whose
// Redis timeout is long.
func ensureCached(ctx context.Context, e *env, keys []string) error {
	for _, k := range keys {
		rk := fastpath.KeysFor(e.prefix, scope(k).Ref(nil))
		for attempt := 0; ; attempt++ {
			st, err := fastpath.ReadStored(ctx, e.rdb, rk)
			if err != nil {
				return fmt.Errorf("bench: replay: %w", err)
			}
			if st.Kind == fastpath.StoredResult {
				break
			}
			if attempt == 3 {
				return fmt.Errorf("bench: replay: a completed key's result could not be cached in Redis")
			}
			if err := e.rdb.Del(ctx, rk.Record).Err(); err != nil {
				return fmt.Errorf("bench: replay: %w", err)
			}
			if _, err := e.setup.Claim(ctx, request(k)); err != nil { // a durable replay refills the cache
				return fmt.Errorf("bench: replay: refill: %w", err)
			}
		}
	}
	return nil
}
