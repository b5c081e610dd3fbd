package claimnats_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimnats"
	"github.com/oncekey/oncekey/claim/driver/consume"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/consumetest"
)

// The scenarios every consumer adapter runs (testkit/consumetest), here
// on a JetStream pull consumer.

func TestRun_StoreOutageAtCompletion_OneEffect(t *testing.T) {
	consumetest.StoreOutageAtCompletion(t, newEnv(t))
}

func TestScenarios(t *testing.T) { consumetest.Scenarios(t, newEnv) }

// Settled waits until the test's consumer has nothing pending or
// unacknowledged (consumetest.Rig.Settled).
func (e *env) Settled(_ int, within time.Duration) { e.drained(e.sub, within) }

// ConsumeDo consumes the test's stream with the durable consumer of
// AckWait 2s on a connection of its own, in Do mode
// (consumetest.Rig.ConsumeDo).
func (e *env) ConsumeDo(ctx context.Context, c *claim.Claimer[pgx.Tx], retry time.Duration, work consumetest.DoWork) (closeConn func()) {
	e.t.Helper()
	cons, err := claimnats.New(c, claimnats.WithRetryDelay(retry))
	if err != nil {
		e.t.Fatal(err)
	}
	return e.consume(func(msg jetstream.Msg) {
		_, _ = cons.Do(ctx, msg, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
			return work(ctx, tx, op, msg.Headers().Get(nats.MsgIdHdr))
		})
	})
}

// ConsumeRaw consumes the test's stream without the adapter
// (consumetest.Rig.ConsumeRaw).
func (e *env) ConsumeRaw(effect func(id string) error) {
	e.consume(func(msg jetstream.Msg) {
		if effect(msg.Headers().Get(nats.MsgIdHdr)) == nil {
			_ = msg.Ack()
		}
	})
}

// consume runs handle on each message of the durable consumer of AckWait
// 2s, bound on a connection of its own (e.sub), until closeConn or the
// test's end.
func (e *env) consume(handle func(jetstream.Msg)) (closeConn func()) {
	e.t.Helper()
	nc := e.dial()
	e.sub = e.consumer(nc, 2*time.Second)
	cc, err := e.sub.Consume(handle)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(cc.Stop)
	return func() { cc.Stop(); nc.Close() }
}

// ConsumeRun consumes the test's stream with a durable consumer of AckWait
// 30s (consumetest.Rig.ConsumeRun).
func (e *env) ConsumeRun(c *claim.Claimer[pgx.Tx], s consumetest.Settings, work consumetest.Work,
	record func(consume.Action, error)) (drained func(time.Duration), stop func()) {
	e.t.Helper()
	cons, err := claimnats.New(c, consumetest.Options(s, claimnats.WithRetryDelay, claimnats.WithUncertainDelay, claimnats.WithLogger)...)
	if err != nil {
		e.t.Fatal(err)
	}
	sub := e.consumer(e.dial(), 30*time.Second)
	cc, err := sub.Consume(func(msg jetstream.Msg) {
		record(cons.Run(context.Background(), msg, func(ctx context.Context, _ jetstream.Msg, op claim.Op) (durable.Result, error) {
			return work(ctx, op)
		}))
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(cc.Stop)
	return func(within time.Duration) { e.drained(sub, within) }, cc.Stop
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
	var acts consumetest.Actions
	var runs atomic.Int32
	sub := e.consumer(e.dial(), time.Second)
	cc, err := sub.Consume(func(msg jetstream.Msg) {
		acts.Add(cons.Run(context.Background(), msg, func(ctx context.Context, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
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
	e.Publish("charge-l", `{"amount":2}`)
	consumetest.WaitUntil(t, "the message acknowledged", 30*time.Second, func() bool { return acts.LastIs(claimnats.Ack) })
	e.drained(sub, 10*time.Second)
	if runs.Load() != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs.Load())
	}
	a, _ := acts.List()
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
