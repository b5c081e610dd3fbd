package claimnats_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimnats"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/consumetest"
	"github.com/oncekey/oncekey/testkit/redisproc"
)

// consumeDo consumes from c with the adapter in Do mode until stopped.
func consumeDo(t *testing.T, c jetstream.Consumer, cons *claimnats.Consumer[pgx.Tx], fn func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg, op claim.Op) (durable.Result, error)) jetstream.ConsumeContext {
	t.Helper()
	cc, err := c.Consume(func(msg jetstream.Msg) {
		_, _ = cons.Do(context.Background(), msg, fn)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	return cc
}

func effectFn(ctx context.Context, tx pgx.Tx, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
	if err := insertEffect(ctx, tx, op, msg); err != nil {
		return durable.Result{}, err
	}
	return durable.Result{Body: []byte("charged")}, nil
}

// The same message published 5 times, its first delivery's consumer killed
// mid-handler: one effect.
func TestDo_DuplicatesAndKilledConsumer_OneEffect(t *testing.T) {
	e := newEnv(t)
	c := e.claimer(nil, e.rdb, 2*time.Second)
	cons, err := claimnats.New(c, claimnats.WithRetryDelay(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// Consumer A takes the first delivery and is killed inside the handler:
	// its connection closes and its transaction rolls back (a killed
	// process's transaction is aborted by PostgreSQL the same way).
	ncA := e.dial()
	started := make(chan struct{})
	killA, kill := context.WithCancel(context.Background())
	var once sync.Once
	ccA, err := e.consumer(ncA, time.Second).Consume(func(msg jetstream.Msg) {
		_, _ = cons.Do(killA, msg, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
			if err := insertEffect(ctx, tx, op, msg); err != nil {
				return durable.Result{}, err
			}
			once.Do(func() { close(started) })
			<-ctx.Done()
			return durable.Result{}, ctx.Err()
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	e.publish("charge-1", `{"amount":100,"currency":"EUR"}`)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("consumer A never started the handler")
	}
	ccA.Stop()
	ncA.Close()
	kill()

	for range 4 {
		e.publish("charge-1", `{"currency":"EUR","amount":100}`) // same payload, another member order
	}
	ncB := e.dial()
	cB := e.consumer(ncB, time.Second)
	consumeDo(t, cB, cons, effectFn)
	e.drained(cB, 30*time.Second)
	if rows, distinct := e.effects(); rows != 1 || distinct != 1 {
		t.Fatalf("effects: %d rows for %d messages, want exactly 1", rows, distinct)
	}
}

// Without the adapter, the same stream shows the duplicate effect the test
// above would catch: the invariant is observable.
func TestNegativeControl_WithoutAdapter_DuplicateEffects(t *testing.T) {
	e := newEnv(t)
	for range 3 {
		e.publish("charge-1", `{"amount":100}`)
	}
	c := e.consumer(e.dial(), time.Second)
	cc, err := c.Consume(func(msg jetstream.Msg) {
		_, err := e.schema.Pool.Exec(context.Background(), `INSERT INTO effects (op_id, msg) VALUES ('', $1)`, msg.Headers().Get("Nats-Msg-Id"))
		if err == nil {
			_ = msg.Ack()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	e.drained(c, 30*time.Second)
	if rows, distinct := e.effects(); rows != 3 || distinct != 1 {
		t.Fatalf("without the adapter: %d rows for %d messages, want the 3 duplicates", rows, distinct)
	}
}

// Three consumers compete for 10 messages each published 3 times: one effect
// per message.
func TestDo_CompetingConsumers_OneEffectEach(t *testing.T) {
	e := newEnv(t)
	const n = 10
	for i := range n {
		for range 3 {
			e.publish(fmt.Sprintf("charge-%d", i), fmt.Sprintf(`{"amount":%d}`, i))
		}
	}
	var last jetstream.Consumer
	for range 3 {
		cons, err := claimnats.New(e.claimer(nil, e.rdb, 2*time.Second), claimnats.WithRetryDelay(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		last = e.consumer(e.dial(), 2*time.Second)
		consumeDo(t, last, cons, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
			time.Sleep(20 * time.Millisecond) // widen the race between duplicates
			return effectFn(ctx, tx, msg, op)
		})
	}
	e.drained(last, 60*time.Second)
	if rows, distinct := e.effects(); rows != n || distinct != n {
		t.Fatalf("effects: %d rows for %d messages, want %d and %d", rows, distinct, n, n)
	}
}

// Redis restarted empty between deliveries of the same messages: the durable
// store still arbitrates, one effect per message.
func TestDo_RedisRestartedEmpty_OneEffect(t *testing.T) {
	e := newEnv(t)
	srv := redisproc.Start(t, redisproc.Options{})
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	c := e.claimer(nil, rdb, 2*time.Second)
	cons, err := claimnats.New(c, claimnats.WithRetryDelay(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	sub := e.consumer(e.dial(), 2*time.Second)
	consumeDo(t, sub, cons, effectFn)
	for i := range 5 {
		e.publish(fmt.Sprintf("charge-%d", i), `{"amount":1}`)
	}
	e.drained(sub, 30*time.Second)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		e.publish(fmt.Sprintf("charge-%d", i), `{"amount":1}`)
		e.publish(fmt.Sprintf("charge-new-%d", i), `{"amount":1}`)
	}
	e.drained(sub, 30*time.Second)
	if rows, distinct := e.effects(); rows != 10 || distinct != 10 {
		t.Fatalf("effects after the Redis restart: %d rows for %d messages, want 10", rows, distinct)
	}
}

// A reused id with another payload is terminated with a clear log line
// without the raw id, and never run.
func TestMismatch_TerminatedNeverRun(t *testing.T) {
	e := newEnv(t)
	var logs consumetest.Log
	log := slog.New(slog.NewTextHandler(&logs, nil))
	cons, err := claimnats.New(e.claimer(nil, e.rdb, 2*time.Second), claimnats.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	e.publish("acct-secret-77", `{"amount":1}`)
	e.publish("acct-secret-77", `{"amount":999}`)
	sub := e.consumer(e.dial(), 2*time.Second)
	var actions sync.Map
	var runs atomic.Int32
	cc, err := sub.Consume(func(msg jetstream.Msg) {
		a, err := cons.Do(context.Background(), msg, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
			runs.Add(1)
			if string(msg.Data()) != `{"amount":1}` {
				t.Errorf("the mismatching payload ran")
			}
			return effectFn(ctx, tx, msg, op)
		})
		actions.Store(string(msg.Data()), [2]any{a, err})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	e.drained(sub, 30*time.Second)
	got, _ := actions.Load(`{"amount":999}`)
	r, _ := got.([2]any)
	if r[0] != claimnats.Terminate || !errors.Is(r[1].(error), claim.ErrMismatch) {
		t.Fatalf("mismatch: %v", r)
	}
	if out := logs.String(); !strings.Contains(out, "dead-lettered") || strings.Contains(out, "acct-secret-77") {
		t.Fatalf("log: %q", out)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
}

// Workflow mode: a consumer paused (cut off its database) past its lease is
// fenced when it resumes; the redelivery replays the taker's result.
func TestRun_PausedPastLease_Fenced(t *testing.T) {
	e := newEnv(t)
	fr := newFreezer(t, "127.0.0.1:5432")
	pausedPool := fr.pool(t, e.schema.URL)
	cA, err := claimnats.New(e.claimer(pausedPool, nil, time.Second), claimnats.WithRetryDelay(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	cB, err := claimnats.New(e.claimer(nil, nil, time.Second), claimnats.WithRetryDelay(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	e.publish("charge-p", `{"amount":5}`)
	sub := e.consumer(e.dial(), 30*time.Second)
	msgs, err := sub.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	first := <-msgs.Messages()
	if first == nil {
		t.Fatal("no message")
	}
	resume := make(chan struct{})
	var downstream sync.Map // operation id → calls, as an idempotent downstream records them
	calls := func(id string) { v, _ := downstream.LoadOrStore(id, new(atomic.Int32)); v.(*atomic.Int32).Add(1) }
	type res struct {
		a     claimnats.Action
		err   error
		cause error
	}
	done := make(chan res, 1)
	go func() {
		var cause error
		a, err := cA.Run(context.Background(), first, func(ctx context.Context, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
			fr.freeze(true) // paused: no renewals reach the database
			<-ctx.Done()    // KeepAlive gives up on the lease
			cause = context.Cause(ctx)
			<-resume
			fr.freeze(false)
			calls(op.ID)
			return durable.Result{Body: []byte("A")}, nil
		})
		done <- res{a, err, cause}
	}()
	// B takes over once A's lease expired, and completes.
	var bAction claimnats.Action
	deadline := time.Now().Add(20 * time.Second)
	for bAction != claimnats.Ack {
		if time.Now().After(deadline) {
			t.Fatalf("B never took over: last %v", bAction)
		}
		time.Sleep(300 * time.Millisecond)
		bAction, _ = cB.Run(context.Background(), fakeMsg{first}, func(ctx context.Context, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
			calls(op.ID)
			return durable.Result{Body: []byte("B")}, nil
		})
	}
	close(resume)
	r := <-done
	if !errors.Is(r.cause, claim.ErrLeaseExpired) {
		t.Fatalf("A's work context cause = %v, want ErrLeaseExpired", r.cause)
	}
	if r.a != claimnats.Retry || !errors.Is(r.err, claim.ErrFenced) {
		t.Fatalf("A after resuming: %v %v, want Retry with ErrFenced", r.a, r.err)
	}
	// Both executions carried the same operation id downstream, so a
	// downstream deduplicating on it absorbs the repeat.
	ids := 0
	downstream.Range(func(_, v any) bool {
		ids++
		if n := v.(*atomic.Int32).Load(); n != 2 {
			t.Errorf("downstream calls under the operation id: %d, want 2 (A and B)", n)
		}
		return true
	})
	if ids != 1 {
		t.Fatalf("downstream saw %d operation ids, want 1", ids)
	}
	// The redelivery is answered with B's stored result, without running.
	a, err := cA.Run(context.Background(), fakeMsg{first}, func(context.Context, jetstream.Msg, claim.Op) (durable.Result, error) {
		t.Fatal("ran after completion")
		return durable.Result{}, nil
	})
	if a != claimnats.Ack || err != nil {
		t.Fatalf("redelivery: %v %v", a, err)
	}
}

// fakeMsg hands the same message to another consumer without acknowledging
// the broker twice: acknowledgements are recorded, not sent.
type fakeMsg struct{ jetstream.Msg }

func (fakeMsg) Ack() error                       { return nil }
func (fakeMsg) NakWithDelay(time.Duration) error { return nil }
func (fakeMsg) Term() error                      { return nil }
