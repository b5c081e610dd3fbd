package fastpath_test

import (
	"fmt"
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

// failCall runs a call through b that is admitted, not as a probe, and
// fails.
func failCall(t *testing.T, b *fastpath.Breaker) {
	t.Helper()
	mustAllow(t, b, false)
	b.Failure(false)
}

// mustState checks b's state; when says at what point of the test.
func mustState(t *testing.T, b *fastpath.Breaker, want fastpath.BreakerState, when string) {
	t.Helper()
	if st := b.State(); st != want {
		t.Fatalf("%s: state = %v, want %v", when, st, want)
	}
}

// mustCoolDown checks that b, open, refuses calls until its cool-down of a
// second has passed to the millisecond, then admits one call as the probe.
func mustCoolDown(t *testing.T, b *fastpath.Breaker, clk *fakeClock) {
	t.Helper()
	clk.Advance(999 * time.Millisecond)
	mustRefuse(t, b)
	clk.Advance(time.Millisecond)
	mustAllow(t, b, true)
}

func TestBreaker(t *testing.T) {
	t.Parallel()
	t.Run("OpensAfterConsecutiveFailures", func(t *testing.T) {
		b, _, log := newTestBreaker(3)
		for i := range 2 {
			failCall(t, b)
			mustState(t, b, fastpath.BreakerClosed, fmt.Sprintf("after %d failures", i+1))
		}
		failCall(t, b)
		mustState(t, b, fastpath.BreakerOpen, "after 3 failures")
		mustRefuse(t, b)
		if got := log.get(); !reflect.DeepEqual(got, []fastpath.BreakerState{fastpath.BreakerOpen}) {
			t.Errorf("state changes = %v", got)
		}
	})
	t.Run("SuccessResetsTheCount", func(t *testing.T) {
		b, _, _ := newTestBreaker(2)
		for range 5 {
			failCall(t, b)
			mustAllow(t, b, false)
			b.Success(false)
		}
		mustState(t, b, fastpath.BreakerClosed, "after alternating failures")
	})
	t.Run("StaysOpenUntilCoolDownThenOneProbe", func(t *testing.T) {
		b, clk, _ := newTestBreaker(1)
		failCall(t, b)
		mustCoolDown(t, b, clk)
		mustState(t, b, fastpath.BreakerHalfOpen, "probe admitted")
		mustRefuse(t, b) // a second caller while the probe is out
		mustRefuse(t, b)
	})
	t.Run("ProbeSuccessCloses", func(t *testing.T) {
		b, clk, log := newTestBreaker(1)
		failCall(t, b)
		clk.Advance(time.Second)
		mustAllow(t, b, true)
		b.Success(true)
		mustState(t, b, fastpath.BreakerClosed, "probe succeeded")
		mustAllow(t, b, false)
		if got, want := log.get(), []fastpath.BreakerState{fastpath.BreakerOpen, fastpath.BreakerHalfOpen, fastpath.BreakerClosed}; !reflect.DeepEqual(got, want) {
			t.Errorf("state changes = %v, want %v", got, want)
		}
	})
	t.Run("ProbeFailureReopensForAnotherCoolDown", func(t *testing.T) {
		b, clk, _ := newTestBreaker(1)
		failCall(t, b)
		clk.Advance(5 * time.Second)
		mustAllow(t, b, true)
		b.Failure(true)
		mustState(t, b, fastpath.BreakerOpen, "probe failed")
		mustCoolDown(t, b, clk)
	})
	t.Run("AbandonedProbeLetsNextCallProbe", func(t *testing.T) {
		b, clk, _ := newTestBreaker(1)
		failCall(t, b)
		clk.Advance(time.Second)
		mustAllow(t, b, true)
		b.Abandon(true)
		mustState(t, b, fastpath.BreakerHalfOpen, "probe abandoned")
		mustAllow(t, b, true)
	})
	t.Run("AbandonedCallsDoNotCount", func(t *testing.T) {
		b, _, _ := newTestBreaker(1)
		for range 10 {
			mustAllow(t, b, false)
			b.Abandon(false)
		}
		mustState(t, b, fastpath.BreakerClosed, "10 calls abandoned")
	})
	t.Run("LateResultsOfCallsAdmittedBeforeOpeningAreIgnored", func(t *testing.T) {
		b, clk, _ := newTestBreaker(1)
		mustAllow(t, b, false) // call 1
		mustAllow(t, b, false) // call 2, in flight together
		b.Failure(false)       // call 1 opens it
		clk.Advance(500 * time.Millisecond)
		b.Success(false) // call 2 answers late: not a probe, does not close
		mustState(t, b, fastpath.BreakerOpen, "late success")
		b.Failure(false) // nor does a late failure extend the cool-down
		clk.Advance(500 * time.Millisecond)
		mustAllow(t, b, true)
	})
	t.Run("ZeroOptionsAreDefaults", func(t *testing.T) {
		clk := newFakeClock()
		b := fastpath.NewBreaker(fastpath.BreakerOptions{Now: clk.Now}, nil)
		for range 4 {
			failCall(t, b)
		}
		mustState(t, b, fastpath.BreakerClosed, "after 4 failures (the default is 5)")
		failCall(t, b)
		mustState(t, b, fastpath.BreakerOpen, "after 5 failures")
		mustCoolDown(t, b, clk)
	})
	t.Run("ConcurrentCallersGetOneProbe", func(t *testing.T) {
		b, clk, _ := newTestBreaker(1)
		failCall(t, b)
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
