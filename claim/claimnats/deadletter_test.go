package claimnats_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimnats"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/consumetest"
)

// deadLetters records the calls of a WithDeadLetter callback.
type deadLetters struct {
	mu   sync.Mutex
	errs []error
	data []string
	seqs []uint64 // NumDelivered of each
}

func (d *deadLetters) add(_ context.Context, msg jetstream.Msg, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.errs = append(d.errs, err)
	d.data = append(d.data, string(msg.Data()))
	var n uint64
	if md, mderr := msg.Metadata(); mderr == nil {
		n = md.NumDelivered
	}
	d.seqs = append(d.seqs, n)
}

func (d *deadLetters) list() ([]error, []string, []uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]error(nil), d.errs...), append([]string(nil), d.data...), append([]uint64(nil), d.seqs...)
}

// Defect 6: a message without an identity and one whose id was used for
// another payload are terminated, never run, and reported: the error Do
// returns matches ErrDeadLetter and its cause, the WithDeadLetter callback
// gets each before the termination, and the dead-letter counter counts
// them by reason, with no message id in its attributes.
func TestDeadLetter_NoIdentityAndMismatch_Reported(t *testing.T) {
	e := newEnv(t)
	var dl deadLetters
	mp := consumetest.NewCounters()
	cons, err := claimnats.New(e.claimer(nil, e.rdb, 2*time.Second),
		claimnats.WithDeadLetter(dl.add), claimnats.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	e.publish("acct-secret-77", `{"amount":1}`)
	e.publish("acct-secret-77", `{"amount":999}`)
	if _, err := e.js.Publish(context.Background(), e.subject, []byte(`{"amount":3}`)); err != nil { // no Nats-Msg-Id
		t.Fatal(err)
	}
	var acts actions
	var runs atomic.Int32
	sub := e.consumer(e.dial(), 30*time.Second)
	cc, err := sub.Consume(func(msg jetstream.Msg) {
		acts.add(cons.Do(context.Background(), msg, func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
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
	waitUntil(t, "three deliveries answered", 10*time.Second, func() bool {
		a, _ := acts.list()
		return len(a) >= 3
	})
	a, errs := acts.list()
	if len(a) != 3 || runs.Load() != 1 {
		t.Fatalf("actions %v (%v), runs %d; want 3 deliveries, 1 run", a, errs, runs.Load())
	}
	for i := range a {
		if a[i] == claimnats.Terminate && !errors.Is(errs[i], claimnats.ErrDeadLetter) {
			t.Fatalf("a termination returned %v, want ErrDeadLetter", errs[i])
		}
	}
	got, data, _ := dl.list()
	if len(got) != 2 {
		t.Fatalf("dead-letter callback: %d calls (%v), want 2", len(got), got)
	}
	for i, err := range got {
		want := claim.ErrMismatch
		if data[i] == `{"amount":3}` {
			want = claimnats.ErrNoIdentity
		}
		if !errors.Is(err, claimnats.ErrDeadLetter) || !errors.Is(err, want) {
			t.Fatalf("dead letter %s: %v, want ErrDeadLetter and %v", data[i], err, want)
		}
	}
	for _, k := range []string{
		"oncekey.messages.dead_lettered|adapter=claimnats|reason=mismatch",
		"oncekey.messages.dead_lettered|adapter=claimnats|reason=no_identity",
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

// heldPastLimit runs an uncertain handler on a JetStream consumer with
// MaxDeliver 3 until JetStream gave the message up (nothing pending), and
// returns the deliveries and the dead-letter callback's calls.
func heldPastLimit(t *testing.T, opts ...claimnats.Option) (int, *deadLetters, *consumetest.Counters) {
	e := newEnv(t)
	var dl deadLetters
	mp := consumetest.NewCounters()
	cons, err := claimnats.New(e.claimer(nil, e.rdb, 2*time.Second), append([]claimnats.Option{
		claimnats.WithUncertainDelay(100 * time.Millisecond), claimnats.WithDeadLetter(dl.add), claimnats.WithMeterProvider(mp),
	}, opts...)...)
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
	var acts actions
	var runs atomic.Int32
	cc, err := sub.Consume(func(msg jetstream.Msg) {
		acts.add(cons.Run(context.Background(), msg, func(context.Context, jetstream.Msg, claim.Op) (durable.Result, error) {
			runs.Add(1)
			return durable.Result{}, errors.New("gateway timed out after the request was sent")
		}))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	e.publish("charge-h", `{"amount":4}`)
	waitUntil(t, "3 deliveries and JetStream giving the message up", 30*time.Second, func() bool {
		a, _ := acts.list()
		info, err := sub.Info(context.Background())
		return len(a) >= 3 && err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
	if runs.Load() != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs.Load())
	}
	if s := e.state(); s != "uncertain" {
		t.Fatalf("record: %q, want uncertain (left for the Reconciler)", s)
	}
	a, _ := acts.list()
	for i, x := range a {
		if x != claimnats.Hold {
			t.Fatalf("delivery %d: %v, want Hold", i+1, x)
		}
	}
	return len(a), &dl, mp
}

// Defect 6: a held (uncertain) message is negatively acknowledged on every
// delivery; on the last JetStream makes (MaxDeliver), the Consumer told
// its limit reports it as given up before that nak: the callback, the
// error, the metric.
func TestDeliveryLimit_HeldMessageReportedAtLastDelivery(t *testing.T) {
	n, dl, mp := heldPastLimit(t, claimnats.WithDeliveryLimit(3))
	if n != 3 {
		t.Fatalf("deliveries: %d, want MaxDeliver (3)", n)
	}
	errs, _, seqs := dl.list()
	if len(errs) != 1 || !errors.Is(errs[0], claimnats.ErrDeliveryLimit) || !errors.Is(errs[0], claimnats.ErrDeadLetter) || seqs[0] != 3 {
		t.Fatalf("dead-letter callback: %v at deliveries %v, want one ErrDeliveryLimit at the 3rd", errs, seqs)
	}
	if k := "oncekey.messages.dead_lettered|adapter=claimnats|reason=delivery_limit"; mp.Get(k) != 1 {
		t.Fatalf("metric %s = %d, want 1 (have %v)", k, mp.Get(k), mp.Keys())
	}
}

// Without WithDeliveryLimit the Consumer cannot know JetStream's: the same
// run is not reported (the package doc says to set it). This shows the
// test above depends on the option, not on a coincidence.
func TestDeliveryLimit_NotConfigured_NotReported(t *testing.T) {
	_, dl, _ := heldPastLimit(t)
	if errs, _, _ := dl.list(); len(errs) != 0 {
		t.Fatalf("dead-letter callback without a limit: %v", errs)
	}
}

func TestNew_DeadLetterOptionsChecked(t *testing.T) {
	e := newEnv(t)
	c := e.claimer(nil, nil, 2*time.Second)
	for i, o := range []claimnats.Option{
		claimnats.WithDeadLetter(nil), claimnats.WithDeliveryLimit(-1), claimnats.WithMeterProvider(nil),
	} {
		if _, err := claimnats.New(c, o); !errors.Is(err, claimnats.ErrConfig) {
			t.Errorf("option %d: %v, want ErrConfig", i, err)
		}
	}
}
