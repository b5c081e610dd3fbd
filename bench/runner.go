package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// outcome classifies one request, for the report.
type outcome int

const (
	oExecuted    outcome = iota // the library ran the function
	oReplayRedis                // the library replayed from Redis
	oReplayDB                   // the library replayed from the durable store
	oReplayCache                // the library replayed from a cache (Redis or in process) with WithReplayCache on
	oInProgress                 // the library answered in progress
	oAcquired                   // a floor claimed the key
	oBusy                       // a floor found the key held
	oCached                     // a floor found the cached result
	oRead                       // a floor read the row
	oOther
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"executed", "replayed_redis", "replayed_db", "replayed_cache", "in_progress",
	"acquired", "busy", "cached", "read", "other"}

// errRoundDone ends a round early (a key budget reached); it is not a
// failure.
var errRoundDone = errors.New("bench: round done")

// round is what an operation knows of its round.
type round struct {
	n      int    // round number; -1 for the warm-up
	prefix string // key prefix unique to the variant and the round
	stop   atomic.Bool
}

// key returns the key of index i in this round. It allocates once.
func (r *round) key(i int64) string {
	var b [64]byte
	return string(strconv.AppendInt(append(b[:0], r.prefix...), i, 10))
}

// variant is one way of doing a workload's request: the library in some
// configuration, or a floor.
type variant struct {
	name  string
	floor bool
	// vs names the variant of the same workload whose throughput this one
	// is compared to; target is the least ratio the project aims at (0:
	// none).
	vs     string
	target float64
	// costs compare the variant to floors by cost, each with a ceiling.
	costs []costTarget
	// open puts the variant in the open-loop runs (-rate, -knee).
	open bool
	// op runs request i of round r.
	op func(ctx context.Context, r *round, i int64) (outcome, error)
	// before runs, untimed, before each round (and the warm-up).
	before func(ctx context.Context, r *round) error
	// background, when set, runs during each timed round; the round ends
	// when it returns (or at its deadline, whichever is first).
	background func(ctx context.Context, r *round)
	// after runs, untimed, after each round with the number of requests
	// the round ran.
	after func(ctx context.Context, r *round, n int64) error

	st stats
}

// costTarget compares a variant to a floor by cost: the floor's throughput
// over the variant's, how many times more a request of the variant costs.
// The target is a ceiling: the ratio must stay at or under atMost; with
// atMost 0 the ratio is reported, with no target.
type costTarget struct {
	floor  string
	atMost float64
}

// tally accumulates the answers to requests: the latency of each, the
// errors (the first one kept) and the outcomes of the others.
type tally struct {
	h        hist
	errs     int64
	firstErr error
	outcomes [numOutcomes]int64
}

// add counts one request's answer.
func (t *tally) add(lat time.Duration, o outcome, err error) {
	t.h.record(lat)
	if err != nil {
		t.errs++
		if t.firstErr == nil {
			t.firstErr = err
		}
		return
	}
	t.outcomes[o]++
}

// merge adds o's answers to t's.
func (t *tally) merge(o *tally) {
	t.h.merge(&o.h)
	t.errs += o.errs
	if t.firstErr == nil {
		t.firstErr = o.firstErr
	}
	for k, c := range o.outcomes {
		t.outcomes[k] += c
	}
}

// stats accumulate over the timed rounds of a variant.
type stats struct {
	tally
	ops     int64
	elapsed time.Duration
	counts  counts
	mallocs uint64
	cpu     time.Duration // this process's CPU time (the servers' is not counted)
	rounds  int
	// roundP99 is each timed round's p99, in round order: a workload can
	// compare a variant with another round by round (the rounds alternate,
	// so round i of each ran side by side).
	roundP99 []time.Duration
}

type worker struct {
	tally
	ops int64
}

// runRounds runs the variants of a workload in alternation: each gets one
// untimed warm-up, then rounds of cfg.round, the order rotating each round,
// until each has had its share of cfg.duration.
func runRounds(ctx context.Context, e *env, vs []*variant) error {
	rounds, length := plan(e.cfg, len(vs))
	warm := min(length, 300*time.Millisecond)
	for _, v := range vs {
		if err := runRound(ctx, e, v, -1, warm); err != nil {
			return err
		}
	}
	for r := range rounds {
		for j := range vs {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := runRound(ctx, e, vs[(j+r)%len(vs)], r, length); err != nil {
				return err
			}
		}
	}
	return nil
}

var roundSeq atomic.Int64

// runRound runs one round of v with cfg.concurrency workers for d.
func runRound(ctx context.Context, e *env, v *variant, n int, d time.Duration) error {
	r := &round{n: n, prefix: "r" + strconv.FormatInt(roundSeq.Add(1), 10) + "-"}
	if v.before != nil {
		if err := v.before(ctx, r); err != nil {
			return err
		}
	}
	workers := make([]*worker, e.cfg.concurrency)
	for i := range workers {
		workers[i] = &worker{}
	}
	var next atomic.Int64
	runtime.GC() // so one variant's garbage is not collected on another's time
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	c0 := e.counts()
	cpu0 := processCPU()
	start := time.Now()
	timer := time.AfterFunc(d, func() { r.stop.Store(true) })
	var bg sync.WaitGroup
	if v.background != nil && n >= 0 {
		bg.Go(func() {
			v.background(ctx, r)
			r.stop.Store(true)
		})
	}
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() {
			for !r.stop.Load() && ctx.Err() == nil {
				i := next.Add(1) - 1
				t0 := time.Now()
				o, err := v.op(ctx, r, i)
				lat := time.Since(t0)
				if errors.Is(err, errRoundDone) {
					r.stop.Store(true)
					return
				}
				w.ops++
				w.add(lat, o, err)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	timer.Stop()
	r.stop.Store(true)
	bg.Wait()
	cpu1 := processCPU()
	c1 := e.counts()
	runtime.ReadMemStats(&ms1)

	var ran int64
	for _, w := range workers {
		ran += w.ops
	}
	if v.after != nil {
		if err := v.after(ctx, r, ran); err != nil {
			return err
		}
	}
	if n < 0 {
		for _, w := range workers {
			if w.firstErr != nil {
				// A variant that fails its warm-up would fail every round.
				return fmt.Errorf("%s: warm-up: %w", v.name, w.firstErr)
			}
		}
		return nil
	}
	s := &v.st
	var rh hist
	for _, w := range workers {
		rh.merge(&w.h)
	}
	s.roundP99 = append(s.roundP99, rh.quantile(0.99))
	s.rounds++
	s.elapsed += elapsed
	s.mallocs += ms1.Mallocs - ms0.Mallocs
	s.cpu += cpu1 - cpu0
	s.counts = s.counts.add(c1.sub(c0))
	for _, w := range workers {
		s.ops += w.ops
		s.tally.merge(&w.tally)
	}
	return nil
}
