package fastpath_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/internal/fastpath"
)

// stalled is a go-redis hook standing in for a process that cannot run its
// goroutines: every command fails with its context's deadline, seen late
// after the deadline (0: right at it). Nothing reaches a server.
type stalled struct{ late time.Duration }

func (stalled) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h stalled) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		<-ctx.Done()
		time.Sleep(h.late)
		cmd.SetErr(ctx.Err())
		return ctx.Err()
	}
}

func (stalled) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestBreaker_TimeoutsSeenLateAreNotRedis checks that a call whose timeout
// the process saw more than half a budget late (its own CPU starvation:
// it could not have read a reply in time either) fails without counting
// towards the breaker, while timeouts seen on time open it: the negative
// control.
func TestBreaker_TimeoutsSeenLateAreNotRedis(t *testing.T) {
	t.Parallel()
	const timeout = 20 * time.Millisecond
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
			rdb.AddHook(stalled{late: c.late})
			s, err := fastpath.New(rdb, fastpath.Options{
				Timeout: timeout,
				Breaker: fastpath.BreakerOptions{Failures: 3, CoolDown: time.Hour},
			})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 5 {
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
				t.Fatalf("breaker %v after 5 timeouts seen on time, want open", s.Breaker())
			}
		})
	}
}
