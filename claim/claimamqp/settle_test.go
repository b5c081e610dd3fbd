package claimamqp_test

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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimamqp"
	"github.com/oncekey/oncekey/driver/settle"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/testkit/pgproxy"
)

// proxiedClaimer returns a Claimer (lease 2s, no Redis) on the test's
// schema through a pgproxy.Cutter the test can take down.
func (e *env) proxiedClaimer() (*pgproxy.Cutter, *claim.Claimer[pgx.Tx]) {
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
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(pool.Close)
	st, err := postgres.New(pool, postgres.WithSchema(e.schema.Name))
	if err != nil {
		e.t.Fatal(err)
	}
	c, err := claim.New(st, claim.WithLease(2*time.Second), claim.WithRetention(time.Hour))
	if err != nil {
		e.t.Fatal(err)
	}
	return px, c
}

// state returns the state of the test's only record ("" before it exists).
func (e *env) state() string {
	e.t.Helper()
	var s string
	err := e.schema.Pool.QueryRow(context.Background(), `SELECT state::text FROM idempotency_requests`).Scan(&s)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		e.t.Fatal(err)
	}
	return s
}

// queued returns the messages ready in the test's queue.
func (e *env) queued() int {
	e.t.Helper()
	_, ch := e.dial()
	q, err := ch.QueueDeclarePassive(e.queue, false, false, false, false, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return q.Messages
}

type actions struct {
	mu  sync.Mutex
	got []claimamqp.Action
	err []error
}

func (a *actions) add(x claimamqp.Action, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.got = append(a.got, x)
	a.err = append(a.err, err)
}

func (a *actions) list() ([]claimamqp.Action, []error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]claimamqp.Action(nil), a.got...), append([]error(nil), a.err...)
}

// runConsumer consumes the test's queue on its own channel with cons.Run,
// recording every action, until the test ends.
func (e *env) runConsumer(cons *claimamqp.Consumer[pgx.Tx], acts *actions,
	fn func(context.Context, *amqp.Delivery, claim.Op) (durable.Result, error)) {
	e.t.Helper()
	_, ch := e.dial()
	ds, err := ch.Consume(e.queue, "", false, false, false, false, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	go func() {
		for d := range ds {
			acts.add(cons.Run(context.Background(), d, fn))
		}
	}()
}

// outageAtCompletion is defect 1 of issue 27 (see claimnats' test of the
// same name): it returns the effects counted downstream once the message
// was acknowledged, and the consumer's actions.
func outageAtCompletion(t *testing.T) (int32, []claimamqp.Action) {
	e := newEnv(t)
	px, c := e.proxiedClaimer()
	cons, err := claimamqp.New(c, e.queue, claimamqp.WithRetryDelay(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var effects atomic.Int32
	var outages sync.WaitGroup
	var acts actions
	e.runConsumer(cons, &acts, func(ctx context.Context, d *amqp.Delivery, op claim.Op) (durable.Result, error) {
		if effects.Add(1) == 1 {
			px.SetDown(true)
			outages.Add(1)
			time.AfterFunc(300*time.Millisecond, func() { px.SetDown(false); outages.Done() })
		}
		return durable.Result{Body: []byte("charged")}, nil
	})
	e.publish("charge-o", `{"amount":7}`)
	waitFor(t, "the message acknowledged", 30*time.Second, func() bool {
		a, _ := acts.list()
		return len(a) > 0 && a[len(a)-1] == claimamqp.Ack
	})
	outages.Wait()
	if n := e.queued(); n != 0 {
		t.Fatalf("%d messages still queued after the ack", n)
	}
	a, _ := acts.list()
	return effects.Load(), a
}

// Defect 1: a store outage of 300 ms at completion does not run the message
// twice; the delivery is acknowledged once the completion is recorded.
func TestRun_StoreOutageAtCompletion_OneEffect(t *testing.T) {
	n, a := outageAtCompletion(t)
	if n != 1 {
		t.Fatalf("effects: %d, want 1 (actions %v)", n, a)
	}
	if len(a) != 1 || a[0] != claimamqp.Ack {
		t.Fatalf("actions: %v, want one Ack", a)
	}
}

// Negative control: one completion attempt runs the effect twice; the test
// above catches it.
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
	actions []claimamqp.Action
	errs    []error
	state   string
	leaked  int
	logged  string
}

// panicAfterEffect is defect 2 of issue 27: a handler that panics after its
// effect; it waits for 3 deliveries (or 10 s) and reports what it saw.
func panicAfterEffect(t *testing.T) panicRun {
	e := newEnv(t)
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	cons := newConsumer(t, e, claimamqp.WithLogger(log), claimamqp.WithUncertainDelay(200*time.Millisecond))
	base := keepAlives()
	var effects atomic.Int32
	var acts actions
	e.runConsumer(cons, &acts, func(context.Context, *amqp.Delivery, claim.Op) (durable.Result, error) {
		effects.Add(1)
		panic("charge-p: gateway client bug after the charge")
	})
	e.publish("charge-p", `{"amount":9}`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		a, _ := acts.list()
		if len(a) >= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
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

// Defect 2: a handler that panics after its effect: the consumer survives,
// the record is uncertain, the delivery is held (never acked, never run
// again), the panic is logged at Error, no renewal is left behind.
func TestRun_PanicAfterEffect_UncertainHeldNoLeak(t *testing.T) {
	r := panicAfterEffect(t)
	if r.effects != 1 {
		t.Fatalf("effects: %d, want 1", r.effects)
	}
	if len(r.actions) < 3 {
		t.Fatalf("deliveries: %v, want at least 3 (the held delivery is requeued)", r.actions)
	}
	for i, a := range r.actions {
		if a != claimamqp.Hold {
			t.Fatalf("delivery %d: %v (%v), want Hold", i+1, a, r.errs[i])
		}
	}
	if !errors.Is(r.errs[0], claimamqp.ErrPanicked) {
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

// Negative control: without the engine's recover the record stays
// processing and a renewal goroutine leaks; the test above catches both.
func TestNegativeControl_NoRecover_PanicAfterEffect(t *testing.T) {
	defer settle.Break(settle.NoRecover)()
	r := panicAfterEffect(t)
	if r.state == "uncertain" || r.leaked == 0 {
		t.Fatalf("without recover: state %q, %d leaked renewals; want processing and a leak (caught above)", r.state, r.leaked)
	}
}
