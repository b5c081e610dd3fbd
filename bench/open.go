package main

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// openOp is request i of an open-loop run.
type openOp func(ctx context.Context, i int64) (outcome, error)

// openStats accumulate over the open-loop rounds of a variant.
type openStats struct {
	tally                   // latencies from each request's intended send time
	scheduled int64         // requests the arrival schedule held
	sent      int64         // of which started
	dropped   int64         // of which not started: the in-flight cap was reached
	elapsed   time.Duration // from each round's start to its end or its last completion, whichever is later, summed
	rounds    int
}

func (s *openStats) merge(o *openStats) {
	s.tally.merge(&o.tally)
	s.scheduled += o.scheduled
	s.sent += o.sent
	s.dropped += o.dropped
	s.elapsed += o.elapsed
	s.rounds += o.rounds
}

// achieved is the rate of successful requests: those over the time from
// the rounds' starts to their ends or their last completions, whichever
// is later.
func (s *openStats) achieved() float64 {
	if s.elapsed <= 0 {
		return 0
	}
	return float64(s.sent-s.errs) / s.elapsed.Seconds()
}

// runOpen runs op open-loop: request k is intended at start + k/rate, for
// every k whose intended time is before start + d, whether or not the
// earlier requests have finished. Each request runs in its own goroutine;
// when maxInflight are in flight at a request's turn, it is dropped (not
// started, counted). A request's latency runs from its intended time, not
// from when it started, so a late dispatch (a starved scheduler, a burst
// after a stall) counts against it, as it would against a client that
// sent it on time. runOpen returns when every started request has
// finished; a cancelled ctx ends the schedule early.
func runOpen(ctx context.Context, op openOp, rate float64, start time.Time, d time.Duration, maxInflight int) *openStats {
	s := &openStats{rounds: 1}
	var (
		mu       sync.Mutex
		inflight atomic.Int64
		wg       sync.WaitGroup
	)
	interval := float64(time.Second) / rate
	for k := int64(0); ; k++ {
		off := time.Duration(float64(k) * interval)
		if off >= d || ctx.Err() != nil {
			break
		}
		intended := start.Add(off)
		if wait := time.Until(intended); wait > 0 {
			time.Sleep(wait)
		}
		s.scheduled++
		// Only this loop adds to inflight, so the check cannot race
		// another start.
		if inflight.Load() >= int64(maxInflight) {
			s.dropped++
			continue
		}
		inflight.Add(1)
		s.sent++
		wg.Go(func() {
			o, err := op(ctx, k)
			lat := time.Since(intended)
			inflight.Add(-1)
			mu.Lock()
			defer mu.Unlock()
			s.add(lat, o, err)
		})
	}
	wg.Wait()
	// At least the schedule's length: a variant that keeps up achieves
	// the rate, not a little more for the last interval of the schedule.
	s.elapsed = max(time.Since(start), d)
	return s
}

