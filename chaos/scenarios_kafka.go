package chaos

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimkafka"
	"github.com/oncekey/oncekey/durable"
)

// kafka-windows: the entry-point windows through claimkafka, on an
// in-process Kafka (kfake) with a consumer group of two members. The
// producer publishes each operation's record with its identity in the
// Idempotency-Key header and waits for the record's Ack, publishing a copy
// when it is late (duplicates with the same header); the duplicate window
// publishes one during the work. The transport's "timer" is the group: in
// that window both members' clients are closed during the work (as a
// killed consumer's are), so the group rebalances and new members get the
// partitions, and the unsettled record again from the committed offset,
// while the first member's work goes on. And the broker loses one offset
// commit in three (acknowledges it, stores nothing): a new member then
// starts before records already settled, answered from the record.

// kafkaKeyHeader carries the identity.
const kafkaKeyHeader = claimkafka.DefaultHeader

func setupKafkaWindows(ctx context.Context, e *env) (*workload, error) {
	c, err := e.newConsumerEntry(ctx)
	if err != nil {
		return nil, err
	}
	x, lease := c.x, e.cfg.Lease
	c.nothing = claimkafka.ErrNothingHappened
	kf, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return nil, fmt.Errorf("%w: kfake: %w", ErrSetup, err)
	}
	e.onClose(kf.Close)
	// Offset commits lost: one in three is answered as done and dropped.
	var commits atomic.Int64
	e.expectFaults("offset-commit-lost")
	kf.ControlKey(int16(kmsg.OffsetCommit), func(r kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		if commits.Add(1)%3 != 0 {
			return nil, nil, false
		}
		req := r.(*kmsg.OffsetCommitRequest)
		resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, t := range req.Topics {
			rt := kmsg.NewOffsetCommitResponseTopic()
			rt.Topic = t.Topic
			for _, p := range t.Partitions {
				rp := kmsg.NewOffsetCommitResponseTopicPartition()
				rp.Partition = p.Partition
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		e.fault("offset-commit-lost")
		return resp, nil, true
	})
	topic, group := "chaos-"+e.id+"-"+e.name, "chaos-"+e.id+"-"+e.name
	prod, err := kgo.NewClient(kgo.SeedBrokers(kf.ListenAddrs()...), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		return nil, fmt.Errorf("%w: kafka producer: %w", ErrSetup, err)
	}
	e.onClose(prod.Close)
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, 8, 1
	req.Topics = append(req.Topics, rt)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := req.RequestWith(sctx, prod); err != nil {
		return nil, fmt.Errorf("%w: kafka topic: %w", ErrSetup, err)
	}
	c.publish = func(ctx context.Context, o *op) error {
		epoch, _, _ := o.get()
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return prod.ProduceSync(pctx, &kgo.Record{Topic: topic, Value: fmt.Appendf(nil, `{"op":%q,"epoch":%d}`, o.key, epoch),
			Headers: []kgo.RecordHeader{{Key: kafkaKeyHeader, Value: []byte(o.scope.Key)}}}).FirstErr()
	}
	closing, closed := context.WithCancel(context.Background())
	var seenMu sync.Mutex
	seen := map[[2]int64]bool{} // partition, offset handed out before
	handle := func(cons *claimkafka.Consumer[pgxTx]) func(context.Context, *kgo.Record) (claimkafka.Action, error) {
		return func(_ context.Context, rec *kgo.Record) (claimkafka.Action, error) {
			var key string
			for _, h := range rec.Headers {
				if h.Key == kafkaKeyHeader {
					key = string(h.Value)
				}
			}
			o := e.byKey[key]
			if o == nil || !c.begin() {
				return claimkafka.Retry, nil
			}
			defer c.wg.Done()
			seenMu.Lock()
			at := [2]int64{int64(rec.Partition), rec.Offset}
			redelivered := seen[at]
			seen[at] = true
			seenMu.Unlock()
			var act claimkafka.Action
			var aerr error
			c.deliver(o, redelivered, func(ctx context.Context, work func(context.Context, claim.Op) (durable.Result, error)) (bool, string) {
				// A record waiting in place (in progress under a member
				// whose work never settles) stops waiting when the
				// scenario closes.
				ctx, cancel := context.WithCancel(ctx)
				defer context.AfterFunc(closing, cancel)()
				defer cancel()
				act, aerr = cons.Run(ctx, rec, func(ctx context.Context, _ *kgo.Record, op claim.Op) (durable.Result, error) { return work(ctx, op) })
				return act == claimkafka.Ack && aerr == nil, act.String()
			}, func() {}) // a panic through Run left the record unsettled: Poll rewinds to it
			return act, aerr
		}
	}
	m := &kafkaMembers{stop: make(chan struct{}), clients: map[*kgo.Client]chan struct{}{}}
	dial := func() (*kgo.Client, *claimkafka.Consumer[pgxTx], error) {
		cl, err := kgo.NewClient(kgo.SeedBrokers(kf.ListenAddrs()...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
			kgo.AutoCommitMarks(), kgo.AutoCommitInterval(lease/3), kgo.FetchMaxWait(50*time.Millisecond))
		if err != nil {
			return nil, nil, err
		}
		cons, err := claimkafka.New(x.server, cl,
			claimkafka.WithOperation(func(*kgo.Record) string { return e.name }),
			claimkafka.WithTenant(func(*kgo.Record) string { return e.tenant }),
			claimkafka.WithLogger(e.log), claimkafka.WithRetryDelay(lease/5))
		if err != nil {
			cl.Close()
			return nil, nil, err
		}
		return cl, cons, nil
	}
	for range 2 {
		m.loops.Add(1)
		go m.loop(dial, handle)
	}
	e.onClose(func() { closed(); m.halt(); c.stop() })
	// The timer window: both members' clients closed during the work.
	x.timer, x.timerFault = 2*lease, "rebalanced-during-work"
	x.timerStart = func(*op) {
		x.quiet.Lock()
		defer x.quiet.Unlock()
		m.closeAll()
		e.fault(x.timerFault)
	}
	e.expectFaults(x.timerFault)
	return x.w, nil
}

// kafkaMembers are the Kafka family's group members: each loop runs one,
// and a new one as soon as closeAll closed it (the old one's records in
// flight finish on their own).
type kafkaMembers struct {
	stop  chan struct{}
	loops sync.WaitGroup
	polls sync.WaitGroup

	mu      sync.Mutex
	clients map[*kgo.Client]chan struct{} // closed when the client is
}

func (m *kafkaMembers) loop(dial func() (*kgo.Client, *claimkafka.Consumer[pgxTx], error),
	handle func(*claimkafka.Consumer[pgxTx]) func(context.Context, *kgo.Record) (claimkafka.Action, error)) {
	defer m.loops.Done()
	for {
		select {
		case <-m.stop:
			return
		default:
		}
		cl, cons, err := dial()
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		closed := make(chan struct{})
		m.mu.Lock()
		m.clients[cl] = closed
		m.mu.Unlock()
		m.polls.Add(1)
		go func() {
			defer m.polls.Done()
			_ = cons.Poll(context.Background(), handle(cons))
		}()
		select {
		case <-m.stop:
			m.close(cl)
			return
		case <-closed:
		}
	}
}

// close closes cl once.
func (m *kafkaMembers) close(cl *kgo.Client) {
	m.mu.Lock()
	ch, ok := m.clients[cl]
	delete(m.clients, cl)
	m.mu.Unlock()
	if ok {
		cl.Close()
		close(ch)
	}
}

// closeAll closes the members' clients: the group rebalances, the loops
// start new members.
func (m *kafkaMembers) closeAll() {
	m.mu.Lock()
	cls := make([]*kgo.Client, 0, len(m.clients))
	for cl := range m.clients {
		cls = append(cls, cl)
	}
	m.mu.Unlock()
	for _, cl := range cls {
		m.close(cl)
	}
}

func (m *kafkaMembers) halt() {
	close(m.stop)
	m.loops.Wait()
	m.closeAll()
	m.polls.Wait()
}
