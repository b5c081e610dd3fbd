package claimamqp_test

import (
	"context"
	"errors"
	"strings"
	"sync"
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

// deadLetters records the calls of a WithDeadLetter callback.
type deadLetters struct {
	mu     sync.Mutex
	errs   []error
	bodies []string
	counts []int64 // x-delivery-count of each
}

func (d *deadLetters) add(_ context.Context, dl *amqp.Delivery, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.errs = append(d.errs, err)
	d.bodies = append(d.bodies, string(dl.Body))
	n, _ := dl.Headers["x-delivery-count"].(int64)
	d.counts = append(d.counts, n)
}

func (d *deadLetters) list() ([]error, []string, []int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]error(nil), d.errs...), append([]string(nil), d.bodies...), append([]int64(nil), d.counts...)
}

// Defect 6: a delivery without a message-id and one whose id was used for
// another body are rejected without requeue, never run, and reported: the
// error Do returns matches ErrDeadLetter and its cause, the WithDeadLetter
// callback gets each before the rejection, and the counter counts them by
// reason, with no message id in its attributes.
func TestDeadLetter_NoIdentityAndMismatch_Reported(t *testing.T) {
	e := newEnv(t)
	var dl deadLetters
	mp := consumetest.NewCounters()
	cons := newConsumer(t, e, claimamqp.WithDeadLetter(dl.add), claimamqp.WithMeterProvider(mp))
	e.publish("acct-secret-77", `{"amount":1}`)
	e.publish("acct-secret-77", `{"amount":999}`)
	e.publish("", `{"amount":3}`)
	var runs atomic.Int32
	_, ch := e.dial()
	ds, err := ch.Consume(e.queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
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
	got, bodies, _ := dl.list()
	if len(got) != 2 {
		t.Fatalf("dead-letter callback: %d calls (%v), want 2", len(got), got)
	}
	for i, err := range got {
		want := claim.ErrMismatch
		if bodies[i] == `{"amount":3}` {
			want = claimamqp.ErrNoIdentity
		}
		if !errors.Is(err, claimamqp.ErrDeadLetter) || !errors.Is(err, want) {
			t.Fatalf("dead letter %s: %v, want ErrDeadLetter and %v", bodies[i], err, want)
		}
	}
	for _, k := range []string{
		"oncekey.messages.dead_lettered|adapter=claimamqp|reason=mismatch",
		"oncekey.messages.dead_lettered|adapter=claimamqp|reason=no_identity",
	} {
		if mp.Get(k) != 1 {
			t.Fatalf("metric %s = %d, want 1 (have %v)", k, mp.Get(k), mp.Keys())
		}
	}
	for _, k := range mp.Keys() {
		if strings.Contains(k, "acct-secret-77") {
			t.Fatalf("a metric names the message id: %s", k)
		}
	}
}

// heldPastLimit runs an uncertain handler on a quorum queue declared with
// x-delivery-limit 2 (RabbitMQ dead-letters a message returned once its
// x-delivery-count reached 2: 3 deliveries), until the message reached the
// dead-letter queue, and returns the deliveries and the callback's calls.
func heldPastLimit(t *testing.T, opts ...claimamqp.Option) (int, *deadLetters, *consumetest.Counters) {
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
	var dl deadLetters
	mp := consumetest.NewCounters()
	cons, err := claimamqp.New(e.claim, q, append([]claimamqp.Option{
		claimamqp.WithUncertainDelay(100 * time.Millisecond), claimamqp.WithDeadLetter(dl.add), claimamqp.WithMeterProvider(mp),
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
	var acts actions
	var runs atomic.Int32
	go func() {
		for d := range ds {
			acts.add(cons.Run(context.Background(), d, func(context.Context, *amqp.Delivery, claim.Op) (durable.Result, error) {
				runs.Add(1)
				return durable.Result{}, errors.New("gateway timed out after the request was sent")
			}))
		}
	}()
	var dead []byte
	waitFor(t, "the message in the dead-letter queue", 30*time.Second, func() bool {
		d, ok, err := e.ch.Get(e.dlq, true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			dead = d.Body
		}
		return ok
	})
	if string(dead) != `{"amount":4}` || runs.Load() != 1 {
		t.Fatalf("dead letter %q, runs %d; want the message, 1 run", dead, runs.Load())
	}
	if s := e.state(); s != "uncertain" {
		t.Fatalf("record: %q, want uncertain (left for the Reconciler)", s)
	}
	a, _ := acts.list()
	for i, x := range a {
		if x != claimamqp.Hold {
			t.Fatalf("delivery %d: %v, want Hold", i+1, x)
		}
	}
	return len(a), &dl, mp
}

// Defect 6: RabbitMQ drops (here: dead-letters) a held message past the
// quorum queue's delivery limit; the Consumer told the limit reports it
// before the requeue that gives it up.
func TestDeliveryLimit_HeldMessageReportedAtLastDelivery(t *testing.T) {
	n, dl, mp := heldPastLimit(t, claimamqp.WithDeliveryLimit(2))
	if n != 3 {
		t.Fatalf("deliveries: %d, want 3 (x-delivery-limit 2)", n)
	}
	errs, _, counts := dl.list()
	if len(errs) != 1 || !errors.Is(errs[0], claimamqp.ErrDeliveryLimit) || !errors.Is(errs[0], claimamqp.ErrDeadLetter) || counts[0] != 2 {
		t.Fatalf("dead-letter callback: %v at x-delivery-count %v, want one ErrDeliveryLimit at 2", errs, counts)
	}
	if k := "oncekey.messages.dead_lettered|adapter=claimamqp|reason=delivery_limit"; mp.Get(k) != 1 {
		t.Fatalf("metric %s = %d, want 1 (have %v)", k, mp.Get(k), mp.Keys())
	}
}

// With the default limit (20, RabbitMQ 4's) on a queue of limit 2, the
// drop is not seen: the option must name the queue's limit. This shows
// the test above depends on it.
func TestDeliveryLimit_Default_IsRabbitMQ4s(t *testing.T) {
	_, dl, _ := heldPastLimit(t)
	if errs, _, _ := dl.list(); len(errs) != 0 {
		t.Fatalf("dead-letter callback with the default limit 20 on a queue of 2: %v", errs)
	}
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
