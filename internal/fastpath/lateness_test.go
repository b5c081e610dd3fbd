package fastpath_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/internal/fastpath"
)

// stalled is a go-redis hook standing in for a process that cannot run its
// goroutines: every command fails with its context's deadline, seen late()
// after the deadline (0: right at it). Nothing reaches a server.
type stalled struct{ late func() time.Duration }

func (stalled) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h stalled) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		late := h.late() // when the command is sent
		<-ctx.Done()
		time.Sleep(late)
		cmd.SetErr(ctx.Err())
		return ctx.Err()
	}
}

func (stalled) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// always returns a late() of d for every command.
func always(d time.Duration) func() time.Duration { return func() time.Duration { return d } }

// TestBreaker_TimeoutsSeenLateAreNotRedis checks that a call whose timeout
// the process saw more than a quarter of a budget late (its own CPU
// starvation: it could not have read a reply in time either) fails without
// counting towards the breaker, while timeouts seen on time open it: the
// negative control. The budget is long enough (a quarter of it, 25ms, is
// the lateness allowed) that a loaded test machine sees most on-time
// timeouts on time, and the control gets ten calls to see three in a row:
// with 20ms and five calls it failed once under the full CI run.
func TestBreaker_TimeoutsSeenLateAreNotRedis(t *testing.T) {
	t.Parallel()
	const timeout = 100 * time.Millisecond
	for _, c := range []struct {
		name     string
		late     time.Duration
		wantOpen bool
	}{
		{"SeenOnTime", 0, true},
		{"SeenLate", 2 * timeout, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1})
			t.Cleanup(func() { rdb.Close() })
			rdb.AddHook(stalled{late: always(c.late)})
			s, err := fastpath.New(rdb, fastpath.Options{
				Timeout: timeout,
				Breaker: fastpath.BreakerOptions{Failures: 3, CoolDown: time.Hour},
			})
			if err != nil {
				t.Fatal(err)
			}
			const calls = 10
			for i := range calls {
				_, err := s.Claim(context.Background(), refFor(t, "k"), fastpath.ClaimArgs{Fingerprint: "fp", Owner: uuid.New(), Lease: time.Second})
				if errors.Is(err, fastpath.ErrBreakerOpen) {
					if !c.wantOpen {
						t.Fatalf("call %d: breaker open after timeouts the process saw %v late", i, c.late)
					}
					return
				}
				if !errors.Is(err, fastpath.ErrUnavailable) {
					t.Fatalf("call %d = %v, want ErrUnavailable", i, err)
				}
			}
			if c.wantOpen {
				t.Fatalf("breaker %v after %d timeouts seen on time, want open", s.Breaker(), calls)
			}
		})
	}
}

// TestBreaker_TimeoutsOfCallsSentDuringALagAreNotRedis checks the second
// half of the rule: a call sent before another call's timeout found the
// process lagging is not counted either, though its own timeout is seen on
// time (the run queue had drained by then); a call sent after it is.
func TestBreaker_TimeoutsOfCallsSentDuringALagAreNotRedis(t *testing.T) {
	t.Parallel()
	const timeout = 100 * time.Millisecond
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	var calls atomic.Int32
	rdb.AddHook(stalled{late: func() time.Duration { // the first command only
		if calls.Add(1) == 1 {
			return timeout
		}
		return 0
	}})
	s, err := fastpath.New(rdb, fastpath.Options{
		Timeout: timeout,
		Breaker: fastpath.BreakerOptions{Failures: 1, CoolDown: time.Hour},
	})
	if err != nil {
		t.Fatal(err)
	}
	claim := func() error {
		_, err := s.Claim(context.Background(), refFor(t, "k"), fastpath.ClaimArgs{Fingerprint: "fp", Owner: uuid.New(), Lease: time.Second})
		return err
	}
	// The first call times out at 100ms, seen at 200ms: the lag. The
	// second is sent at 150ms, before that, and times out at 250ms.
	first := make(chan error, 1)
	go func() { first <- claim() }()
	time.Sleep(timeout * 3 / 2)
	if err := claim(); !errors.Is(err, fastpath.ErrUnavailable) || errors.Is(err, fastpath.ErrBreakerOpen) {
		t.Fatalf("second call = %v, want a timeout", err)
	}
	if err := <-first; !errors.Is(err, fastpath.ErrUnavailable) {
		t.Fatalf("first call = %v, want a timeout", err)
	}
	if st := s.Breaker(); st != fastpath.BreakerClosed {
		t.Fatalf("breaker %v after timeouts during a lag, want closed", st)
	}
	// Sent after the lag was seen, on time: Redis's own failure. The
	// negative control: one counted failure opens this breaker.
	if err := claim(); !errors.Is(err, fastpath.ErrUnavailable) {
		t.Fatalf("third call = %v, want a timeout", err)
	}
	if st := s.Breaker(); st != fastpath.BreakerOpen {
		t.Fatalf("breaker %v after a timeout sent once the lag had passed, want open", st)
	}
}
