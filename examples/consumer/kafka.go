package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimkafka"
	"github.com/oncekey/oncekey/durable"
)

// kafkaWorker charges the records of a Kafka topic once each, with
// claim/claimkafka: one group member per client, each with a Consumer.
type kafkaWorker[TTx any] struct {
	c       *claim.Claimer[TTx]
	brokers []string
	table   charges[TTx]
	log     *slog.Logger
	givenUp atomic.Int32
}

// runKafka consumes topic "charges" until ctx is done, or runs the demo;
// brokers empty starts an in-process Kafka (kfake).
func runKafka[TTx any](ctx context.Context, w *worker[TTx], brokers string, demo bool, out io.Writer) error {
	kw := &kafkaWorker[TTx]{c: w.c, table: w.table, log: w.log}
	if brokers == "" {
		kf, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return fmt.Errorf("consumer: in-process Kafka: %w", err)
		}
		defer kf.Close()
		kw.brokers = kf.ListenAddrs()
		fmt.Fprintln(out, "consumer: Kafka: in-process broker (kfake; no -kafka or KAFKA_BROKERS)")
	} else {
		kw.brokers = strings.Split(brokers, ",")
		fmt.Fprintln(out, "consumer: Kafka: the brokers named by -kafka/KAFKA_BROKERS")
	}
	if demo {
		return kw.demo(ctx, out)
	}
	if err := kw.createTopic(ctx, "charges", 3); err != nil {
		return err
	}
	cl, cons, err := kw.member("charges", "charger")
	if err != nil {
		return err
	}
	defer cl.Close()
	fmt.Fprintln(out, "consumer: consuming topic charges as group charger")
	err = cons.Poll(ctx, func(ctx context.Context, rec *kgo.Record) (claimkafka.Action, error) {
		a, err := cons.Do(ctx, rec, kw.handle)
		kw.log.Info("consumer: record", "action", a.String(), "error", err)
		return a, err
	})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// member returns a client in group consuming topic (committing only what
// the Consumer marked settled), and its Consumer.
func (kw *kafkaWorker[TTx]) member(topic, group string) (*kgo.Client, *claimkafka.Consumer[TTx], error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(kw.brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.AutoCommitMarks(), kgo.BlockRebalanceOnPoll(), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		return nil, nil, err
	}
	cons, err := claimkafka.New(kw.c, cl, claimkafka.WithLogger(kw.log), claimkafka.WithRetryDelay(200*time.Millisecond),
		claimkafka.WithDeadLetter(func(ctx context.Context, rec *kgo.Record, err error) {
			kw.givenUp.Add(1)
			kw.log.WarnContext(ctx, "consumer: record given up; a real worker keeps it for an operator (WithDeadLetterTopic)",
				"topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "error", err)
		}))
	if err != nil {
		cl.Close()
		return nil, nil, err
	}
	return cl, cons, nil
}

// createTopic creates topic with n partitions; one that exists is kept.
func (kw *kafkaWorker[TTx]) createTopic(ctx context.Context, topic string, n int32) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(kw.brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, n, 1
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("consumer: create topic: %w", err)
	}
	if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("consumer: create topic: %w", err)
	}
	return nil
}

// handle charges one record in the claim's transaction.
func (kw *kafkaWorker[TTx]) handle(ctx context.Context, tx TTx, rec *kgo.Record, op claim.Op) (durable.Result, error) {
	var c charge
	if err := json.Unmarshal(rec.Value, &c); err != nil || c.Charge == "" || c.Amount <= 0 {
		return durable.Result{}, claim.Reject(durable.Result{StatusCode: 400, Body: []byte("bad charge")})
	}
	if err := kw.table.insert(ctx, tx, c); err != nil {
		return durable.Result{}, err
	}
	return durable.Result{StatusCode: 201, Body: []byte("charged")}, nil
}

