package fastpath_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/testkit/redisproc"
)

// breakerSetup is a Scripts on a private redis-server, with a fake clock for
// the breaker and a counter of the script commands that reach the client.
type breakerSetup struct {
	srv    *redisproc.Server
	calls  *countingScripter
	s      *fastpath.Scripts
	clock  *fakeClock
	states *stateLog
}

func newBreakerSetup(t *testing.T, ctxTimeouts bool, timeout time.Duration) breakerSetup {
	t.Helper()
	srv := redisproc.Start(t, redisproc.Options{})
	c := redis.NewClient(&redis.Options{
		Addr:                  srv.Addr(),
		ContextTimeoutEnabled: ctxTimeouts,
		// Bounds how long a detached call's goroutine outlives its wrapper
		// when the client ignores context deadlines.
		ReadTimeout:  300 * time.Millisecond,
		WriteTimeout: 300 * time.Millisecond,
		DialTimeout:  300 * time.Millisecond,
	})
	t.Cleanup(func() { c.Close() })
	b := breakerSetup{srv: srv, calls: &countingScripter{Scripter: c}, clock: newFakeClock(), states: &stateLog{}}
	s, err := fastpath.New(b.calls, fastpath.Options{
		Prefix:        "brk",
		Timeout:       timeout,
		Breaker:       fastpath.BreakerOptions{Failures: 3, CoolDown: 10 * time.Second, Now: b.clock.Now},
		OnStateChange: b.states.record,
	})
	if err != nil {
		t.Fatal(err)
	}
	b.s = s
	return b
}

func (b breakerSetup) claim(t *testing.T) error {
	t.Helper()
	_, err := b.s.Claim(context.Background(), refFor(t, "k"), fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: lease})
	return err
}

// openBreaker makes Failures calls fail and checks that exactly those open
// the breaker and that later calls fail at once without reaching Redis.
func (b breakerSetup) openBreaker(t *testing.T, wantCause error) {
	t.Helper()
	for i := range 3 {
		err := b.claim(t)
		if !errors.Is(err, fastpath.ErrUnavailable) || errors.Is(err, fastpath.ErrBreakerOpen) {
			t.Fatalf("call %d: %v, want ErrUnavailable from Redis", i+1, err)
		}
		if wantCause != nil && !errors.Is(err, wantCause) {
			t.Fatalf("call %d: %v, want it to wrap %v", i+1, err, wantCause)
		}
		if want := fastpath.BreakerClosed; i < 2 && b.s.Breaker() != want {
			t.Fatalf("breaker %v after %d failures, want closed", b.s.Breaker(), i+1)
		}
	}
	if st := b.s.Breaker(); st != fastpath.BreakerOpen {
		t.Fatalf("breaker = %v after 3 failures, want open", st)
	}
	sent := b.calls.n.Load()
	for range 20 {
		if err := b.claim(t); !errors.Is(err, fastpath.ErrBreakerOpen) {
			t.Fatalf("call with the breaker open: %v, want ErrBreakerOpen", err)
		}
	}
	if n := b.calls.n.Load(); n != sent {
		t.Fatalf("%d script commands sent while the breaker was open, want 0", n-sent)
	}
}

// closeBreaker passes the cool-down and checks that the probe closes the
// breaker.
func (b breakerSetup) closeBreaker(t *testing.T) {
	t.Helper()
	b.clock.Advance(10 * time.Second)
	if err := b.claim(t); err != nil {
		t.Fatalf("probe: %v", err)
	}
	if st := b.s.Breaker(); st != fastpath.BreakerClosed {
		t.Fatalf("breaker = %v after a successful probe, want closed", st)
	}
	if err := b.claim(t); err != nil {
		t.Fatalf("call after closing: %v", err)
	}
	if got, want := b.states.get(), []fastpath.BreakerState{fastpath.BreakerOpen, fastpath.BreakerHalfOpen, fastpath.BreakerClosed}; !reflect.DeepEqual(got, want) {
		t.Errorf("state changes = %v, want %v", got, want)
	}
}

// waitForPing waits until the server answers again, so the probe that
// follows does not race the server's own recovery on a loaded machine.
func waitForPing(t *testing.T, addr string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("%s does not answer PING", addr)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestBreaker_Redis(t *testing.T) {
	t.Parallel()
	t.Run("StoppedRedisOpensItAndRestartedRedisClosesIt", func(t *testing.T) {
		t.Parallel()
		b := newBreakerSetup(t, true, 200*time.Millisecond)
		if err := b.claim(t); err != nil {
			t.Fatal(err)
		}
		b.srv.Kill() // a port nothing listens on
		b.openBreaker(t, nil)
		// The cool-down has not passed: still open, even with Redis back.
		if err := b.srv.Restart(); err != nil {
			t.Fatal(err)
		}
		waitForPing(t, b.srv.Addr())
		if err := b.claim(t); !errors.Is(err, fastpath.ErrBreakerOpen) {
			t.Fatalf("before the cool-down: %v", err)
		}
		b.closeBreaker(t)
	})
	for _, mode := range []struct {
		name        string
		ctxTimeouts bool
	}{{"ContextTimeoutClient", true}, {"DefaultClient", false}} {
		t.Run("StalledRedisTimesOutOpensItAndClosesAfter/"+mode.name, func(t *testing.T) {
			t.Parallel()
			b := newBreakerSetup(t, mode.ctxTimeouts, 250*time.Millisecond)
			if err := b.claim(t); err != nil {
				t.Fatal(err)
			}
			if err := b.srv.Pause(); err != nil {
				t.Fatal(err)
			}
			b.openBreaker(t, context.DeadlineExceeded)
			if err := b.srv.Resume(); err != nil {
				t.Fatal(err)
			}
			waitForPing(t, b.srv.Addr())
			b.closeBreaker(t)
		})
	}
	t.Run("FailedProbeReopens", func(t *testing.T) {
		t.Parallel()
		b := newBreakerSetup(t, true, 200*time.Millisecond)
		b.srv.Kill()
		b.openBreaker(t, nil)
		b.clock.Advance(10 * time.Second)
		if err := b.claim(t); !errors.Is(err, fastpath.ErrUnavailable) || errors.Is(err, fastpath.ErrBreakerOpen) {
			t.Fatalf("probe on a dead port: %v", err)
		}
		if st := b.s.Breaker(); st != fastpath.BreakerOpen {
			t.Fatalf("breaker = %v after a failed probe, want open", st)
		}
		if err := b.claim(t); !errors.Is(err, fastpath.ErrBreakerOpen) {
			t.Fatalf("after a failed probe: %v", err)
		}
	})
	t.Run("CallersCancelledContextDoesNotCount", func(t *testing.T) {
		t.Parallel()
		b := newBreakerSetup(t, true, 200*time.Millisecond)
		b.srv.Kill()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		for range 10 {
			_, err := b.s.Claim(ctx, refFor(t, "k"), fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: lease})
			if !errors.Is(err, fastpath.ErrUnavailable) {
				t.Fatalf("Claim = %v", err)
			}
		}
		if st := b.s.Breaker(); st != fastpath.BreakerClosed {
			t.Fatalf("breaker = %v after calls the caller cancelled, want closed", st)
		}
	})
}
