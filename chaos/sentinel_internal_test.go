package chaos

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/lua"
	"github.com/oncekey/oncekey/testkit/settletest"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// TestBreakers_Verdict is the redis-sentinel checks' negative control: a
// breaker that opened and did not close again is reported, one that never
// opened is not counted.
func TestBreakers_Verdict(t *testing.T) {
	b := &breakers{states: map[int][]string{
		0: {"open", "half-open", "closed"},
		1: {"open", "half-open", "open"},
		2: {},
		3: {"open", "half-open"},
	}}
	opened, open := b.verdict()
	if opened != 3 || !slices.Equal(open, []int{1, 3}) {
		t.Fatalf("verdict = %d opened, %v still open; want 3 opened, [1 3] still open", opened, open)
	}
	if got := b.last(3); got != "half-open" {
		t.Fatalf("last(3) = %q", got)
	}
	if got := b.last(2); got != "closed" {
		t.Fatalf("last(2) = %q, want closed (never opened)", got)
	}
}

// TestBreakerHandler_HearsTheLibrary ties the recorder to the library's
// own log line: a Claimer whose Redis refuses every connection opens its
// breaker, and the handler records it (and passes records on).
func TestBreakerHandler_HearsTheLibrary(t *testing.T) {
	_, st := settletest.Store(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close() // nothing listens there now: every connection is refused
	rc := redis.NewClient(&redis.Options{Addr: dead, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer rc.Close()
	b := &breakers{states: map[int][]string{}}
	// The Claimer logs from its own goroutines too (the durability
	// check's warnings): count under a lock-free counter.
	var passed atomic.Int64
	inner := handlerFunc(func(r slog.Record) { passed.Add(1) })
	cl, err := claim.New[pgx.Tx](st, claim.WithLease(time.Minute),
		claim.WithRedis(rc, lua.Options{Prefix: testenv.Name("brk"), BreakerFailures: 2, BreakerCoolDown: time.Minute}),
		claim.WithLogger(slog.New(&breakerHandler{b: b, client: 7, inner: inner})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 4 {
		out, err := cl.Do(ctx, claim.Request{Scope: durable.Scope{Tenant: "t", Operation: "op", Key: "k" + string(rune('a'+i))}, Fingerprint: "f"},
			func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
				return durable.Result{StatusCode: 200}, nil
			})
		if err != nil || out.Kind != claim.Executed {
			t.Fatalf("Do %d with Redis refused: %v %v (the database must serve it)", i, out.Kind, err)
		}
	}
	if opened, open := b.verdict(); opened != 1 || !slices.Equal(open, []int{7}) {
		t.Fatalf("recorded %v: want client 7's breaker open", b.states)
	}
	if passed.Load() == 0 {
		t.Fatal("the handler passed nothing on to the inner handler")
	}
}

type handlerFunc func(slog.Record)

func (handlerFunc) Enabled(context.Context, slog.Level) bool { return true }
func (f handlerFunc) Handle(_ context.Context, r slog.Record) error {
	f(r)
	return nil
}
func (f handlerFunc) WithAttrs([]slog.Attr) slog.Handler { return f }
func (f handlerFunc) WithGroup(string) slog.Handler      { return f }
