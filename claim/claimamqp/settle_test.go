package claimamqp_test

import (
	"context"
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

// The scenarios of issue 27 every consumer adapter runs
// (testkit/consumetest), here on a RabbitMQ queue.

func TestRun_StoreOutageAtCompletion_OneEffect(t *testing.T) {
	consumetest.StoreOutageAtCompletion(t, newEnv(t).rig())
}

func TestNegativeControl_OneAttempt_StoreOutageAtCompletion_TwoEffects(t *testing.T) {
	consumetest.StoreOutageAtCompletionCaught(t, newEnv(t).rig())
}

func TestRun_PanicAfterEffect_UncertainHeldNoLeak(t *testing.T) {
	consumetest.PanicAfterEffect(t, newEnv(t).rig())
}

func TestNegativeControl_NoRecover_PanicAfterEffect(t *testing.T) {
	consumetest.PanicAfterEffectCaught(t, newEnv(t).rig())
}

func (e *env) rig() consumetest.Rig {
	return consumetest.Rig{Schema: e.schema, Redis: e.rdb, Prefix: e.prefix, Publish: e.publish, Consume: e.consumeRun}
}

// consumeRun consumes the test's queue on a channel of its own; drained
// waits until the queue has no message ready (consumetest.Rig.Consume).
func (e *env) consumeRun(c *claim.Claimer[pgx.Tx], s consumetest.Settings, work consumetest.Work,
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
