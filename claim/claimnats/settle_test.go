package claimnats_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimnats"
	"github.com/oncekey/oncekey/driver/settle"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/pgproxy"
)

// proxied returns a pool on the test's schema through a pgproxy.Cutter the
// test can take down (the database unreachable).
func (e *env) proxied() (*pgproxy.Cutter, *pgxpool.Pool) {
	e.t.Helper()
	cfg, err := pgxpool.ParseConfig(e.schema.URL)
	if err != nil {
		e.t.Fatal(err)
	}
	px, err := pgproxy.New("tcp", net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(px.Close)
	cfg.ConnConfig.Host = "127.0.0.1"
	cfg.ConnConfig.Port = px.Port()
	cfg.ConnConfig.ConnectTimeout = time.Second
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(p.Close)
	return px, p
}

// state returns the state of the test's only record ("" before it exists).
func (e *env) state() string {
	e.t.Helper()
	var s string
	err := e.schema.Pool.QueryRow(context.Background(), `SELECT state::text FROM idempotency_requests`).Scan(&s)
	if err != nil && !strings.Contains(err.Error(), "no rows") {
		e.t.Fatal(err)
	}
	return s
}

// waitUntil polls ok until it holds, failing the test after within.
func waitUntil(t *testing.T, what string, within time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// actions records what a consumer did with each delivery.
type actions struct {
	mu  sync.Mutex
	got []claimnats.Action
	err []error
}

func (a *actions) add(x claimnats.Action, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.got = append(a.got, x)
	a.err = append(a.err, err)
}

func (a *actions) list() ([]claimnats.Action, []error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]claimnats.Action(nil), a.got...), append([]error(nil), a.err...)
}

// outageAtCompletion is defect 1 of issue 27: lease 2s; the handler does its
// effect, then PostgreSQL is unreachable for 300 ms as the completion is
// written. It returns the effects counted downstream once the message was
// acknowledged, and the consumer's actions.
func outageAtCompletion(t *testing.T) (int32, []claimnats.Action) {
	e := newEnv(t)
	px, pool := e.proxied()
	cons, err := claimnats.New(e.claimer(pool, e.rdb, 2*time.Second), claimnats.WithRetryDelay(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var effects atomic.Int32 // the downstream's count
	var outages sync.WaitGroup
	var acts actions
	sub := e.consumer(e.dial(), 30*time.Second)
	cc, err := sub.Consume(func(msg jetstream.Msg) {
		acts.add(cons.Run(context.Background(), msg, func(ctx context.Context, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
			if effects.Add(1) == 1 {
				px.SetDown(true)
				outages.Add(1)
				time.AfterFunc(300*time.Millisecond, func() { px.SetDown(false); outages.Done() })
			}
			return durable.Result{Body: []byte("charged")}, nil
		}))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	e.publish("charge-o", `{"amount":7}`)
	waitUntil(t, "the message acknowledged", 30*time.Second, func() bool {
		a, _ := acts.list()
		return len(a) > 0 && a[len(a)-1] == claimnats.Ack
	})
	e.drained(sub, 10*time.Second)
	outages.Wait()
	a, _ := acts.list()
	return effects.Load(), a
}

// Defect 1: a store outage of 300 ms at completion, well inside the lease,
// does not run the message twice: the completion is retried while the lease
// lasts, and the message is acknowledged once it is recorded.
func TestRun_StoreOutageAtCompletion_OneEffect(t *testing.T) {
	n, a := outageAtCompletion(t)
	if n != 1 {
		t.Fatalf("effects: %d, want 1 (actions %v)", n, a)
	}
	if len(a) != 1 || a[0] != claimnats.Ack {
		t.Fatalf("actions: %v, want one Ack (the completion waited out the outage)", a)
	}
}

// Negative control: one completion attempt (the consumer before the engine)
// leaves the record to the redelivery's takeover, which runs the effect
// again. The test above catches it.
func TestNegativeControl_OneAttempt_StoreOutageAtCompletion_TwoEffects(t *testing.T) {
	defer settle.Break(settle.OneAttempt)()
	if n, a := outageAtCompletion(t); n != 2 {
		t.Fatalf("with one completion attempt: %d effects (actions %v), want the 2 the test above catches", n, a)
	}
}

// keepAlives counts the goroutines renewing a lease.
func keepAlives() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "claim.(*Lease).KeepAlive")
		}
		buf = make([]byte, 2*len(buf))
	}
}

type panicRun struct {
	effects int32
	actions []claimnats.Action
	errs    []error
	state   string
	leaked  int // lease renewals still running after the deliveries
	logged  string
}

