package fastpath_test

import (
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/oncekey/oncekey/internal/fastpath"
)

// fakeClock is a settable clock for the breaker.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// stateLog records the breaker's state changes.
type stateLog struct {
	mu     sync.Mutex
	states []fastpath.BreakerState
}

func (l *stateLog) record(s fastpath.BreakerState) {
	l.mu.Lock()
	l.states = append(l.states, s)
	l.mu.Unlock()
}

func (l *stateLog) get() []fastpath.BreakerState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]fastpath.BreakerState(nil), l.states...)
}

func newTestBreaker(failures int) (*fastpath.Breaker, *fakeClock, *stateLog) {
	clk, log := newFakeClock(), &stateLog{}
	return fastpath.NewBreaker(fastpath.BreakerOptions{Failures: failures, CoolDown: time.Second, Now: clk.Now}, log.record), clk, log
}

func mustAllow(t *testing.T, b *fastpath.Breaker, wantProbe bool) {
	t.Helper()
	probe, ok := b.Allow()
	if !ok || probe != wantProbe {
		t.Fatalf("Allow = probe %v, ok %v; want probe %v, ok true", probe, ok, wantProbe)
	}
}

func mustRefuse(t *testing.T, b *fastpath.Breaker) {
	t.Helper()
	if _, ok := b.Allow(); ok {
		t.Fatalf("Allow = ok in state %v, want refused", b.State())
	}
}

