package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/testkit/testenv"
)

func TestHist(t *testing.T) {
	t.Parallel()
	t.Run("BucketsCoverEveryValue", func(t *testing.T) {
		r := rand.New(rand.NewPCG(1, 2))
		for range 100000 {
			v := r.Uint64() >> r.IntN(64)
			i := bucketOf(v)
			if i < 0 || i >= histBuckets {
				t.Fatalf("bucketOf(%d) = %d out of range", v, i)
			}
			if lo := bucketLow(i); lo > v {
				t.Fatalf("bucketLow(bucketOf(%d)) = %d > value", v, lo)
			}
			if i+1 < histBuckets && bucketLow(i+1) <= v {
				t.Fatalf("value %d at or past the next bucket %d", v, bucketLow(i+1))
			}
		}
	})
	t.Run("QuantilesWithinTheBucketError", func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 4))
		vals := make([]time.Duration, 50000)
		var h hist
		for i := range vals {
			vals[i] = time.Duration(r.ExpFloat64() * float64(time.Millisecond))
			h.record(vals[i])
		}
		slices.Sort(vals)
		for _, q := range []float64{0.5, 0.9, 0.99, 0.999, 1} {
			exact := vals[int(q*float64(len(vals)))-1]
			got := h.quantile(q)
			if diff := float64(got-exact) / float64(exact); diff > 0.032 || diff < -0.032 {
				t.Errorf("quantile(%v) = %v, exact %v (off by %.1f%%)", q, got, exact, diff*100)
			}
		}
		if got := h.quantile(1); got != vals[len(vals)-1] {
			t.Errorf("quantile(1) = %v, want the max %v", got, vals[len(vals)-1])
		}
	})
	t.Run("MergeAddsAndEmptyIsZero", func(t *testing.T) {
		var a, b, empty hist
		a.record(time.Millisecond)
		b.record(3 * time.Millisecond)
		a.merge(&b)
		if a.n != 2 || a.quantile(1) != 3*time.Millisecond || a.quantile(0.5) > 1100*time.Microsecond {
			t.Errorf("merged: n %d, max %v, p50 %v", a.n, a.quantile(1), a.quantile(0.5))
		}
		if empty.quantile(0.99) != 0 {
			t.Error("empty histogram has a quantile")
		}
	})
}