// demo tells the story on a fresh topic and returns an error unless every
// expectation held.
func (kw *kafkaWorker[TTx]) demo(ctx context.Context, out io.Writer) error {
	s := &story{out: out}
	run := randomName()
	topic, group := "oncekey-demo-"+run, "charger-"+run
	if err := kw.createTopic(ctx, topic, 2); err != nil {
		return err
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(kw.brokers...), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		return err
	}
	defer prod.Close()
	prefix := "demo-" + run + "-"
	published := 0
	publish := func(n int, amount int64) error {
		body, _ := json.Marshal(charge{Charge: fmt.Sprintf("%s%d", prefix, n), Amount: amount})
		published++
		return prod.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: body, Headers: []kgo.RecordHeader{
			{Key: claimkafka.DefaultHeader, Value: fmt.Appendf(nil, "charge-%s-%d", run, n)}}}).FirstErr()
	}
	var mu sync.Mutex
	settled := map[[2]int64]claimkafka.Action{} // by partition, offset
	settledCount := func(want claimkafka.Action) (all, of int) {
		mu.Lock()
		defer mu.Unlock()
		for _, a := range settled {
			if a == want {
				of++
			}
		}
		return len(settled), of
	}
	consume := func(ctx context.Context, cons *claimkafka.Consumer[TTx],
		fn func(ctx context.Context, tx TTx, rec *kgo.Record, op claim.Op) (durable.Result, error)) chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = cons.Poll(ctx, func(ctx context.Context, rec *kgo.Record) (claimkafka.Action, error) {
				a, err := cons.Do(ctx, rec, fn)
				if a != claimkafka.Retry {
					mu.Lock()
					settled[[2]int64{int64(rec.Partition), rec.Offset}] = a
					mu.Unlock()
				}
				kw.log.Debug("consumer: record", "partition", rec.Partition, "offset", rec.Offset, "action", a.String(), "error", err)
				return a, err
			})
		}()
		return done
	}
	waitSettled := func(n int) error {
		deadline := time.Now().Add(60 * time.Second)
		for {
			if all, _ := settledCount(0); all >= n {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("consumer: records still unsettled after 60s")
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}

	// Worker A takes charge 1 and dies in the middle of it: its client
	// closes (the group gives its partitions to the others, nothing of it
	// committed) and its transaction rolls back.
	clA, consA, err := kw.member(topic, group)
	if err != nil {
		return err
	}
	killCtx, kill := context.WithCancel(ctx)
	defer kill()
	started := make(chan struct{})
	var once sync.Once
	doneA := consume(killCtx, consA, func(ctx context.Context, tx TTx, rec *kgo.Record, op claim.Op) (durable.Result, error) {
		if _, err := kw.handle(ctx, tx, rec, op); err != nil {
			return durable.Result{}, err
		}
		once.Do(func() { close(started) })
		<-ctx.Done() // killed before the commit
		return durable.Result{}, ctx.Err()
	})
	s.say("publish charge 1 (100); worker A takes it")
	if err := publish(1, 100); err != nil {
		return err
	}
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("consumer: worker A never started")
	}
	kill()
	<-doneA
	clA.Close()
	s.say("worker A killed mid-charge (its row was written, not committed; its offset not committed)")
	got, err := kw.table.amounts(ctx, prefix)
	if err != nil {
		return err
	}
	s.expect(len(got) == 0, "nothing charged by the killed worker")

	s.say("publish charge 1 twice more, charge 2 (250) once, charge 3 (75) twice, same Idempotency-Key per charge; workers B and C share the group")
	for range 2 {
		cl, cons, err := kw.member(topic, group)
		if err != nil {
			return err
		}
		defer cl.Close()
		cctx, stop := context.WithCancel(ctx)
		done := consume(cctx, cons, kw.handle)
		defer func() { stop(); <-done }()
	}
	for _, p := range []struct {
		n      int
		amount int64
	}{{1, 100}, {1, 100}, {2, 250}, {3, 75}, {3, 75}} {
		if err := publish(p.n, p.amount); err != nil {
			return err
		}
	}
	if err := waitSettled(published); err != nil {
		return err
	}
	all, acks := settledCount(claimkafka.Ack)
	s.expect(acks == 6 && all == 6, fmt.Sprintf("every record settled and marked for commit, A's included: %d acks of 6", acks))

	s.say("publish charge 2 again with amount 999: the same Idempotency-Key with another value")
	if err := publish(2, 999); err != nil {
		return err
	}
	if err := waitSettled(published); err != nil {
		return err
	}
	_, terms := settledCount(claimkafka.Terminate)
	s.expect(terms == 1 && kw.givenUp.Load() == 1, "the reused key was refused, never charged, handed to the dead-letter callback, and its offset moved on")

	got, err = kw.table.amounts(ctx, prefix)
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