func TestBreaker(t *testing.T) {
	t.Parallel()
	t.Run("OpensAfterConsecutiveFailures", func(t *testing.T) {
		b, _, log := newTestBreaker(3)
		for i := range 2 {
			mustAllow(t, b, false)
			b.Failure(false)
			if st := b.State(); st != fastpath.BreakerClosed {
				t.Fatalf("after %d failures: %v", i+1, st)
			}
		}
		mustAllow(t, b, false)
		b.Failure(false)
		if st := b.State(); st != fastpath.BreakerOpen {
			t.Fatalf("after 3 failures: %v, want open", st)
		}
		mustRefuse(t, b)
		if got := log.get(); !reflect.DeepEqual(got, []fastpath.BreakerState{fastpath.BreakerOpen}) {
			t.Errorf("state changes = %v", got)
		}
	})
	t.Run("SuccessResetsTheCount", func(t *testing.T) {
		b, _, _ := newTestBreaker(2)
		for range 5 {
			mustAllow(t, b, false)
			b.Failure(false)
			mustAllow(t, b, false)
			b.Success(false)
		}
		if st := b.State(); st != fastpath.BreakerClosed {
			t.Fatalf("alternating failures opened the breaker: %v", st)
		}
	})
	t.Run("StaysOpenUntilCoolDownThenOneProbe", func(t *testing.T) {
		b, clk, _ := newTestBreaker(1)
		mustAllow(t, b, false)
		b.Failure(false)
		clk.Advance(999 * time.Millisecond)
		mustRefuse(t, b)
		clk.Advance(time.Millisecond)
		mustAllow(t, b, true)
		if st := b.State(); st != fastpath.BreakerHalfOpen {
			t.Fatalf("state = %v, want half-open", st)
		}
		mustRefuse(t, b) // a second caller while the probe is out
		mustRefuse(t, b)
	})
	t.Run("ProbeSuccessCloses", func(t *testing.T) {
		b, clk, log := newTestBreaker(1)
		mustAllow(t, b, false)
		b.Failure(false)
		clk.Advance(time.Second)
		mustAllow(t, b, true)
		b.Success(true)
		if st := b.State(); st != fastpath.BreakerClosed {
			t.Fatalf("state = %v, want closed", st)
		}
		mustAllow(t, b, false)
		if got, want := log.get(), []fastpath.BreakerState{fastpath.BreakerOpen, fastpath.BreakerHalfOpen, fastpath.BreakerClosed}; !reflect.DeepEqual(got, want) {
			t.Errorf("state changes = %v, want %v", got, want)
		}
	})
	t.Run("ProbeFailureReopensForAnotherCoolDown", func(t *testing.T) {
		b, clk, _ := newTestBreaker(1)
		mustAllow(t, b, false)
		b.Failure(false)
		clk.Advance(5 * time.Second)
		mustAllow(t, b, true)
		b.Failure(true)
		if st := b.State(); st != fastpath.BreakerOpen {
			t.Fatalf("state = %v, want open", st)
		}
		clk.Advance(999 * time.Millisecond)
		mustRefuse(t, b)
		clk.Advance(time.Millisecond)
		mustAllow(t, b, true)
	})
	t.Run("AbandonedProbeLetsNextCallProbe", func(t *testing.T) {
		b, clk, _ := newTestBreaker(1)
		mustAllow(t, b, false)
		b.Failure(false)
		clk.Advance(time.Second)
		mustAllow(t, b, true)
		b.Abandon(true)
		if st := b.State(); st != fastpath.BreakerHalfOpen {
			t.Fatalf("state = %v, want half-open", st)
		}
		mustAllow(t, b, true)
	})
	t.Run("AbandonedCallsDoNotCount", func(t *testing.T) {
		b, _, _ := newTestBreaker(1)
		for range 10 {
			mustAllow(t, b, false)
			b.Abandon(false)
		}
		if st := b.State(); st != fastpath.BreakerClosed {
			t.Fatalf("state = %v, want closed", st)
		}
	})
	t.Run("LateResultsOfCallsAdmittedBeforeOpeningAreIgnored", func(t *testing.T) {
		b, clk, _ := newTestBreaker(1)
		mustAllow(t, b, false) // call 1
		mustAllow(t, b, false) // call 2, in flight together
		b.Failure(false)       // call 1 opens it
		clk.Advance(500 * time.Millisecond)
		b.Success(false) // call 2 answers late: not a probe, does not close
		if st := b.State(); st != fastpath.BreakerOpen {
			t.Fatalf("state = %v, want open", st)
		}
		b.Failure(false) // nor does a late failure extend the cool-down
		clk.Advance(500 * time.Millisecond)
		mustAllow(t, b, true)
	})
	t.Run("ZeroOptionsAreDefaults", func(t *testing.T) {
		clk := newFakeClock()
		b := fastpath.NewBreaker(fastpath.BreakerOptions{Now: clk.Now}, nil)
		for range 4 {
			mustAllow(t, b, false)
			b.Failure(false)
		}
		if st := b.State(); st != fastpath.BreakerClosed {
			t.Fatalf("opened after 4 failures; default is 5")
		}
		mustAllow(t, b, false)
		b.Failure(false)
		if st := b.State(); st != fastpath.BreakerOpen {
			t.Fatalf("state = %v after 5 failures", st)
		}
		clk.Advance(999 * time.Millisecond)
		mustRefuse(t, b)
		clk.Advance(time.Millisecond)
		mustAllow(t, b, true)
	})
	t.Run("ConcurrentCallersGetOneProbe", func(t *testing.T) {
		b, clk, _ := newTestBreaker(1)
		mustAllow(t, b, false)
		b.Failure(false)
		clk.Advance(time.Second)
		var wg sync.WaitGroup
		var mu sync.Mutex
		probes := 0
		for range 50 {
			wg.Go(func() {
				if probe, ok := b.Allow(); ok {
					mu.Lock()
					if probe {
						probes++
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if probes != 1 {
			t.Fatalf("%d probes admitted, want 1", probes)
		}
	})
}

func TestBreakerState_String(t *testing.T) {
	t.Parallel()
	for s, want := range map[fastpath.BreakerState]string{fastpath.BreakerClosed: "closed", fastpath.BreakerOpen: "open", fastpath.BreakerHalfOpen: "half-open", 9: "unknown"} {
		if got := s.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(s), got, want)
		}
	}
}
