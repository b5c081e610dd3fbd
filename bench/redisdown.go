package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/internal/fastpath"
)

// opening is what the first requests paid while the breaker opened.
type opening struct {
	kind     string
	requests int64         // requests started before the breaker opened
	p50, max time.Duration // their latency
	toOpen   time.Duration // from the first request to the breaker opening
	redis    int64         // Redis commands sent meanwhile
	opened   bool
}

// measureOpening sends fresh requests from every worker through a new
// Claimer on a dead Redis until its breaker opens, then one more round of
// requests, and reports the latency of those started before it opened.
func measureOpening(ctx context.Context, e *env, blackhole bool, keep bool) (opening, *claim.Claimer[pgx.Tx], *deadRedis, error) {
	o := opening{kind: "refused"}
	if blackhole {
		o.kind = "black hole"
	}
	dead, err := newDeadRedis(blackhole, e.cfg.redisTimeout, e.cfg.concurrency+8, e.rc)
	if err != nil {
		return o, nil, nil, err
	}
	var openedAt atomic.Int64 // unix ns
	c, err := e.claimer(dead.client, func(s fastpath.BreakerState) {
		if s == fastpath.BreakerOpen {
			openedAt.CompareAndSwap(0, time.Now().UnixNano())
		}
	})
	if err != nil {
		dead.close()
		return o, nil, nil, err
	}
	var (
		h        hist
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
		seq      atomic.Int64
	)
	prefix := randName("open-") + "-"
	r0 := e.counts().redis
	start := time.Now()
	limit := start.Add(10 * time.Second) // a breaker that never opens must not hang the run
	for range e.cfg.concurrency {
		wg.Go(func() {
			for after := 0; after < 1 && time.Now().Before(limit) && ctx.Err() == nil; {
				t0 := time.Now()
				_, err := doFresh(ctx, c, prefix+strconv.FormatInt(seq.Add(1), 10))
				lat := time.Since(t0)
				at := openedAt.Load()
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if at == 0 || t0.UnixNano() < at {
					h.record(lat)
				}
				mu.Unlock()
				if at != 0 {
					after++
				}
			}
		})
	}
	wg.Wait()
	o.redis = e.counts().redis - r0
	if at := openedAt.Load(); at != 0 {
		o.opened, o.toOpen = true, time.Duration(at-start.UnixNano())
	}
	o.requests, o.p50, o.max = int64(h.n), h.quantile(0.5), time.Duration(h.max)
	if !keep || firstErr != nil {
		dead.close()
		c, dead = nil, nil
	}
	return o, c, dead, firstErr
}

// redisDownWorkload: the library with its Redis black-holed (the breaker
// open) against the library with no Redis at all.
func redisDownWorkload(e *env) *workload {
	var (
		c     *claim.Claimer[pgx.Tx]
		dead  *deadRedis
		opens []opening
	)
	w := &workload{
		name: "redis-down",
		about: "fresh keys through Do with Redis black-holed (breaker open; a half-open probe each cool-down pays the " +
			"per-call timeout) against the library with Redis off; first, the requests paid while the breaker opens",
	}
	lib := &variant{name: "library-breaker-open", vs: "library-no-redis", target: 0.80,
		op: func(ctx context.Context, r *round, i int64) (outcome, error) { return doFresh(ctx, c, r.key(i)) }}
	w.variants = []*variant{lib,
		{name: "library-no-redis", floor: true,
			op: func(ctx context.Context, r *round, i int64) (outcome, error) {
				return doFresh(ctx, e.noRedis, r.key(i))
			}},
	}
	w.prepare = func(ctx context.Context) error {
		for _, blackhole := range []bool{false, true} {
			o, cc, d, err := measureOpening(ctx, e, blackhole, blackhole)
			if err != nil {
				return fmt.Errorf("bench: redis-down: opening (%s): %w", o.kind, err)
			}
			opens = append(opens, o)
			if blackhole {
				c, dead = cc, d
			}
		}
		return nil
	}
	w.finish = func(context.Context) ([]extra, error) {
		if dead != nil {
			dead.close()
		}
		var out []extra
		for _, o := range opens {
			out = append(out, extra{
				Name: "breaker opening (" + o.kind + "): slowest request before it opened", Value: us(o.max), Unit: "µs",
				Check: true, Failed: !o.opened,
				Note: fmt.Sprintf("%d requests started before it opened, p50 %s, opened after %s, %d Redis commands",
					o.requests, fmtDur(o.p50), fmtDur(o.toOpen), o.redis),
			})
		}
		return out, nil
	}
	return w
}
