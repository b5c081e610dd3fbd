package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimnats"
	"github.com/oncekey/oncekey/durable"
)

// demo tells the story on a fresh stream and returns an error unless every
// expectation held.
func (w *worker[TTx]) demo(ctx context.Context, url string, js jetstream.JetStream, out io.Writer) error {
	s := &story{out: out}
	run := randomName()
	stream := "ONCEKEY_DEMO_" + run
	subject := stream + ".charge"
	// JetStream deduplicates publishes by Nats-Msg-Id within its window (2
	// minutes by default). The demo shortens it so its duplicates reach the
	// consumers, as a producer's retry after the window does in production.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: stream, Subjects: []string{subject}, Duplicates: 100 * time.Millisecond, Storage: jetstream.MemoryStorage,
	}); err != nil {
		return fmt.Errorf("consumer: stream: %w", err)
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), stream) }()
	cfg := jetstream.ConsumerConfig{Durable: "charger", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second}
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, cfg)
	if err != nil {
		return err
	}
	prefix := "demo-" + run + "-"
	publish := func(n int, amount int64) error {
		time.Sleep(120 * time.Millisecond) // past JetStream's own window
		body, _ := json.Marshal(charge{Charge: fmt.Sprintf("%s%d", prefix, n), Amount: amount})
		_, err := js.Publish(ctx, subject, body, jetstream.WithMsgID(fmt.Sprintf("charge-%s-%d", run, n)))
		return err
	}

	// Worker A takes charge 1 and dies in the middle of it: its connection
	// closes and its transaction rolls back, as PostgreSQL or SQLite abort
	// a dead process's transaction.
	ncA, err := nats.Connect(url)
	if err != nil {
		return err
	}
	consA, err := jsFor(ncA).Consumer(ctx, stream, "charger")
	if err != nil {
		return err
	}
	killCtx, kill := context.WithCancel(ctx)
	defer kill()
	started := make(chan struct{})
	var once sync.Once
	ccA, err := consA.Consume(func(msg jetstream.Msg) {
		_, _ = w.cons.Do(killCtx, msg, func(ctx context.Context, tx TTx, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
			if _, err := w.handle(ctx, tx, msg, op); err != nil {
				return durable.Result{}, err
			}
			once.Do(func() { close(started) })
			<-ctx.Done() // killed before the commit
			return durable.Result{}, ctx.Err()
		})
	})
	if err != nil {
		return err
	}
	s.say("publish charge 1 (100); worker A takes it")
	if err := publish(1, 100); err != nil {
		return err
	}
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		return fmt.Errorf("consumer: worker A never started")
	}
	ccA.Stop()
	ncA.Close()
	kill()
	s.say("worker A killed mid-charge (its row was written, not committed)")
	got, err := w.table.amounts(ctx, prefix)
	if err != nil {
		return err
	}
	s.expect(len(got) == 0, "nothing charged by the killed worker")

	s.say("publish charge 1 twice more, charge 2 (250) once, charge 3 (75) twice; workers B and C compete")
	var acks, terms, retries atomic.Int32
	for _, name := range []string{"B", "C"} {
		nc, err := nats.Connect(url)
		if err != nil {
			return err
		}
		defer nc.Close()
		c, err := jsFor(nc).Consumer(ctx, stream, "charger")
		if err != nil {
			return err
		}
		cc, err := c.Consume(func(msg jetstream.Msg) {
			a, err := w.cons.Do(ctx, msg, w.handle)
			switch a {
			case claimnats.Ack:
				acks.Add(1)
			case claimnats.Terminate:
				terms.Add(1)
			default:
				retries.Add(1)
			}
			w.log.Debug("consumer: message", "worker", name, "action", a.String(), "error", err)
		})
		if err != nil {
			return err
		}
		defer cc.Stop()
	}
	for _, p := range []struct {
		n      int
		amount int64
	}{{1, 100}, {1, 100}, {2, 250}, {3, 75}, {3, 75}} {
		if err := publish(p.n, p.amount); err != nil {
			return err
		}
	}
	if err := drained(ctx, cons, 60*time.Second); err != nil {
		return err
	}
	s.expect(acks.Load() == 6, fmt.Sprintf("every copy acked, A's redelivery included: %d of 6 (%d negative acks on the way)", acks.Load(), retries.Load()))

	s.say("publish charge 2 again with amount 999: the same message id with another payload")
	if err := publish(2, 999); err != nil {
		return err
	}
	if err := drained(ctx, cons, 30*time.Second); err != nil {
		return err
	}
	s.expect(terms.Load() == 1 && w.givenUp.Load() == 1, "the reused id was terminated, never charged, and handed to the dead-letter callback")

	got, err = w.table.amounts(ctx, prefix)
	if err != nil {
		return err
	}
	want := map[string][]int64{prefix + "1": {100}, prefix + "2": {250}, prefix + "3": {75}}
	for _, n := range []string{"1", "2", "3"} {
		s.expect(slices.Equal(got[prefix+n], want[prefix+n]), fmt.Sprintf("charge %s charged exactly once: %v", n, got[prefix+n]))
	}
	s.expect(len(got) == 3, fmt.Sprintf("no other charge: %d charges", len(got)))
	if s.failed > 0 {
		return fmt.Errorf("consumer: %d expectations failed", s.failed)
	}
	s.say("every expectation held")
	return nil
}

func jsFor(nc *nats.Conn) jetstream.JetStream {
	js, _ := jetstream.New(nc) // fails only on invalid options
	return js
}

// drained waits until the consumer has nothing pending or unacknowledged.
func drained(ctx context.Context, c jetstream.Consumer, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		info, err := c.Info(ctx)
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("consumer: messages still pending after %v", within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
