package claimamqp_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimamqp"
	"github.com/oncekey/oncekey/claim/driver/consume"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/consumetest"
)

// The scenarios every consumer adapter runs (testkit/consumetest), here
// on a RabbitMQ queue.

func TestRun_StoreOutageAtCompletion_OneEffect(t *testing.T) {
	consumetest.StoreOutageAtCompletion(t, newEnv(t))
}

func TestScenarios(t *testing.T) { consumetest.Scenarios(t, newEnv) }

// ConsumeDo consumes the test's queue on a connection of its own in Do
// mode, counting in e.finals (consumetest.Rig.ConsumeDo).
func (e *env) ConsumeDo(ctx context.Context, c *claim.Claimer[pgx.Tx], retry time.Duration, work consumetest.DoWork) (closeConn func()) {
	e.t.Helper()
	cons, err := claimamqp.New(c, e.queue, claimamqp.WithRetryDelay(retry))
	if err != nil {
		e.t.Fatal(err)
	}
	conn := e.consume(ctx, cons, &e.finals, func(ctx context.Context, tx pgx.Tx, d *amqp.Delivery, op claim.Op) (durable.Result, error) {
		return work(ctx, tx, op, d.MessageId)
	})
	return func() { conn.Close() }
}

// ConsumeRaw consumes the test's queue without the adapter, counting the
// acknowledgements in e.finals (consumetest.Rig.ConsumeRaw).
func (e *env) ConsumeRaw(effect func(id string) error) {
	e.t.Helper()
	_, ch := e.dial()
	ds := e.deliveries(ch)
	go func() {
		for d := range ds {
			if err := effect(d.MessageId); err != nil {
				e.t.Errorf("effect of %s: %v", d.MessageId, err)
				continue
			}
			_ = d.Ack(false)
			e.finals.Add(1)
		}
	}()
}

// Settled waits until n deliveries were acknowledged or dead-lettered
// (consumetest.Rig.Settled): a delayed requeue holds a delivery
// unacknowledged, which the queue's count of ready messages does not show.
func (e *env) Settled(n int, within time.Duration) {
	e.t.Helper()
	consumetest.WaitUntil(e.t, fmt.Sprintf("%d deliveries acknowledged or dead-lettered", n), within, func() bool { return e.finals.Load() == int32(n) })
}

// ConsumeRun consumes the test's queue on a channel of its own; drained
// waits until the queue has no message ready (consumetest.Rig.ConsumeRun).
func (e *env) ConsumeRun(c *claim.Claimer[pgx.Tx], s consumetest.Settings, work consumetest.Work,
	record func(consume.Action, error)) (drained func(time.Duration), stop func()) {
	e.t.Helper()
	cons, err := claimamqp.New(c, e.queue, consumetest.Options(s, claimamqp.WithRetryDelay, claimamqp.WithUncertainDelay, claimamqp.WithLogger)...)
	if err != nil {
		e.t.Fatal(err)
	}
	_, ch := e.dial()
	ds := e.deliveries(ch)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range ds {
			record(cons.Run(context.Background(), d, func(ctx context.Context, _ *amqp.Delivery, op claim.Op) (durable.Result, error) {
				return work(ctx, op)
			}))
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = ch.Close() // ends ds; RabbitMQ requeues what was unacknowledged
			<-done
		})
	}
	e.t.Cleanup(stop)
	drained = func(within time.Duration) {
		consumetest.WaitUntil(e.t, "no message ready in the queue", within, func() bool { return e.queued() == 0 })
	}
	return drained, stop
}

// queued returns the messages ready in the test's queue.
func (e *env) queued() int {
	e.t.Helper()
	q, err := e.ch.QueueDeclarePassive(e.queue, false, false, false, false, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return q.Messages
}
