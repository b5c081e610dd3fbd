package chaos

import (
	"context"
	"sort"
	"sync"
	"time"
)

// RepeatedFaultsRequired is how often a scenario that cycles an
// infrastructure fault for the whole run (issue 48; [ScenarioInfo.Repeats]
// names its main fault) must fire it at a size of iterations operations:
// 2 at CI's 20, 20 at the soak's 1000. A run that fires it fewer times
// fails ([Result.Failed]).
func RepeatedFaultsRequired(iterations int) int { return max(2, iterations/50) }

// repeatedPlanned is how many cycles a scenario plans at iterations
// operations, at least least: more than required, so that the
// requirement is met by the plan and not by luck.
func repeatedPlanned(iterations, least int) int {
	return max(least, RepeatedFaultsRequired(iterations), iterations/40)
}

// Repeated is the count of a repeated scenario's main fault.
type Repeated struct {
	// Fault is the main fault's kind (a key of [Result.Faults]).
	Fault string `json:"fault"`
	// Fired is how often it fired.
	Fired int64 `json:"fired"`
	// Required is [RepeatedFaultsRequired] at the run's size, or 1 on
	// servers that cannot repeat the fault (Note says why).
	Required int `json:"required"`
	// Note, when set, says why the fault could fire only once on the
	// run's servers.
	Note string `json:"note,omitempty"`
}

// repeatOnce says that the scenario's main fault fires once on the run's
// servers, and why: it must then fire once, and the result says why.
func (e *env) repeatOnce(why string) {
	e.mu.Lock()
	e.onceWhy = why
	e.mu.Unlock()
}

// FaultSpan is one fault on a scenario's timeline: its kind, and when it
// was put in place and healed, on the clock of the scenario's history
// (since its start).
type FaultSpan struct {
	Kind  string        `json:"kind"`
	Start time.Duration `json:"start_ns"`
	End   time.Duration `json:"end_ns"`
}

// span records a fault of kind on the timeline from now until the
// returned function is called (once; later calls do nothing).
func (e *env) span(kind string) (end func()) {
	start := e.rec.Now()
	return sync.OnceFunc(func() {
		s := FaultSpan{Kind: kind, Start: start, End: e.rec.Now()}
		e.mu.Lock()
		e.spans = append(e.spans, s)
		e.mu.Unlock()
	})
}

// timeline returns the recorded spans by start.
func (e *env) timeline() []FaultSpan {
	e.mu.Lock()
	out := append([]FaultSpan(nil), e.spans...)
	e.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start < out[j].Start })
	return out
}

// cycles is a scenario's plan of n repeated faults over its run: cycle k
// starts, in the background and one at a time (env.bg: the previous
// cycle healed first), when operation at[k] starts; the seed draws each
// at[k] within its share of the run.
type cycles struct {
	e     *env
	kind  string
	at    []int
	ready []chan struct{}
	once  []sync.Once
	// after, when positive, holds each operation started within after
	// operations of a cycle's start until the cycle called ready.
	after int
	// healed, when set, holds the operations after those until the
	// cycle returned (its fault healed) and settle more passed.
	healed bool
	settle time.Duration
	done   []chan struct{}
	doneAt []time.Time
	run    func(ctx context.Context, k int, ready func())
}

// repeat plans n cycles of run over the operations [0, iterations-tail)
// (at least operation 0). run calls ready once its fault is in place (or
// it gave up); it is called for it at the latest when run returns.
func (e *env) repeat(kind string, n, tail, after int, run func(ctx context.Context, k int, ready func())) *cycles {
	last := max(e.cfg.Iterations-tail, 1) // operations [1, last) hold the cycles
	c := &cycles{e: e, kind: kind, after: after, run: run}
	span := max(last-1, 1)
	for k := 0; k < n; k++ {
		lo := 1 + k*span/n
		hi := 1 + (k+1)*span/n
		i := lo
		if hi > lo {
			i = lo + e.sched.intn(hi-lo, "cycle-"+kind, k)
		}
		c.at = append(c.at, min(i, max(e.cfg.Iterations-1, 0)))
		c.ready = append(c.ready, make(chan struct{}))
		c.done = append(c.done, make(chan struct{}))
	}
	c.once = make([]sync.Once, n)
	c.doneAt = make([]time.Time, n)
	return c
}

// healedFirst makes the operations that start more than after operations
// after a cycle's start wait until it healed, and settle more.
func (c *cycles) healedFirst(settle time.Duration) *cycles {
	c.healed, c.settle = true, settle
	return c
}

// start is the cycles' part of a startOp hook: it starts the cycles
// planned at o, and holds o, when it follows a cycle's start closely,
// until that cycle's fault is in place.
func (c *cycles) start(ctx context.Context, o *op) {
	for k, i := range c.at {
		if i != o.i {
			continue
		}
		c.e.bg(func() {
			ready := func() { c.once[k].Do(func() { close(c.ready[k]) }) }
			defer func() {
				ready()
				c.doneAt[k] = time.Now()
				close(c.done[k])
			}()
			c.run(ctx, k, ready)
		})
	}
	// The latest cycle that started before o.
	for k := len(c.at) - 1; k >= 0; k-- {
		if c.at[k] >= o.i {
			continue
		}
		switch {
		case o.i-c.at[k] <= c.after:
			select {
			case <-c.ready[k]:
			case <-ctx.Done():
			}
		case c.healed:
			select {
			case <-c.done[k]:
				sleep(ctx, time.Until(c.doneAt[k].Add(c.settle)))
			case <-ctx.Done():
			}
		}
		return
	}
}
