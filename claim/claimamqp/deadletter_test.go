package claimamqp_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimamqp"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/consumetest"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// deadLetter is a WithDeadLetter callback recording into dl, with the
// delivery's x-delivery-count as its delivery count.
func deadLetter(dl *consumetest.DeadLetters) claimamqp.Option {
	return claimamqp.WithDeadLetter(func(_ context.Context, d *amqp.Delivery, err error) {
		n, _ := d.Headers["x-delivery-count"].(int64)
		dl.Add(err, string(d.Body), n)
	})
}

// Defect 6: a delivery without a message-id and one whose id was used for
// another body are rejected without requeue, never run, and reported: the
// error Do returns matches ErrDeadLetter and its cause, the WithDeadLetter
// callback gets each before the rejection, and the counter counts them by
// reason, with no message id in its attributes.
func TestDeadLetter_NoIdentityAndMismatch_Reported(t *testing.T) {
	e := newEnv(t)
	var dl consumetest.DeadLetters
	mp := consumetest.NewCounters()
	cons := newConsumer(t, e, deadLetter(&dl), claimamqp.WithMeterProvider(mp))
	e.Publish(consumetest.ReusedID, consumetest.FirstPayload)
	e.Publish(consumetest.ReusedID, consumetest.MismatchPayload)
	e.Publish("", consumetest.NoIDPayload)
	var runs atomic.Int32
	_, ch := e.dial()
	ds := e.deliveries(ch)
	for range 3 {
		d := <-ds
		a, err := cons.Do(context.Background(), d, func(ctx context.Context, tx pgx.Tx, d *amqp.Delivery, op claim.Op) (durable.Result, error) {
			runs.Add(1)
			return effectFn(ctx, tx, d, op)
		})
		if a == claimamqp.Terminate && !errors.Is(err, claimamqp.ErrDeadLetter) {
			t.Fatalf("a rejection returned %v, want ErrDeadLetter", err)
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("runs %d, want 1", runs.Load())
	}
	consumetest.CheckGivenUp(t, "claimamqp", &dl, mp)
}

// Defect 6: RabbitMQ drops (here: dead-letters) a held message past the
// quorum queue's delivery limit (3 deliveries, the last at
// x-delivery-count 2); the Consumer told the limit reports it before the
// requeue that gives it up.
func TestDeliveryLimit(t *testing.T) {
	consumetest.DeliveryLimit(t, "claimamqp", 3, 2, heldPastLimit)
}

// heldPastLimit runs h on a quorum queue declared with x-delivery-limit 2
// (RabbitMQ dead-letters a message returned once its x-delivery-count
// reached 2: 3 deliveries) until the message reached the dead-letter
// queue, as consumetest.DeliveryLimit says.
// Told, the Consumer has WithDeliveryLimit(2); not told, it assumes the
// default (20, RabbitMQ 4's), so the drop is not seen: the option must
// name the queue's limit.
func heldPastLimit(t *testing.T, told bool, h *consumetest.Held) (testenv.Schema, *consumetest.DeadLetters, *consumetest.Counters) {
	e := newEnv(t)
	q := e.queue + ".quorum"
	if _, err := e.ch.QueueDeclare(q, true, false, false, false, amqp.Table{
		"x-queue-type": "quorum", "x-delivery-limit": 2,
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": e.dlq,
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, c := e.dial()
		_, _ = c.QueueDelete(q, false, false, false)
	})
	opts, dl, mp := consumetest.HeldOptions(told, 2, claimamqp.WithUncertainDelay, deadLetter, claimamqp.WithMeterProvider, claimamqp.WithDeliveryLimit)
	cons, err := claimamqp.New(e.claim, q, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{
		MessageId: "charge-h", ContentType: "application/json", Body: []byte(`{"amount":4}`),
	}); err != nil {
		t.Fatal(err)
	}
	_, ch := e.dial()
	ds, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for d := range ds {
			h.Add(cons.Run(context.Background(), d, func(ctx context.Context, _ *amqp.Delivery, op claim.Op) (durable.Result, error) {
				return h.Work(ctx, op)
			}))
		}
	}()
	var dead []byte
	consumetest.WaitUntil(t, "the message in the dead-letter queue", 30*time.Second, func() bool {
		d, ok, err := e.ch.Get(e.dlq, true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			dead = d.Body
		}
		return ok
	})
	if string(dead) != `{"amount":4}` {
		t.Fatalf("dead letter %q; want the message", dead)
	}
	return e.schema, dl, mp
}

func TestNew_DeadLetterOptionsChecked(t *testing.T) {
	e := newEnv(t)
	consumetest.CheckOptionsRefused(t, claimamqp.ErrConfig, func(o claimamqp.Option) error { _, err := claimamqp.New(e.claim, e.queue, o); return err },
		claimamqp.WithDeadLetter(nil), claimamqp.WithDeliveryLimit(-1), claimamqp.WithMeterProvider(nil))
}