func TestKeyBook(t *testing.T) {
	t.Parallel()
	b := &keyBook{dups: 10, perRound: 3}
	_ = b.after(context.Background(), &round{n: 0}, 35) // 4 keys
	most, twice, never := b.tally([]int64{1, 1, 2})     // a, b, and c twice
	if most != 2 || twice != 1 || never != 1 {
		t.Fatalf("check = most %d, twice %d, never %d; want 2, 1, 1", most, twice, never)
	}
	if b.keysTimed.Load() != 4 {
		t.Fatalf("keys timed = %d, want 4", b.keysTimed.Load())
	}
	if _, err := b.keyOf(29); err != nil {
		t.Fatalf("keyOf(29): %v", err)
	}
	if _, err := b.keyOf(30); !errors.Is(err, errRoundDone) {
		t.Fatalf("keyOf(30) = %v, want errRoundDone past the budget", err)
	}
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	t.Run("SmokeShortensWhatIsNotGiven", func(t *testing.T) {
		c, err := parseFlags([]string{"-smoke", "-keys", "7"}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if c.duration != 2*time.Second || c.keys != 7 || !slices.Equal(c.workloads, allWorkloads) {
			t.Fatalf("smoke config: duration %v, keys %d, workloads %v", c.duration, c.keys, c.workloads)
		}
	})
	t.Run("SmokeAddsOpenLoop", func(t *testing.T) {
		c, err := parseFlags([]string{"-smoke"}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if !c.closed || c.rate != 100 || !slices.Equal(c.open, openWorkloads) || c.knee {
			t.Fatalf("smoke: closed %v, rate %v, open %v, knee %v", c.closed, c.rate, c.open, c.knee)
		}
	})
	t.Run("RateReplacesTheClosedLoop", func(t *testing.T) {
		c, err := parseFlags([]string{"-rate", "1000"}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if c.closed || c.rate != 1000 || !slices.Equal(c.workloads, openWorkloads) || !slices.Equal(c.open, openWorkloads) {
			t.Fatalf("-rate: closed %v, rate %v, workloads %v, open %v", c.closed, c.rate, c.workloads, c.open)
		}
	})
	t.Run("KneeDefaults", func(t *testing.T) {
		c, err := parseFlags([]string{"-knee", "-workload", "replay"}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if c.closed || !c.knee || !slices.Equal(c.open, []string{"replay"}) || len(c.kneeRates) < 5 ||
			!slices.IsSorted(c.kneeRates) || c.kneeP99 <= 0 || c.kneeStep <= 0 {
			t.Fatalf("-knee: closed %v, open %v, rates %v, p99 %v, step %v", c.closed, c.open, c.kneeRates, c.kneeP99, c.kneeStep)
		}
	})
	for _, args := range [][]string{{"-workload", "fresh,nope"}, {"-concurrency", "0"}, {"-dups", "0"}, {"extra"},
		{"-rate", "-1"}, {"-rate", "NaN"}, {"-rate", "+Inf"}, {"-rate", "10", "-max-inflight", "0"},
		{"-rate", "10", "-open-round", "0s"}, {"-rate", "10", "-workload", "storm"}, {"-knee", "-workload", "fresh,sweep"},
		{"-knee", "-knee-rates", "100,50"}, {"-knee", "-knee-rates", "100,100"}, {"-knee", "-knee-rates", "0,10"},
		{"-knee", "-knee-rates", "10,x"}, {"-knee", "-knee-rates", ""}, {"-knee", "-knee-p99", "0s"},
		{"-knee", "-knee-step", "1ms"}} {
		if _, err := parseFlags(args, &bytes.Buffer{}); !errors.Is(err, ErrConfig) {
			t.Errorf("parseFlags(%q) = %v, want ErrConfig", args, err)
		}
	}
}

// slowTarget is a fake server that takes 50ms a request; with serial, one
// request at a time (a queue in front of one worker).
type slowTarget struct {
	serial bool
	mu     sync.Mutex
}

func (s *slowTarget) op(context.Context, int64) (outcome, error) {
	if s.serial {
		s.mu.Lock()
		defer s.mu.Unlock()
	}
	time.Sleep(50 * time.Millisecond)
	return oExecuted, nil
}

// TestRunOpen checks that the open-loop scheduler measures from each
// request's intended send time, so a target that cannot keep up shows its
// queue, where a closed-loop measurement of the same target hides it.
func TestRunOpen(t *testing.T) {
	t.Parallel()
	t.Run("QueueShowsWhereClosedLoopHidesIt", func(t *testing.T) {
		t.Parallel()
		// 100/s for 300ms is 30 requests into a server that does 20/s:
		// request k waits for the k before it, so the last finish about
		// 1.5s after the start, more than a second after they were due.
		target := &slowTarget{serial: true}
		s := runOpen(t.Context(), target.op, 100, time.Now(), 300*time.Millisecond, 1000)
		if s.scheduled != 30 || s.sent != 30 || s.dropped != 0 || s.errs != 0 || s.outcomes[oExecuted] != 30 {
			t.Fatalf("scheduled %d, sent %d, dropped %d, errors %d, executed %d; want 30 sent, none dropped",
				s.scheduled, s.sent, s.dropped, s.errs, s.outcomes[oExecuted])
		}
		open := s.h.quantile(0.99)
		if open < 500*time.Millisecond {
			t.Errorf("open-loop p99 = %v, want far above the 50ms of one request", open)
		}
		// The negative control: one closed-loop worker on the same target
		// sees 50ms a request and no queue at all.
		e := &env{cfg: config{concurrency: 1}, sql: &sqlCounter{}, rc: &redisCounter{}}
		v := &variant{name: "slow", op: func(ctx context.Context, _ *round, i int64) (outcome, error) { return target.op(ctx, i) }}
		if err := runRound(t.Context(), e, v, 0, 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		closed := v.st.h.quantile(0.99)
		if v.st.ops == 0 || closed < 50*time.Millisecond || closed*4 > open {
			t.Errorf("closed-loop p99 = %v over %d requests, open-loop p99 = %v: want the closed loop to hide the queue",
				closed, v.st.ops, open)
		}
	})
	t.Run("CapDropsAndCounts", func(t *testing.T) {
		t.Parallel()
		// One in flight at a time, 50ms each, 100 due a second for 500ms:
		// at most about 11 can start; the rest are dropped, and counted.
		target := &slowTarget{}
		s := runOpen(t.Context(), target.op, 100, time.Now(), 500*time.Millisecond, 1)
		if s.scheduled != 50 || s.sent+s.dropped != s.scheduled || s.sent < 1 || s.dropped < 25 {
			t.Fatalf("scheduled %d, sent %d, dropped %d; want 50 = sent + dropped, most dropped", s.scheduled, s.sent, s.dropped)
		}
		if s.h.n != uint64(s.sent) {
			t.Errorf("%d latencies recorded for %d sent: a dropped request has no latency", s.h.n, s.sent)
		}
	})
	t.Run("LateDispatchCountsFromTheIntendedTime", func(t *testing.T) {
		t.Parallel()
		// A schedule that started a second ago: the first 100 requests are
		// overdue by 1s down to 10ms when they are sent. An instant target
		// answers them at once, so only the intended time makes them slow.
		instant := func(context.Context, int64) (outcome, error) { return oExecuted, nil }
		s := runOpen(t.Context(), instant, 100, time.Now().Add(-time.Second), 1200*time.Millisecond, 1000)
		if s.scheduled != 120 || s.sent != 120 {
			t.Fatalf("scheduled %d, sent %d; want 120", s.scheduled, s.sent)
		}
		if got := s.h.quantile(1); got < time.Second {
			t.Errorf("max latency %v; want at least the 1s request 0 was overdue", got)
		}
		// The 60th smallest of 20 on-time and 100 overdue by 10ms..1s is
		// overdue by at least 400ms.
		if got := s.h.quantile(0.5); got < 300*time.Millisecond {
			t.Errorf("p50 %v; want the overdue time counted", got)
		}
	})
	t.Run("CancelEndsTheSchedule", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		s := runOpen(ctx, (&slowTarget{}).op, 100, time.Now(), time.Hour, 10)
		if s.scheduled != 0 {
			t.Errorf("a cancelled run scheduled %d requests", s.scheduled)
		}
	})
}

func TestKnee(t *testing.T) {
	t.Parallel()
	const bound = 20 * time.Millisecond
	rates := []float64{100, 200, 400, 800, 1600, 3200, 6400}
	// p99 by variant and rate: variant 0 is over at 400, within at 800
	// (noise), over at 1600 and 3200, and stops there; variant 1 never
	// goes over; variant 2 is over from the start; variant 3 drops
	// requests at 800 and up, with a p99 within the bound.
	p99 := []map[float64]time.Duration{
		{100: 5 * time.Millisecond, 200: 8 * time.Millisecond, 400: 30 * time.Millisecond, 800: 15 * time.Millisecond,
			1600: 90 * time.Millisecond, 3200: time.Second, 6400: time.Second},
		{},
		{100: time.Second, 200: time.Second, 400: time.Second},
		{},
	}
	var calls [][]int
	steps, err := kneeSweep(rates, len(p99), func(rate float64, active []int) ([]kneeStep, error) {
		calls = append(calls, slices.Clone(active))
		out := make([]kneeStep, len(active))
		for j, i := range active {
			var s openStats
			s.sent = 10
			s.h.record(p99[i][rate] + time.Millisecond)
			if i == 3 && rate >= 800 {
				s.dropped = 1
			}
			out[j] = stepOf(rate, &s, bound)
		}
		return out, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := [][]int{{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 3}, {0, 1, 3}, {0, 1, 3}, {0, 1}, {1}}
	if !slices.EqualFunc(calls, want, slices.Equal) {
		t.Errorf("variants stepped per rate = %v, want %v", calls, want)
	}
	for i, w := range []struct {
		steps           int
		knee, firstOver float64
	}{{6, 800, 400}, {7, 6400, 0}, {2, 0, 100}, {5, 400, 800}} {
		knee, over := kneeOf(steps[i])
		if len(steps[i]) != w.steps || knee != w.knee || over != w.firstOver {
			t.Errorf("variant %d: %d steps, knee %v, first over %v; want %d, %v, %v", i, len(steps[i]), knee, over, w.steps, w.knee, w.firstOver)
		}
	}
	if _, err := kneeSweep(rates, 1, func(float64, []int) ([]kneeStep, error) { return nil, nil }); err == nil {
		t.Error("a step function that returns no steps is not an error")
	}
}

func TestReport_FailuresFailTheRun(t *testing.T) {
	t.Parallel()
	cfg := config{duration: time.Second, round: time.Second}
	lib := &variant{name: "library", vs: "floor", target: 0.85}
	lib.st = stats{tally: tally{errs: 2, firstErr: errors.New("boom")}, ops: 80, elapsed: time.Second, rounds: 1}
	floor := &variant{name: "floor", floor: true}
	floor.st = stats{ops: 100, elapsed: time.Second, rounds: 1}
	rep := newReport(cfg)
	rep.add(&workload{name: "w", variants: []*variant{lib, floor}},
		[]extra{{Name: "most executions of one key", Value: 2, Check: true, Failed: true}})
	v := rep.Workloads[0].Variants[0]
	if v.Ratio != 0.8 || v.Meets == nil || *v.Meets {
		t.Errorf("ratio %v meets %v, want 0.8 missing 0.85", v.Ratio, v.Meets)
	}
	if len(rep.Failures) != 2 {
		t.Fatalf("failures = %q, want the errors and the failed check", rep.Failures)
	}
	var out bytes.Buffer
	rep.table(&out)
	for _, want := range []string{"MISSED", "[2 errors]", "FAILED", "FAILURE"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestReport_CostTargetsAreCeilings(t *testing.T) {
	t.Parallel()
	cfg := config{duration: time.Second, round: time.Second}
	mk := func(name string, ops int64, costs ...costTarget) *variant {
		v := &variant{name: name, costs: costs}
		v.st = stats{ops: ops, elapsed: time.Second, rounds: 1}
		return v
	}
	cheap := mk("cheap", 80, costTarget{floor: "floor", atMost: 1.3}) // costs 1.25×
	dear := mk("dear", 50, costTarget{floor: "floor", atMost: 1.45})  // costs 2×
	floor := mk("floor", 100)
	rep := newReport(cfg)
	rep.add(&workload{name: "w", variants: []*variant{cheap, dear, floor}}, nil)
	for i, want := range []struct {
		ratio float64
		meets bool
	}{{1.25, true}, {2, false}} {
		c := rep.Workloads[0].Variants[i].Costs
		if len(c) != 1 || c[0].Ratio != want.ratio || !c[0].AtMost || c[0].Meets == nil || *c[0].Meets != want.meets {
			t.Errorf("variant %d: costs %+v, want ratio %v meets %v", i, c, want.ratio, want.meets)
		}
	}
	if len(rep.Failures) != 0 {
		t.Errorf("a missed target is a failure: %q", rep.Failures)
	}
	var out bytes.Buffer
	rep.table(&out)
	for _, want := range []string{"costs 1.25× floor", "≤ 1.30× met", "costs 2.00× floor", "≤ 1.45× MISSED"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// Each missed target gets a line that says, from the same run, where the
// variant differs from its floor or which floor bounds it; a met target
// gets none.
func TestReport_MissedSaysWhatBoundsIt(t *testing.T) {
	t.Parallel()
	cfg := config{duration: time.Second, round: time.Second}
	mk := func(name string, floor bool, ops int64, cpu time.Duration, vs string, target float64, costs ...costTarget) *variant {
		v := &variant{name: name, floor: floor, vs: vs, target: target, costs: costs}
		v.st = stats{ops: ops, elapsed: time.Second, rounds: 1, cpu: cpu * time.Duration(ops)}
		return v
	}
	biz := costTarget{floor: "business"}
	vars := []*variant{
		// 0.80 of its floor; 2.50× business against its floor's 2.00×.
		mk("library", false, 40, 150*time.Microsecond, "floor", 0.90, costTarget{floor: "business", atMost: 1.7}),
		// A floor over its own ceiling.
		mk("floor", true, 50, 100*time.Microsecond, "", 0, costTarget{floor: "business", atMost: 1.5}),
		// 2.00× business against a floor of 1.25×: the library's share.
		mk("lean", false, 50, 90*time.Microsecond, "lean-floor", 0.5, costTarget{floor: "business", atMost: 1.45}),
		mk("lean-floor", true, 80, 60*time.Microsecond, "", 0, biz),
		// Meets both: no line.
		mk("fine", false, 90, 60*time.Microsecond, "lean-floor", 1.0, costTarget{floor: "business", atMost: 1.2}),
		mk("business", true, 100, 50*time.Microsecond, "", 0),
	}
	rep := newReport(cfg)
	rep.add(&workload{name: "w", variants: vars}, nil)
	got := rep.Workloads[0].Missed
	want := []string{
		"library is 0.80 of floor (target ≥ 0.90); a request beyond the floor's: +50µs of this process's CPU (150µs against 100µs), +0.00 Redis calls, +0.00 statements, +0 allocations",
		"library costs 2.50× business (ceiling 1.70×): bounded by its floor, floor alone costs 2.00×, over the ceiling; the library adds 1.25× on top",
		"floor costs 2.00× business (ceiling 1.50×): a floor, the protocol's statements alone with no library code; the record and its round trips bound it",
		"lean costs 2.00× business (ceiling 1.45×): its floor lean-floor costs 1.25×, within the ceiling; the library's own share misses it (0.62 of the floor)",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("missed:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var out bytes.Buffer
	rep.table(&out)
	if !strings.Contains(out.String(), "- w, missed: "+want[1]) {
		t.Errorf("table lacks the missed lines:\n%s", out.String())
	}
	if strings.Contains(out.String(), "fine is") || strings.Contains(out.String(), "fine costs") {
		t.Errorf("a met target got a line:\n%s", out.String())
	}
}

// A variant that misses its ratio to a floor without Redis, and has a cost
// against a floor that makes its Redis calls too, is told what it costs
// against that floor; a floor with fewer Redis calls is not named.
func TestReport_MissedNamesTheFloorWithItsRedisCalls(t *testing.T) {
	t.Parallel()
	cfg := config{duration: time.Second, round: time.Second}
	mk := func(name string, floor bool, ops, redisCalls int64, cpu time.Duration, vs string, target float64, costs ...costTarget) *variant {
		v := &variant{name: name, floor: floor, vs: vs, target: target, costs: costs}
		v.st = stats{ops: ops, elapsed: time.Second, rounds: 1, cpu: cpu * time.Duration(ops)}
		v.st.counts.redis = redisCalls * ops
		return v
	}
	vars := []*variant{
		mk("library", false, 80, 2, 150*time.Microsecond, "sql-floor", 0.90,
			costTarget{floor: "sql-floor-redis"}, costTarget{floor: "other-floor"}),
		mk("sql-floor", true, 100, 0, 100*time.Microsecond, "", 0),
		mk("sql-floor-redis", true, 64, 2, 160*time.Microsecond, "", 0),
		mk("other-floor", true, 100, 1, 100*time.Microsecond, "", 0),
	}
	rep := newReport(cfg)
	rep.add(&workload{name: "w", variants: vars}, nil)
	got := rep.Workloads[0].Missed
	want := []string{
		"library is 0.80 of sql-floor (target ≥ 0.90); a request beyond the floor's: +50µs of this process's CPU (150µs against 100µs), +2.00 Redis calls, +0.00 statements, +0 allocations" +
			"; against sql-floor-redis, which also makes its 2.00 Redis calls, it costs 0.80× (-10µs of CPU)",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("missed:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A missed cost ceiling is bounded by the floor that also makes the
// variant's Redis calls, when it has a cost to the same floor, rather than
// by the floor of its throughput ratio (without Redis).
func TestReport_MissedCeilingNamesTheFloorWithItsRedisCalls(t *testing.T) {
	t.Parallel()
	cfg := config{duration: time.Second, round: time.Second}
	mk := func(name string, floor bool, ops, redisCalls int64, vs string, target float64, costs ...costTarget) *variant {
		v := &variant{name: name, floor: floor, vs: vs, target: target, costs: costs}
		v.st = stats{ops: ops, elapsed: time.Second, rounds: 1, cpu: 100 * time.Microsecond * time.Duration(ops)}
		v.st.counts.redis = redisCalls * ops
		return v
	}
	biz := costTarget{floor: "business"}
	vars := []*variant{
		mk("library", false, 40, 2, "sql-floor", 0.5,
			costTarget{floor: "business", atMost: 2}, costTarget{floor: "sql-floor-redis"}),
		mk("sql-floor", true, 80, 0, "", 0, biz),
		mk("sql-floor-redis", true, 40, 2, "", 0, biz),
		mk("business", true, 100, 0, "", 0),
	}
	rep := newReport(cfg)
	rep.add(&workload{name: "w", variants: vars}, nil)
	want := []string{
		"library costs 2.50× business (ceiling 2.00×): bounded by its floor, sql-floor-redis alone costs 2.50×, over the ceiling; the library adds 1.00× on top",
	}
	if got := rep.Workloads[0].Missed; !slices.Equal(got, want) {
		t.Fatalf("missed:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A cost with no ceiling is reported, and judged by nothing.
func TestReport_CostWithoutTargetIsOnlyReported(t *testing.T) {
	t.Parallel()
	cfg := config{duration: time.Second, round: time.Second}
	v := &variant{name: "second-floor", floor: true, costs: []costTarget{{floor: "floor"}}}
	v.st = stats{ops: 80, elapsed: time.Second, rounds: 1}
	floor := &variant{name: "floor", floor: true}
	floor.st = stats{ops: 100, elapsed: time.Second, rounds: 1}
	rep := newReport(cfg)
	rep.add(&workload{name: "w", variants: []*variant{v, floor}}, nil)
	c := rep.Workloads[0].Variants[0].Costs
	if len(c) != 1 || c[0].Ratio != 1.25 || c[0].AtMost || c[0].Meets != nil || c[0].Target != 0 {
		t.Fatalf("costs %+v, want ratio 1.25 with no target", c)
	}
	var out bytes.Buffer
	rep.table(&out)
	if !strings.Contains(out.String(), "costs 1.25× floor") {
		t.Errorf("table lacks the ratio:\n%s", out.String())
	}
	if strings.Contains(out.String(), "≤") {
		t.Errorf("table shows a target for a cost without one:\n%s", out.String())
	}
}

func TestReport_Knee(t *testing.T) {
	t.Parallel()
	cfg := config{kneeP99: 20 * time.Millisecond, kneeStep: time.Second, kneeRates: []float64{100, 200, 400}}
	lib := &variant{name: "library", vs: "floor"}
	floor := &variant{name: "floor", floor: true}
	steps := [][]kneeStep{
		{{Rate: 100, P99us: 1000}, {Rate: 200, P99us: 30000, Exceeded: true}, {Rate: 400, P99us: 90000, Exceeded: true}},
		{{Rate: 100, P99us: 900}, {Rate: 200, P99us: 1000}, {Rate: 400, P99us: 1100, Dropped: 3, Exceeded: true}},
	}
	rep := newReport(cfg)
	rep.addKnee("w", []*variant{lib, floor}, steps)
	k := rep.Knee[0].Variants
	if k[0].Knee != 100 || k[0].FirstOver != 200 || k[1].Knee != 200 || k[1].FirstOver != 400 {
		t.Fatalf("knees %v/%v and %v/%v, want 100/200 and 200/400", k[0].Knee, k[0].FirstOver, k[1].Knee, k[1].FirstOver)
	}
	if r := k[0].Ratios; len(r) != 1 || r[0].Vs != "floor" || r[0].Ratio != 0.5 || !r[0].Bounded {
		t.Errorf("knee ratios %+v, want library / floor 0.5", r)
	}
	var out bytes.Buffer
	rep.table(&out)
	for _, want := range []string{"knee (p99 ≤ 20.0ms)", "| library | 100/s | 200/s |", "3 dropped", "library / floor: 0.50 (100/s / 200/s)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// The checks of issue 43's workloads fail the run when a retry of a
// finished operation, or a waiting duplicate, was not replayed.
func TestIssue43Checks(t *testing.T) {
	t.Parallel()
	cfg := config{duration: time.Second, round: time.Second}
	ok := &finishedCase{name: "large", burst: &variant{}, floor: &variant{}, single: &variant{}, bursts: 3, fewest: finishedRetries}
	bad := &finishedCase{name: "lost", burst: &variant{}, floor: &variant{}, single: &variant{}, bursts: 3, fewest: finishedRetries - 1, inProgress: 1}
	ws := &wakeSide{v: &variant{name: "claim-redis"}, redis: true, trials: 2, fewest: wakeWaiters - 1}
	floor := &wakeSide{v: &variant{name: "floor-redis", floor: true}, trials: 2, fewest: wakeWaiters}
	var extras []extra
	extras = append(extras, ok.extras()...)
	extras = append(extras, bad.extras()...)
	extras = append(extras, ws.extras(floor)...)
	extras = append(extras, floor.extras(floor)...)
	failed := map[string]bool{}
	for _, x := range extras {
		if x.Check {
			failed[x.Name] = x.Failed
		}
	}
	want := map[string]bool{
		"large: fewest replayed of 50 in a burst":       false,
		"lost: fewest replayed of 50 in a burst":        true,
		"claim-redis: fewest replayed of 20 in a trial": true,
		"floor-redis: fewest replayed of 20 in a trial": false,
	}
	if !maps.Equal(failed, want) {
		t.Fatalf("checks failed = %v, want %v", failed, want)
	}
	rep := newReport(cfg)
	rep.add(&workload{name: "issue43"}, extras)
	if len(rep.Failures) != 2 {
		t.Fatalf("failures = %q, want the lost burst and the waiters", rep.Failures)
	}
	if got, most := medianMax([]time.Duration{3, 1, 2}); got != 2 || most != 3 {
		t.Errorf("medianMax = %v, %v; want 2, 3", got, most)
	}
}

// Issue 44's checks on the realistic transaction fail the run when a key
// answered executed has no ledger entry or two, when orders, lines or
// ledger rows do not match the keys executed, or when the stock was taken
// other than once per key.
func TestRealisticChecks(t *testing.T) {
	t.Parallel()
	good := realBook{
		sides: []realSideBook{
			{name: "a", executed: 3, qty: 5, ledgerRows: 3, distincts: 3},
			{name: "b", executed: 2, qty: 4, ledgerRows: 2, distincts: 2},
		},
		orders: 5, lines: 10, ledger: 5, taken: 9,
	}
	failed := func(b realBook) []string {
		var out []string
		for _, x := range b.checks() {
			if !x.Check {
				t.Errorf("%s is not a check", x.Name)
			}
			if x.Failed {
				out = append(out, x.Name)
			}
		}
		return out
	}
	if got := failed(good); len(got) != 0 {
		t.Fatalf("a correct run failed %q", got)
	}
	for _, c := range []struct {
		name string
		bad  func(*realBook)
		want []string
	}{
		// fn's writes committed twice for a key (its ledger reference is
		// unique, so as a second key): one order and ledger row too many
		{"ran twice", func(b *realBook) {
			b.sides[0].ledgerRows, b.sides[0].distincts, b.orders, b.lines, b.ledger, b.taken = 4, 4, 6, 12, 6, 11
		},
			[]string{"a: ledger rows per executed key", "realistic: orders per executed key", "realistic: stock taken per unit ordered"}},
		// Executed answered, nothing committed
		{"lost", func(b *realBook) {
			b.sides[1].ledgerRows, b.sides[1].distincts, b.orders, b.lines, b.ledger, b.taken = 1, 1, 4, 8, 4, 7
		},
			[]string{"b: ledger rows per executed key", "realistic: orders per executed key", "realistic: stock taken per unit ordered"}},
		{"duplicate reference", func(b *realBook) { b.sides[0].distincts = 2 }, []string{"a: ledger rows per executed key"}},
		{"an order without its ledger row", func(b *realBook) { b.ledger, b.sides[0].ledgerRows, b.sides[0].distincts = 4, 2, 2 },
			[]string{"a: ledger rows per executed key", "realistic: orders per executed key"}},
		{"a ledger row under no variant's key", func(b *realBook) { b.ledger = 6 }, []string{"realistic: orders per executed key"}},
		{"one line", func(b *realBook) { b.lines = 9 }, []string{"realistic: order lines per order"}},
		{"stock taken twice", func(b *realBook) { b.taken = 18 }, []string{"realistic: stock taken per unit ordered"}},
		{"nothing ran", func(b *realBook) { *b = realBook{sides: []realSideBook{{name: "a"}}} },
			[]string{"a: ledger rows per executed key", "realistic: orders per executed key", "realistic: order lines per order",
				"realistic: stock taken per unit ordered"}},
	} {
		b := good
		b.sides = slices.Clone(good.sides)
		c.bad(&b)
		if got := failed(b); !slices.Equal(got, c.want) {
			t.Errorf("%s: failed %q, want %q", c.name, got, c.want)
		}
	}
}

// Issue 44's targets: each judged against its ceiling, a missed one with
// a line naming the floor that bounds it; Claim + Complete reported with
// no target.
func TestIssue44Targets(t *testing.T) {
	t.Parallel()
	mk := func(name string, ops int64, p50 time.Duration) *variant {
		v := &variant{name: name}
		v.st = stats{ops: ops, elapsed: time.Second, rounds: 1}
		v.st.h.record(p50)
		return v
	}
	ms := time.Millisecond
	vs := []*variant{
		mk("floor-business-tx", 1000, 10*ms),
		mk("floor-lock-first", 500, 20*ms),       // +1ms a request over the business tx
		mk("floor-lock-first-redis", 400, 25*ms), // +1.5ms; p50 +5ms
		mk("library-no-redis", 600, 20*ms),       // 1.67×: met
		mk("library", 400, 30*ms),                // 2.5×, its floor alone 2.5×: missed, bounded by it
		mk(realFloor, 250, 40*ms),                // 4ms a request
		mk(realNoRedis, 200, 50*ms),              // 1.25×: met
		mk(realLibrary, 160, 70*ms),              // 1.5625×, estimate (4+1.5)/4 = 1.375: missed, the library's share
		mk(realClaimComplete, 125, 80*ms),
	}
	got := map[string]extra{}
	for _, x := range issue44Targets(vs, 32) {
		got[x.Name] = x
	}
	for name, want := range map[string]struct {
		value float64
		meets *bool
		bound string
	}{
		"issue 44: library-no-redis-realistic / floor-realistic-tx":       {1.25, boolp(true), ""},
		"issue 44: library-no-redis / floor-business-tx":                  {1000.0 / 600, boolp(true), ""},
		"issue 44: library-realistic / floor-realistic-tx":                {1.5625, boolp(false), "an estimated 1.38×, within the ceiling: the library's own share misses it"},
		"issue 44: library / floor-business-tx":                           {2.5, boolp(false), "bounded by its floor, floor-lock-first-redis alone costs 2.50×, over the ceiling"},
		"issue 44: p50, library-realistic / library-no-redis-realistic":   {1.4, boolp(false), "an estimated 1.10×, within the target"},
		"issue 44: p50, library / library-no-redis":                       {1.5, boolp(false), "an estimated 1.25×, within the target"},
		"issue 44: library-claim-complete-realistic / floor-realistic-tx": {2, nil, ""},
		"issue 44: library-claim-complete-realistic / floor-business-tx":  {8, nil, ""},
	} {
		x, ok := got[name]
		switch {
		case !ok:
			t.Errorf("%s: not reported", name)
			continue
		case math.Abs(x.Value-want.value) > 0.02:
			t.Errorf("%s = %v, want %v", name, x.Value, want.value)
		case (x.Meets == nil) != (want.meets == nil) || (x.Meets != nil && *x.Meets != *want.meets):
			t.Errorf("%s: meets %v, want %v", name, x.Meets, want.meets)
		case !strings.Contains(x.Bound, want.bound) || (want.bound == "") != (x.Bound == ""):
			t.Errorf("%s: bound %q, want it to say %q", name, x.Bound, want.bound)
		}
	}
	if len(got) != 8 {
		t.Errorf("%d targets reported, want 8", len(got))
	}
}

// TestRun_Smoke runs every workload briefly against the real servers and
// checks what the tool checks, plus that it cleans up after itself.
func TestRun_Smoke(t *testing.T) {
	t.Parallel()
	cfg, err := parseFlags([]string{"-redis", testenv.RedisURL(t), "-postgres", testenv.DatabaseURL(t),
		"-duration", "300ms", "-round", "60ms", "-concurrency", "4", "-pg-conns", "4", "-dups", "10", "-keys", "40",
		"-replay-keys", "20", "-backlog", "500", "-redis-timeout", "1s",
		// and the open-loop run and knee sweep, briefly (-smoke keeps the
		// closed-loop run with them)
		"-smoke", "-rate", "50", "-open-round", "100ms", "-max-inflight", "100",
		"-knee", "-knee-rates", "30,60", "-knee-step", "100ms", "-knee-p99", "1s"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var log syncBuffer
	setLog(&log)
	rep, err := run(t.Context(), cfg)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	if len(rep.Workloads) != len(allWorkloads) {
		t.Fatalf("%d workloads reported, want %d", len(rep.Workloads), len(allWorkloads))
	}
	// -html plots the real figures: a chart per closed-loop workload,
	// open-loop run and knee sweep.
	page := filepath.Join(t.TempDir(), "bench.html")
	if err := writeHTML(page, rep); err != nil {
		t.Errorf("-html: %v", err)
	} else if b, err := os.ReadFile(page); err != nil || strings.Count(string(b), "<svg") != len(rep.Workloads)+len(rep.OpenLoop)+len(rep.Knee) {
		t.Errorf("-html: %d charts, want %d (%v)", strings.Count(string(b), "<svg"), len(rep.Workloads)+len(rep.OpenLoop)+len(rep.Knee), err)
	}
	figures := map[string]float64{}
	for _, w := range rep.Workloads {
		for _, v := range w.Variants {
			if v.Requests == 0 || v.Errors != 0 || v.PerSecond <= 0 || v.P99us <= 0 {
				t.Errorf("%s/%s: %d requests, %d errors, %.0f/s, p99 %.0fµs", w.Name, v.Name, v.Requests, v.Errors, v.PerSecond, v.P99us)
			}
			figures[w.Name+"/"+v.Name+"/sql"] = v.SQLPerReq
			figures[w.Name+"/"+v.Name+"/redis"] = v.RedisPerReq
		}
		for _, x := range w.Extras {
			figures[w.Name+"/"+x.Name] = x.Value
		}
	}
	for name, want := range map[string]float64{
		"fresh/floor-sql/sql":                  3, // BEGIN, the order INSERT, the record INSERT with COMMIT
		"fresh/library-at-commit/sql":          3,
		"fresh/library-at-commit-no-redis/sql": 4, // and a read first: Redis did not say the key is new
		"fresh/floor-business-tx/sql":          3, // BEGIN, the order INSERT, COMMIT
		// issue 44, Do locking first: BEGIN with the key's lock and the
		// record check (one round trip), the order INSERT, the record
		// INSERT with COMMIT (one pipeline), as its floors send them (its
		// Redis calls are not counted here: some are sent off the caller's
		// path, so a round can count another's)
		"fresh/library/sql":                     3,
		"fresh/library-no-redis/sql":            3,
		"fresh/library-no-redis/redis":          0,
		"fresh/library-digest-key/sql":          3,
		"fresh/library-no-redis-digest-key/sql": 3,
		"fresh/floor-lock-first/sql":            3,
		"fresh/floor-lock-first-redis/sql":      3,
		"fresh/floor-lock-first-digest-key/sql": 3,
		"fresh/floor-claim-new/sql":             5, // claiming first: BEGIN, the claim, the order INSERT, the completion, COMMIT
		"fresh/floor-claim-new-redis/redis":     2,
		// issue 44: BEGIN, the order, its lines, the stock, the ledger, COMMIT
		"fresh/floor-realistic-tx/sql":               6,
		"fresh/library-realistic/sql":                6, // the lock and the check in the BEGIN's round trip, the record with the COMMIT
		"fresh/library-no-redis-realistic/sql":       6,
		"fresh/library-claim-complete-realistic/sql": 8, // the claim, the transaction, the completion
		// every key answered executed committed one order of two lines,
		// one ledger entry and one stock UPDATE
		"fresh/library-realistic: ledger rows per executed key":                1,
		"fresh/library-no-redis-realistic: ledger rows per executed key":       1,
		"fresh/library-claim-complete-realistic: ledger rows per executed key": 1,
		"fresh/floor-realistic-tx: ledger rows per executed key":               1,
		"fresh/realistic: orders per executed key":                             1,
		"fresh/realistic: order lines per order":                               2,
		"fresh/realistic: stock taken per unit ordered":                        1,
		"replay/library/sql":                                           0, // answered by Redis
		"replay/library/redis":                                         1,
		"replay/floor-select/sql":                                      1,
		"storm/floor-evalsha/sql":                                      0,
		"replay/floor-evalsha/sql":                                     0,
		"storm/library: most executions of one key":                    1,
		"storm/library-no-redis: most executions of one key":           1,
		"storm/library-at-commit-no-redis: most executions of one key": 1,
		"storm/library: fn runs per key":                               1, // claiming first: once per record life
		"storm/library-no-redis: fn runs per key":                      1,
		// issue 43: every retry of a finished operation replays, and
		// every waiting duplicate is answered with the holder's result
		"finished-burst/large: fewest replayed of 50 in a burst": finishedRetries,
		"finished-burst/lost: fewest replayed of 50 in a burst":  finishedRetries,
	} {
		if got, ok := figures[name]; !ok || got != want {
			t.Errorf("%s = %v (reported %v), want %v", name, got, ok, want)
		}
	}
	for _, v := range []string{"claim-redis", "claim-redis-one-claimer", "do-redis", "floor-redis", "claim-redis-down", "do-redis-down", "floor-redis-down"} {
		if got, ok := figures["wake/"+v+": fewest replayed of 20 in a trial"]; !ok || got != wakeWaiters {
			t.Errorf("wake/%s: fewest replayed = %v (reported %v), want %d", v, got, ok, wakeWaiters)
		}
	}
	for _, w := range rep.Workloads {
		switch w.Name {
		case "finished-burst":
			for _, v := range w.Variants {
				// A 96 KiB result is never cached in Redis: its replays
				// come from PostgreSQL.
				if v.Name == "large-burst" && (v.Outcomes["replayed_redis"] != 0 || v.Outcomes["replayed_db"] != v.Requests) {
					t.Errorf("finished-burst/large-burst: outcomes %v of %d, want every one replayed from the database", v.Outcomes, v.Requests)
				}
			}
		case "wake":
			for _, x := range w.Extras {
				// Each trial is timed from the holder's commit, seen by
				// the tracer.
				if strings.Contains(x.Note, "was not seen") {
					t.Errorf("wake: %s: %s", x.Name, x.Note)
				}
			}
		}
	}
	if got := figures["storm/library: durable claims per key"]; got <= 0 || got > 1.05 {
		t.Errorf("storm: durable claims per key = %v, want (0, 1.05]", got)
	}
	for _, w := range rep.Workloads {
		for _, v := range w.Variants {
			for _, c := range v.Costs {
				if c.Ratio <= 0 || (c.Meets == nil) != (c.Target == 0) {
					t.Errorf("%s/%s: cost vs %s not measured, or judged without a target or not with one: %+v", w.Name, v.Name, c.Vs, c)
				}
			}
		}
	}
	openVariants := map[string]int{"fresh": 4, "replay": 2}
	if len(rep.OpenLoop) != 2 || len(rep.Knee) != 2 {
		t.Fatalf("%d open-loop runs and %d knee sweeps, want 2 and 2", len(rep.OpenLoop), len(rep.Knee))
	}
	for _, w := range rep.OpenLoop {
		if len(w.Variants) != openVariants[w.Name] {
			t.Errorf("open-loop %s: %d variants, want %d", w.Name, len(w.Variants), openVariants[w.Name])
		}
		for _, v := range w.Variants {
			if v.Sent == 0 || v.Errors != 0 || v.Sent+v.Dropped != v.Scheduled || v.P99us <= 0 || v.Achieved <= 0 {
				t.Errorf("open-loop %s/%s: %+v", w.Name, v.Name, v)
			}
		}
	}
	for _, w := range rep.Knee {
		if len(w.Variants) != openVariants[w.Name] {
			t.Errorf("knee %s: %d variants, want %d", w.Name, len(w.Variants), openVariants[w.Name])
		}
		for _, v := range w.Variants {
			if len(v.Steps) == 0 || v.Steps[0].Rate != 30 || v.Steps[0].Sent == 0 || v.Steps[0].Errors != 0 {
				t.Errorf("knee %s/%s: steps %+v", w.Name, v.Name, v.Steps)
			}
		}
	}

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, cfg.postgres)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1`, rep.Schema).Scan(&n); err != nil || n != 0 {
		t.Errorf("schema %s left behind (%d, %v)", rep.Schema, n, err)
	}
	opt, err := redis.ParseURL(cfg.redis)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	if keys, err := rdb.Keys(ctx, rep.Prefix+":*").Result(); err != nil || len(keys) != 0 {
		t.Errorf("%d Redis keys left under %s (%v)", len(keys), rep.Prefix, err)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRealMain_HTML: -html writes the page after the run. Not parallel:
// realMain sets go-redis's global logger.
func TestRealMain_HTML(t *testing.T) {
	page := filepath.Join(t.TempDir(), "bench.html")
	var stdout, stderr bytes.Buffer
	code := realMain([]string{"-redis", testenv.RedisURL(t), "-postgres", testenv.DatabaseURL(t), "-workload", "replay",
		"-duration", "100ms", "-round", "20ms", "-concurrency", "2", "-pg-conns", "2", "-replay-keys", "10", "-redis-timeout", "1s",
		"-html", page}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	if s := string(b); strings.Count(s, "<svg") != 1 || !strings.Contains(s, "replay (closed loop)") || !strings.Contains(s, "floor-evalsha") {
		t.Fatalf("the page lacks the replay chart:\n%.3000s", s)
	}
}

// TestRealMain_BadFlag is not parallel: realMain sets go-redis's global
// logger, which the other tests' clients read.
func TestRealMain_BadFlag(t *testing.T) {
	var stderr bytes.Buffer
	if code := realMain([]string{"-workload", "nope"}, &bytes.Buffer{}, &stderr); code != 2 {
		t.Errorf("exit code for a bad flag = %d, want 2", code)
	}
	if !strings.Contains(stderr.String(), "unknown workload") {
		t.Errorf("stderr = %q, want the reason", stderr.String())
	}
}

// TestMedianRoundRatio: the sweep's judged figure is the median of the
// per-round p99 ratios, which one slow round does not move.
func TestMedianRoundRatio(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	for _, c := range []struct {
		name      string
		a, b      []time.Duration
		wantPairs int
		want      float64
	}{
		{"odd", ms(11, 12, 100), ms(10, 10, 10), 3, 1.2},
		{"even", ms(10, 12, 14, 90), ms(10, 10, 10, 10), 4, 1.3},
		{"unequal lengths", ms(20, 20, 20), ms(10, 10), 2, 2},
		{"empty round skipped", ms(20, 30), ms(0, 10), 1, 3},
		{"none", nil, ms(10), 0, 0},
	} {
		pairs, got := medianRoundRatio(c.a, c.b)
		if pairs != c.wantPairs || math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: medianRoundRatio = %d, %v; want %d, %v", c.name, pairs, got, c.wantPairs, c.want)
		}
	}
}

// TestRealMain_Records: -records writes and copies the records and reports
// bytes per record for the heap, every index of the table and the whole,
// which is at least their sum; it refuses to run beside workloads.
func TestRealMain_Records(t *testing.T) {
	file := filepath.Join(t.TempDir(), "size.json")
	var stdout, stderr bytes.Buffer
	code := realMain([]string{"-redis", testenv.RedisURL(t), "-postgres", testenv.DatabaseURL(t), "-records", "3000",
		"-concurrency", "4", "-pg-conns", "4", "-redis-timeout", "1s", "-json", file}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Workloads []struct {
			Name   string  `json:"name"`
			Extras []extra `json:"extras"`
		} `json:"workloads"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Workloads) != 1 || rep.Workloads[0].Name != "size" {
		t.Fatalf("workloads = %+v, want size alone", rep.Workloads)
	}
	got := map[string]float64{}
	var parts float64
	indexes := 0
	for _, x := range rep.Workloads[0].Extras {
		got[x.Name] = x.Value
		if strings.HasPrefix(x.Name, "index ") {
			indexes++
			parts += x.Value
		}
	}
	parts += got["heap"] + got["TOAST"]
	if got["records"] != 3000 || got["heap"] < 100 || indexes < 2 || got["index idempotency_requests_pkey"] <= 0 || got["total"] < parts-1 {
		t.Fatalf("size figures = %v (indexes %d, heap+TOAST+indexes %.1f), want 3000 records, each part and a total covering them", got, indexes, parts)
	}
	// After the contract step: the same records, the digest's primary key,
	// one index fewer (the old key's and the operation index go, the
	// digest's comes).
	dkIndexes := 0
	for name := range got {
		if strings.HasPrefix(name, "digest-key index ") {
			dkIndexes++
		}
	}
	if got["digest-key records"] != 3000 || got["digest-key index idempotency_requests_pkey"] <= 0 || dkIndexes != indexes-1 ||
		got["digest-key index idempotency_requests_operation_idx"] != 0 {
		t.Fatalf("size after the contract step = %v (%d indexes, %d before); want 3000 records and one index fewer", got, dkIndexes, indexes)
	}
	if code := realMain([]string{"-records", "3000", "-workload", "fresh"}, &bytes.Buffer{}, &stderr); code != 2 {
		t.Errorf("-records with -workload: exit %d, want 2", code)
	}
}
