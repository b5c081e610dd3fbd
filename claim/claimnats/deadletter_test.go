package claimnats_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimnats"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/consumetest"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// deadLetter is a WithDeadLetter callback recording into dl, with the
// message's NumDelivered as its delivery count.
func deadLetter(dl *consumetest.DeadLetters) claimnats.Option {
	return claimnats.WithDeadLetter(func(_ context.Context, msg jetstream.Msg, err error) {
		var n int64
		if md, mderr := msg.Metadata(); mderr == nil {
			n = int64(md.NumDelivered)
		}
		dl.Add(err, string(msg.Data()), n)
	})
}

// Defect 6: a message without an identity and one whose id was used for
// another payload are terminated, never run, and reported: the error Do
// returns matches ErrDeadLetter and its cause, the WithDeadLetter callback
// gets each before the termination, and the dead-letter counter counts
// them by reason, with no message id in its attributes.
func TestDeadLetter_NoIdentityAndMismatch_Reported(t *testing.T) {
	e := newEnv(t)
	var dl consumetest.DeadLetters
	mp := consumetest.NewCounters()
	cons, err := claimnats.New(e.claimer(nil, e.rdb, 2*time.Second), deadLetter(&dl), claimnats.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	e.Publish(consumetest.ReusedID, consumetest.FirstPayload)
	e.Publish(consumetest.ReusedID, consumetest.MismatchPayload)
	if _, err := e.js.Publish(context.Background(), e.subject, []byte(consumetest.NoIDPayload)); err != nil { // no Nats-Msg-Id
		t.Fatal(err)
	}
	var acts consumetest.Actions
	var runs atomic.Int32
	sub := e.consumer(e.dial(), 30*time.Second)
	cc, err := sub.Consume(func(msg jetstream.Msg) {
		acts.Add(cons.Do(context.Background(), msg, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
			runs.Add(1)
			return effectFn(ctx, tx, msg, op)
		}))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	e.drained(sub, 30*time.Second)
	// The server sees a message settled as Do acknowledges it, before the
	// handler has recorded Do's answer: wait for the three answers.
	consumetest.WaitUntil(t, "three deliveries answered", 10*time.Second, func() bool {
		a, _ := acts.List()
		return len(a) >= 3
	})
	a, errs := acts.List()
	if len(a) != 3 || runs.Load() != 1 {
		t.Fatalf("actions %v (%v), runs %d; want 3 deliveries, 1 run", a, errs, runs.Load())
	}
	for i := range a {
		if a[i] == claimnats.Terminate && !errors.Is(errs[i], claimnats.ErrDeadLetter) {
			t.Fatalf("a termination returned %v, want ErrDeadLetter", errs[i])
		}
	}
	consumetest.CheckGivenUp(t, "claimnats", &dl, mp)
}

// Defect 6: a held (uncertain) message is negatively acknowledged on every
// delivery; on the last JetStream makes (MaxDeliver 3, NumDelivered 3),
// the Consumer told its limit reports it as given up before that nak: the
// callback, the error, the metric.
func TestDeliveryLimit(t *testing.T) {
	consumetest.DeliveryLimit(t, "claimnats", 3, 3, heldPastLimit)
}

// heldPastLimit runs h on a JetStream consumer with MaxDeliver 3 until
// JetStream gave the message up (nothing pending), as
// consumetest.DeliveryLimit says. Told, the Consumer has
// WithDeliveryLimit(3); not told, it cannot know JetStream's limit (the
// package doc says to set it).
func heldPastLimit(t *testing.T, told bool, h *consumetest.Held) (testenv.Schema, *consumetest.DeadLetters, *consumetest.Counters) {
	e := newEnv(t)
	opts, dl, mp := consumetest.HeldOptions(told, 3, claimnats.WithUncertainDelay, deadLetter, claimnats.WithMeterProvider, claimnats.WithDeliveryLimit)
	cons, err := claimnats.New(e.claimer(nil, e.rdb, 2*time.Second), opts...)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(e.dial())
	if err != nil {
		t.Fatal(err)
	}
	sub, err := js.CreateOrUpdateConsumer(context.Background(), e.stream, jetstream.ConsumerConfig{
		Durable: "w", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := sub.Consume(func(msg jetstream.Msg) {
		h.Add(cons.Run(context.Background(), msg, func(ctx context.Context, _ jetstream.Msg, op claim.Op) (durable.Result, error) {
			return h.Work(ctx, op)
		}))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	e.Publish("charge-h", `{"amount":4}`)
	consumetest.WaitUntil(t, "3 deliveries and JetStream giving the message up", 30*time.Second, func() bool {
		info, err := sub.Info(context.Background())
		return h.Deliveries() >= 3 && err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
	return e.schema, dl, mp
}

func TestNew_DeadLetterOptionsChecked(t *testing.T) {
	c := newEnv(t).claimer(nil, nil, 2*time.Second)
	consumetest.CheckOptionsRefused(t, claimnats.ErrConfig, func(o claimnats.Option) error { _, err := claimnats.New(c, o); return err },
		claimnats.WithDeadLetter(nil), claimnats.WithDeliveryLimit(-1), claimnats.WithMeterProvider(nil))
}