// panicAfterEffect is defect 2 of issue 27: a handler that panics after its
// effect. It waits until the message was delivered 3 times (or 10 s), then
// reports what it saw.
func panicAfterEffect(t *testing.T) panicRun {
	e := newEnv(t)
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	cons, err := claimnats.New(e.claimer(nil, e.rdb, 2*time.Second), claimnats.WithLogger(log),
		claimnats.WithRetryDelay(100*time.Millisecond), claimnats.WithUncertainDelay(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	base := keepAlives()
	var effects atomic.Int32
	var acts actions
	sub := e.consumer(e.dial(), 30*time.Second)
	cc, err := sub.Consume(func(msg jetstream.Msg) {
		acts.add(cons.Run(context.Background(), msg, func(ctx context.Context, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
			effects.Add(1)
			panic("charge-p: gateway client bug after the charge")
		}))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	e.publish("charge-p", `{"amount":9}`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		a, _ := acts.list()
		if len(a) >= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	cc.Stop()
	// The renewals of a settled lease end soon after its settlement; poll
	// for that, bounded.
	leaked := keepAlives() - base
	for end := time.Now().Add(5 * time.Second); leaked > 0 && time.Now().Before(end); leaked = keepAlives() - base {
		time.Sleep(50 * time.Millisecond)
	}
	r := panicRun{effects: effects.Load(), state: e.state(), leaked: leaked}
	r.actions, r.errs = acts.list()
	mu.Lock()
	r.logged = logs.String()
	mu.Unlock()
	return r
}

// Defect 2: a handler that panics after its effect does not crash the
// consumer, records the operation uncertain, holds the message (never acked
// as a success, never run again on its redeliveries), logs the panic at
// Error, and leaves no lease renewal behind.
func TestRun_PanicAfterEffect_UncertainHeldNoLeak(t *testing.T) {
	r := panicAfterEffect(t)
	if r.effects != 1 {
		t.Fatalf("effects: %d, want 1", r.effects)
	}
	if len(r.actions) < 3 {
		t.Fatalf("deliveries: %v, want at least 3 (the held message is redelivered)", r.actions)
	}
	for i, a := range r.actions {
		if a != claimnats.Hold {
			t.Fatalf("delivery %d: %v (%v), want Hold", i+1, a, r.errs[i])
		}
	}
	if !errors.Is(r.errs[0], claimnats.ErrPanicked) {
		t.Fatalf("first delivery's error: %v, want ErrPanicked", r.errs[0])
	}
	if r.state != "uncertain" {
		t.Fatalf("record state: %q, want uncertain", r.state)
	}
	if r.leaked != 0 {
		t.Fatalf("%d lease renewals still running after the deliveries", r.leaked)
	}
	if !strings.Contains(r.logged, "level=ERROR") || !strings.Contains(r.logged, "gateway client bug after the charge") {
		t.Fatalf("log: %q, want an Error line with the panic value", r.logged)
	}
}

// Negative control: without the engine's recover the lease is renewed for
// as long as the process lives: the record stays processing (its
// redeliveries answered in progress, never uncertain) and a renewal
// goroutine leaks. The test above catches both.
func TestNegativeControl_NoRecover_PanicAfterEffect(t *testing.T) {
	defer settle.Break(settle.NoRecover)()
	r := panicAfterEffect(t)
	if r.state == "uncertain" || r.leaked == 0 {
		t.Fatalf("without recover: state %q, %d leaked renewals; want processing and a leak (caught above)", r.state, r.leaked)
	}
}

// longWork runs one message whose handler takes 3 s on a JetStream
// consumer with AckWait 1 s, Run keeping it in progress every `every`, and
// returns the deliveries of the message until it was acknowledged.
func longWork(t *testing.T, every time.Duration) []claimnats.Action {
	defer claimnats.SetProgressEvery(every)()
	e := newEnv(t)
	cons, err := claimnats.New(e.claimer(nil, e.rdb, 2*time.Second), claimnats.WithRetryDelay(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var acts actions
	var runs atomic.Int32
	sub := e.consumer(e.dial(), time.Second)
	cc, err := sub.Consume(func(msg jetstream.Msg) {
		acts.add(cons.Run(context.Background(), msg, func(ctx context.Context, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
			runs.Add(1)
			select {
			case <-time.After(3 * time.Second): // the long work
			case <-ctx.Done():
			}
			return durable.Result{Body: []byte("done")}, nil
		}))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	e.publish("charge-l", `{"amount":2}`)
	waitUntil(t, "the message acknowledged", 30*time.Second, func() bool {
		a, _ := acts.list()
		return len(a) > 0 && a[len(a)-1] == claimnats.Ack
	})
	e.drained(sub, 10*time.Second)
	if runs.Load() != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs.Load())
	}
	a, _ := acts.list()
	return a
}

// Work longer than AckWait is not redelivered while it runs: Run keeps the
// message in progress.
func TestRun_LongWork_KeptInProgress(t *testing.T) {
	if a := longWork(t, 100*time.Millisecond); len(a) != 1 || a[0] != claimnats.Ack {
		t.Fatalf("deliveries: %v, want one, acked", a)
	}
}

// Negative control: without the progress signal AckWait redelivers the
// message during the work (answered in progress); the test above would
// see that second delivery.
func TestNegativeControl_NoProgress_LongWorkRedelivered(t *testing.T) {
	if a := longWork(t, time.Hour); len(a) < 2 {
		t.Fatalf("deliveries without progress: %v, want a redelivery during the work", a)
	}
}
