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
	e.publish(consumetest.ReusedID, consumetest.FirstPayload)
	e.publish(consumetest.ReusedID, consumetest.MismatchPayload)
	e.publish("", consumetest.NoIDPayload)
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

// heldPastLimit runs an uncertain handler on a quorum queue declared with
// x-delivery-limit 2 (RabbitMQ dead-letters a message returned once its
// x-delivery-count reached 2: 3 deliveries), until the message reached the
// dead-letter queue, and returns the deliveries and the callback's calls.
func heldPastLimit(t *testing.T, opts ...claimamqp.Option) (int, *consumetest.DeadLetters, *consumetest.Counters) {
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
	var dl consumetest.DeadLetters
	mp := consumetest.NewCounters()
	cons, err := claimamqp.New(e.claim, q, append([]claimamqp.Option{
		claimamqp.WithUncertainDelay(100 * time.Millisecond), deadLetter(&dl), claimamqp.WithMeterProvider(mp),
	}, opts...)...)
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
	var acts consumetest.Actions
	var runs atomic.Int32
	go func() {
		for d := range ds {
			acts.Add(cons.Run(context.Background(), d, func(context.Context, *amqp.Delivery, claim.Op) (durable.Result, error) {
				runs.Add(1)
				return durable.Result{}, errors.New("gateway timed out after the request was sent")
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
	a, _ := acts.List()
	consumetest.CheckHeld(t, runs.Load(), consumetest.State(t, e.schema), a)
	return len(a), &dl, mp
}

// Defect 6: RabbitMQ drops (here: dead-letters) a held message past the
// quorum queue's delivery limit; the Consumer told the limit reports it
// before the requeue that gives it up.
func TestDeliveryLimit_HeldMessageReportedAtLastDelivery(t *testing.T) {
	n, dl, mp := heldPastLimit(t, claimamqp.WithDeliveryLimit(2))
	// 3 deliveries (x-delivery-limit 2), reported at x-delivery-count 2.
	consumetest.CheckReportedAtLimit(t, "claimamqp", n, 3, 2, dl, mp)
}

// With the default limit (20, RabbitMQ 4's) on a queue of limit 2, the
// drop is not seen: the option must name the queue's limit. This shows
// the test above depends on it.
func TestDeliveryLimit_Default_IsRabbitMQ4s(t *testing.T) {
	_, dl, _ := heldPastLimit(t)
	consumetest.CheckNotReported(t, dl, "with the default limit 20 on a queue of 2")
}

func TestNew_DeadLetterOptionsChecked(t *testing.T) {
	e := newEnv(t)
	for i, o := range []claimamqp.Option{
		claimamqp.WithDeadLetter(nil), claimamqp.WithDeliveryLimit(-1), claimamqp.WithMeterProvider(nil),
	} {
		if _, err := claimamqp.New(e.claim, e.queue, o); !errors.Is(err, claimamqp.ErrConfig) {
			t.Errorf("option %d: %v, want ErrConfig", i, err)
		}
	}
}