// openRound runs one open-loop round of v at rate for d (n: the round's
// number, -1 for a warm-up).
func openRound(ctx context.Context, e *env, v *variant, n int, rate float64, d time.Duration) (*openStats, error) {
	r := &round{n: n, prefix: "o" + strconv.FormatInt(roundSeq.Add(1), 10) + "-"}
	if v.before != nil {
		if err := v.before(ctx, r); err != nil {
			return nil, err
		}
	}
	runtime.GC() // so one variant's garbage is not collected on another's time
	s := runOpen(ctx, func(ctx context.Context, i int64) (outcome, error) { return v.op(ctx, r, i) },
		rate, time.Now(), d, e.cfg.maxInflight)
	if v.after != nil {
		if err := v.after(ctx, r, s.sent); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// runOpenRounds runs the variants open-loop at rate, alternating as
// runRounds does: rounds of about cfg.openRound, the order rotating each
// round, until each has had per. With warm, each first gets an untimed
// warm-up round at the rate. It returns the stats of the variants, in
// their order.
func runOpenRounds(ctx context.Context, e *env, vs []*variant, rate float64, per time.Duration, warm bool) ([]openStats, error) {
	rounds := max(1, int(per/e.cfg.openRound))
	length := per / time.Duration(rounds)
	if warm {
		for _, v := range vs {
			s, err := openRound(ctx, e, v, -1, rate, min(length, 300*time.Millisecond))
			if err != nil {
				return nil, err
			}
			if s.firstErr != nil {
				return nil, fmt.Errorf("%s: open-loop warm-up: %w", v.name, s.firstErr)
			}
		}
	}
	out := make([]openStats, len(vs))
	for r := range rounds {
		for j := range vs {
			if err := ctx.Err(); err != nil {
				return out, err
			}
			k := (j + r) % len(vs)
			s, err := openRound(ctx, e, vs[k], r, rate, length)
			if err != nil {
				return out, err
			}
			out[k].merge(s)
		}
	}
	return out, nil
}

// openVariants returns the variants of w that run open-loop.
func openVariants(w *workload) ([]*variant, error) {
	var vs []*variant
	for _, v := range w.variants {
		if v.open {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return nil, fmt.Errorf("bench: %s has no open-loop variants", w.name)
	}
	return vs, nil
}

// kneeStep is one variant at one rate of a knee sweep.
type kneeStep struct {
	Rate     float64 `json:"rate"`
	Achieved float64 `json:"achieved_per_second"`
	Sent     int64   `json:"sent"`
	Dropped  int64   `json:"dropped"`
	Errors   int64   `json:"errors"`
	P50us    float64 `json:"p50_us"`
	P99us    float64 `json:"p99_us"`
	P999us   float64 `json:"p999_us"`
	// Exceeded: the p99 was above the bound, or a request was dropped or
	// failed.
	Exceeded bool `json:"exceeded"`
}

// stepOf sums up s, run at rate, against the p99 bound.
func stepOf(rate float64, s *openStats, bound time.Duration) kneeStep {
	p99 := s.h.quantile(0.99)
	return kneeStep{Rate: rate, Achieved: s.achieved(), Sent: s.sent, Dropped: s.dropped, Errors: s.errs,
		P50us: us(s.h.quantile(0.5)), P99us: us(p99), P999us: us(s.h.quantile(0.999)),
		Exceeded: p99 > bound || s.dropped > 0 || s.errs > 0 || s.sent == 0}
}

// kneeSweep steps n variants through rates, in ascending order: at each
// rate, step runs the variants still stepping (their indexes in active)
// and returns their steps in that order. A variant stops stepping once it
// has exceeded the bound at two rates in a row. It returns each variant's
// steps.
func kneeSweep(rates []float64, n int, step func(rate float64, active []int) ([]kneeStep, error)) ([][]kneeStep, error) {
	steps := make([][]kneeStep, n)
	for _, rate := range rates {
		var active []int
		for i := range n {
			if !stopped(steps[i]) {
				active = append(active, i)
			}
		}
		if len(active) == 0 {
			break
		}
		got, err := step(rate, active)
		if err != nil {
			return steps, err
		}
		if len(got) != len(active) {
			return steps, fmt.Errorf("bench: knee: %d steps for %d variants", len(got), len(active))
		}
		for j, i := range active {
			steps[i] = append(steps[i], got[j])
		}
	}
	return steps, nil
}

// stopped reports whether a variant's last two steps exceeded the bound.
func stopped(s []kneeStep) bool {
	n := len(s)
	return n >= 2 && s[n-1].Exceeded && s[n-2].Exceeded
}

// kneeOf returns the knee of a variant's steps: the highest rate at which
// the step stayed within the bound (0: none did), and the lowest rate at
// which it exceeded it (0: none did, so the knee is only a lower bound).
func kneeOf(steps []kneeStep) (knee, firstOver float64) {
	for _, s := range steps {
		switch {
		case !s.Exceeded:
			knee = max(knee, s.Rate)
		case firstOver == 0 || s.Rate < firstOver:
			firstOver = s.Rate
		}
	}
	return knee, firstOver
}

// openWorkload runs w's open-loop variants at cfg.rate and adds them to
// the report.
func openWorkload(ctx context.Context, e *env, rep *report, w *workload) error {
	vs, err := openVariants(w)
	if err != nil {
		return err
	}
	per := e.cfg.duration / time.Duration(len(vs))
	rounds := max(1, int(per/e.cfg.openRound))
	logf("%s open-loop: %d variants at %g/s, %d rounds of %s each, at most %d in flight",
		w.name, len(vs), e.cfg.rate, rounds, fmtDur(per/time.Duration(rounds)), e.cfg.maxInflight)
	start := time.Now()
	stats, err := runOpenRounds(ctx, e, vs, e.cfg.rate, per, true)
	if err != nil {
		return fmt.Errorf("bench: %s open-loop: %w", w.name, err)
	}
	rep.addOpen(w.name, vs, stats)
	logf("%s open-loop: done in %s", w.name, fmtDur(time.Since(start)))
	return nil
}

// kneeWorkload runs the knee sweep of w's open-loop variants and adds it
// to the report.
func kneeWorkload(ctx context.Context, e *env, rep *report, w *workload) error {
	vs, err := openVariants(w)
	if err != nil {
		return err
	}
	cfg := e.cfg
	logf("%s knee: %d variants, p99 bound %s, steps of %s per variant at %v/s",
		w.name, len(vs), fmtDur(cfg.kneeP99), fmtDur(cfg.kneeStep), cfg.kneeRates)
	start := time.Now()
	first := true
	steps, err := kneeSweep(cfg.kneeRates, len(vs), func(rate float64, active []int) ([]kneeStep, error) {
		run := make([]*variant, len(active))
		for j, i := range active {
			run[j] = vs[i]
		}
		stats, err := runOpenRounds(ctx, e, run, rate, cfg.kneeStep, first)
		first = false
		if err != nil {
			return nil, err
		}
		out := make([]kneeStep, len(run))
		var line []string
		for j := range run {
			out[j] = stepOf(rate, &stats[j], cfg.kneeP99)
			mark := ""
			if out[j].Exceeded {
				mark = " over"
			}
			line = append(line, fmt.Sprintf("%s p99 %s%s", run[j].name, fmtUs(out[j].P99us), mark))
			if s := &stats[j]; s.firstErr != nil {
				rep.Failures = append(rep.Failures, fmt.Sprintf("%s knee/%s at %g/s: %d of %d requests failed; first: %s",
					w.name, run[j].name, rate, s.errs, s.sent, s.firstErr))
			}
		}
		logf("%s knee at %g/s: %s", w.name, rate, strings.Join(line, "; "))
		return out, nil
	})
	if err != nil {
		return fmt.Errorf("bench: %s knee: %w", w.name, err)
	}
	rep.addKnee(w.name, vs, steps)
	logf("%s knee: done in %s", w.name, fmtDur(time.Since(start)))
	return nil
}
