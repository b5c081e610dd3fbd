package main

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"
)

// The workloads of issue 43 (finished-burst, wake) do not fit the closed
// loop: a burst of retries released together, or a holder and the
// duplicates waiting on it, is one unit of measurement. Their variants
// still run side by side as the others do: each gets one untimed warm-up
// round, then rounds alternate, the order rotating every round, until the
// workload's -duration is spent (at least one timed round each). Each timed
// round is booked into the variant's stats like a closed-loop round (its
// answers and their latencies, wall time, this process's CPU, allocations,
// statements and Redis commands), so the table, the JSON and the plots show
// these variants like any other.

// side is how a self-measured workload runs one round of a variant.
type side struct {
	v *variant
	// before runs untimed before each round (the warm-up's included).
	before func(ctx context.Context) error
	// run runs one round, tallying each answer (its latency and outcome)
	// into t; timed is false for the warm-up, whose answers are dropped.
	// Its own bookkeeping (a burst's count of replays) should count timed
	// rounds only.
	run func(ctx context.Context, t *tally, timed bool) error
}

// alternateSides runs the warm-up and then the timed rounds of sides for
// the run's -duration.
func alternateSides(ctx context.Context, e *env, sides []side) error {
	for _, s := range sides {
		if err := sideRound(ctx, e, s, false); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(e.cfg.duration)
	for r := 0; r == 0 || time.Now().Before(deadline); r++ {
		for j := range sides {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := sideRound(ctx, e, sides[(j+r)%len(sides)], true); err != nil {
				return err
			}
		}
	}
	return nil
}

// sideRound runs one round of s and, when timed, books it into its
// variant's stats.
func sideRound(ctx context.Context, e *env, s side, timed bool) error {
	if s.before != nil {
		if err := s.before(ctx); err != nil {
			return fmt.Errorf("%s: %w", s.v.name, err)
		}
	}
	runtime.GC() // so one variant's garbage is not collected on another's time
	var (
		t        tally
		ms0, ms1 runtime.MemStats
	)
	runtime.ReadMemStats(&ms0)
	c0, cpu0, start := e.counts(), processCPU(), time.Now()
	err := s.run(ctx, &t, timed)
	elapsed, cpu1, c1 := time.Since(start), processCPU(), e.counts()
	runtime.ReadMemStats(&ms1)
	if err != nil {
		return fmt.Errorf("%s: %w", s.v.name, err)
	}
	if !timed {
		if t.firstErr != nil {
			return fmt.Errorf("%s: warm-up: %w", s.v.name, t.firstErr)
		}
		return nil
	}
	st := &s.v.st
	st.rounds++
	st.elapsed += elapsed
	st.mallocs += ms1.Mallocs - ms0.Mallocs
	st.cpu += cpu1 - cpu0
	st.counts = st.counts.add(c1.sub(c0))
	st.ops += int64(t.h.n)
	st.roundP99 = append(st.roundP99, t.h.quantile(0.99))
	st.tally.merge(&t)
	return nil
}

// together releases n requests at once, each on its own goroutine, waits
// for all of them and tallies each answer into t, with its latency from
// the release.
func together(ctx context.Context, n int, t *tally, op func(ctx context.Context) (outcome, error)) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		start = make(chan struct{})
	)
	for range n {
		wg.Go(func() {
			<-start
			t0 := time.Now()
			o, err := op(ctx)
			lat := time.Since(t0)
			mu.Lock()
			t.add(lat, o, err)
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
}

// oneAtATime sends n requests one after the other and tallies each answer
// into t.
func oneAtATime(ctx context.Context, n int, t *tally, op func(ctx context.Context) (outcome, error)) {
	for range n {
		t0 := time.Now()
		o, err := op(ctx)
		t.add(time.Since(t0), o, err)
	}
}

// replayed is how many of t's answers were replays, from anywhere.
func (t *tally) replayed() int64 {
	return t.outcomes[oReplayRedis] + t.outcomes[oReplayDB] + t.outcomes[oReplayCache]
}
