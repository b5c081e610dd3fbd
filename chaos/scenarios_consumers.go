package chaos

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimamqp"
	"github.com/oncekey/oncekey/claim/claimnats"
	"github.com/oncekey/oncekey/durable"
)

// nats-windows and amqp-windows: the entry-point windows through the
// message consumers. A producer publishes each operation's message (its
// identity in a header or the message id, the same payload each time) and
// waits for the consumer to acknowledge it, publishing again when the
// acknowledgement is late; the consumer runs the family's work through
// claimnats or claimamqp in workflow mode. A message acknowledged is no
// answer the producer sees: what the consumer did comes from the store,
// its effects from the downstream. The caller-gone window cancels the
// context the delivery was handed to the consumer with (a subscription
// stopping); the duplicate window publishes the message again during the
// work. The transport's timer: JetStream's AckWait, shorter than the work
// (the consumer keeps the message in progress; a redelivery is answered
// from the record); RabbitMQ has no short one, so its window closes the
// consumers' channels during the work, and the broker redelivers the
// unacknowledged message to the next channel while the work goes on.

// consumerEntry is what the two consumer families share.
type consumerEntry struct {
	x *entry
	// publish sends o's message once more.
	publish func(ctx context.Context, o *op) error
	// nothing is the adapter's ErrNothingHappened.
	nothing error

	mu      sync.Mutex
	acks    map[*op]int
	wg      sync.WaitGroup // deliveries in progress
	stopped bool           // under mu: no delivery starts after it
}

// begin counts a delivery in progress, unless the scenario is closing:
// the broker's client may hand out a delivery after its consumer was
// stopped, and a WaitGroup must not be added to while it is waited on.
func (c *consumerEntry) begin() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return false
	}
	c.wg.Add(1)
	return true
}

// stop lets no delivery start, and waits for those in progress.
func (c *consumerEntry) stop() {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	c.wg.Wait()
}

func (e *env) newConsumerEntry(ctx context.Context) (*consumerEntry, error) {
	x, err := e.newEntry(ctx, allWindows, func(body []byte) durable.Result { return resultOf(200, body) })
	if err != nil {
		return nil, err
	}
	c := &consumerEntry{x: x, acks: map[*op]int{}}
	x.duplicate = func(ctx context.Context, o *op) {
		if c.publish(ctx, o) == nil {
			e.observe("duplicate-published")
		}
	}
	if err := x.start(); err != nil {
		return nil, err
	}
	x.w.entry = c
	x.w.run = func(ctx context.Context, e *env, ops []*op) error {
		x.rc.loop(ctx)
		return e.eachOp(ctx, ops, func(o *op) {
			x.w.startOp(ctx, o)
			e.client(ctx, x.w, o, 0, maxAttempts) // one producer
		})
	}
	return c, nil
}

// attempt publishes o's message and waits for an acknowledgement of it
// (of any of its deliveries) for up to an attempt's timeout.
func (c *consumerEntry) attempt(ctx context.Context, w *workload, o *op, cl int) bool {
	e := c.x.e
	if c.x.solo(o) {
		c.x.quiet.RLock()
		defer c.x.quiet.RUnlock()
	}
	epoch, fp, _ := o.get()
	c.mu.Lock()
	before := c.acks[o]
	c.mu.Unlock()
	call := history.Call{Key: o.key, Epoch: epoch, Client: cl, Kind: history.NoEffect, Fingerprint: fp, Start: e.rec.Now(), Note: "published"}
	err := c.publish(ctx, o)
	call.End = e.rec.Now()
	if err != nil {
		call.Note = err.Error()
	}
	e.rec.Add(call)
	if err != nil {
		return false
	}
	deadline := time.Now().Add(w.timeout)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		c.mu.Lock()
		acked := c.acks[o] > before
		c.mu.Unlock()
		if acked {
			return true
		}
		sleep(ctx, 10*time.Millisecond)
	}
	e.observe("ack-late")
	return false
}

// consumerRun runs one delivery through the adapter with work as the
// handler; it reports whether the delivery was acknowledged, and the
// action.
type consumerRun func(ctx context.Context, work func(ctx context.Context, op claim.Op) (durable.Result, error)) (acked bool, action string)

// deliver handles one delivery of o: redelivered says the broker had
// handed it out before, onPanic redelivers it as a consumer process that
// died would have it (a panic that went through the adapter).
func (c *consumerEntry) deliver(o *op, redelivered bool, run consumerRun, onPanic func()) {
	x, e := c.x, c.x.e
	x.arrived(o)
	if redelivered && x.window(o) == winTimer && x.working.busy(o) {
		if x.timerPast == 0 { // the redelivery is the window's fault (AMQP)
			e.fault(x.timerFault)
		} else {
			e.observe("redelivered-during-work")
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if x.window(o) == winCallerGone {
		defer x.calls.add(o, cancel)()
	}
	defer func() {
		if v := recover(); v != nil {
			e.observe("consumer-panicked")
			onPanic()
		}
	}()
	acked, action := run(ctx, func(ctx context.Context, op claim.Op) (durable.Result, error) {
		body, err := x.work(ctx, o, op.ID, op.Token)
		switch {
		case errors.Is(err, errEffectUnknown):
			return durable.Result{}, err // uncertain
		case err != nil:
			return durable.Result{}, fmt.Errorf("%w: %w", c.nothing, err)
		}
		return x.encode(body), nil
	})
	e.observe("consumer-" + action)
	if acked {
		c.mu.Lock()
		c.acks[o]++
		c.mu.Unlock()
	}
}

// natsKeyHeader carries the identity: not Nats-Msg-Id, so that JetStream's
// own deduplication does not hide the duplicates from the consumer.
const natsKeyHeader = "Chaos-Key"

func setupNATSWindows(ctx context.Context, e *env) (*workload, error) {
	c, err := e.newConsumerEntry(ctx)
	if err != nil {
		return nil, err
	}
	x, lease := c.x, e.cfg.Lease
	c.nothing = claimnats.ErrNothingHappened
	nc, err := nats.Connect(e.cfg.NATSURL, nats.Timeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("%w: nats at %s: %w", ErrSetup, e.cfg.NATSURL, err)
	}
	e.onClose(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("%w: jetstream: %w", ErrSetup, err)
	}
	name, subject := "CHAOS_"+e.id+"_"+e.name, "chaos."+e.id+"."+e.name
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := js.CreateStream(sctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Storage: jetstream.MemoryStorage})
	if err != nil {
		return nil, fmt.Errorf("%w: jetstream stream: %w", ErrSetup, err)
	}
	e.onClose(func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(dctx, name)
	})
	// AckWait is the transport's timer of the timer window: shorter than
	// its work, longer than the other windows' (a redelivery after the
	// lease ran out unrenewed could rightly take it over). The adapter
	// restarts AckWait while the work goes on (InProgress, every second),
	// so the work outlives AckWait without a redelivery once AckWait is
	// longer than that; a shorter one redelivers it during the work
	// (observed as redelivered-during-work), answered in progress.
	ackWait := 3 * lease
	x.timer, x.timerFault, x.timerPast = ackWait+2*lease, "work-past-ackwait", ackWait
	e.expectFaults(x.timerFault)
	cons, err := stream.CreateOrUpdateConsumer(sctx, jetstream.ConsumerConfig{Durable: "chaos", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: ackWait, MaxDeliver: -1, MaxAckPending: 1000})
	if err != nil {
		return nil, fmt.Errorf("%w: jetstream consumer: %w", ErrSetup, err)
	}
	consumer, err := claimnats.New(x.server,
		claimnats.WithIdentity(func(m jetstream.Msg) string { return m.Headers().Get(natsKeyHeader) }),
		claimnats.WithOperation(func(jetstream.Msg) string { return e.name }),
		claimnats.WithTenant(func(jetstream.Msg) string { return e.tenant }),
		claimnats.WithLogger(e.log), claimnats.WithRetryDelay(lease/5), claimnats.WithUncertainDelay(lease))
	if err != nil {
		return nil, fmt.Errorf("%w: claimnats: %w", ErrSetup, err)
	}
	c.publish = func(ctx context.Context, o *op) error {
		epoch, _, _ := o.get()
		msg := &nats.Msg{Subject: subject, Data: fmt.Appendf(nil, `{"op":%q,"epoch":%d}`, o.key, epoch), Header: nats.Header{}}
		msg.Header.Set(natsKeyHeader, o.scope.Key)
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := js.PublishMsg(pctx, msg)
		return err
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		o := e.byKey[m.Headers().Get(natsKeyHeader)]
		if o == nil {
			_ = m.Term()
			return
		}
		redelivered := false
		if md, err := m.Metadata(); err == nil {
			redelivered = md.NumDelivered > 1
		}
		if !c.begin() {
			return
		}
		go func() {
			defer c.wg.Done()
			c.deliver(o, redelivered, func(ctx context.Context, work func(context.Context, claim.Op) (durable.Result, error)) (bool, string) {
				act, err := consumer.Run(ctx, m, func(ctx context.Context, _ jetstream.Msg, op claim.Op) (durable.Result, error) { return work(ctx, op) })
				return act == claimnats.Ack && err == nil, act.String()
			}, func() { _ = m.Nak() })
		}()
	})
	if err != nil {
		return nil, fmt.Errorf("%w: jetstream consume: %w", ErrSetup, err)
	}
	e.onClose(func() { cc.Stop(); c.stop() })
	return x.w, nil
}

func setupAMQPWindows(ctx context.Context, e *env) (*workload, error) {
	c, err := e.newConsumerEntry(ctx)
	if err != nil {
		return nil, err
	}
	x, lease := c.x, e.cfg.Lease
	c.nothing = claimamqp.ErrNothingHappened
	conn, err := amqp.Dial(e.cfg.AMQPURL)
	if err != nil {
		return nil, fmt.Errorf("%w: amqp: %w", ErrSetup, err)
	}
	e.onClose(func() { _ = conn.Close() })
	pub, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("%w: amqp channel: %w", ErrSetup, err)
	}
	queue := "chaos-" + e.id + "-" + e.name
	if _, err := pub.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("%w: amqp queue: %w", ErrSetup, err)
	}
	e.onClose(func() { _, _ = pub.QueueDelete(queue, false, false, false) })
	consumer, err := claimamqp.New(x.server, queue,
		claimamqp.WithOperation(func(*amqp.Delivery) string { return e.name }),
		claimamqp.WithTenant(func(*amqp.Delivery) string { return e.tenant }),
		claimamqp.WithLogger(e.log), claimamqp.WithRetryDelay(lease/5), claimamqp.WithUncertainDelay(lease),
		claimamqp.WithDeliveryLimit(0))
	if err != nil {
		return nil, fmt.Errorf("%w: claimamqp: %w", ErrSetup, err)
	}
	var pubMu sync.Mutex
	c.publish = func(ctx context.Context, o *op) error {
		epoch, _, _ := o.get()
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		pubMu.Lock()
		defer pubMu.Unlock()
		return pub.PublishWithContext(pctx, "", queue, false, false, amqp.Publishing{MessageId: o.scope.Key,
			ContentType: "application/json", Body: fmt.Appendf(nil, `{"op":%q,"epoch":%d}`, o.key, epoch)})
	}
	r := &amqpConsumers{url: e.cfg.AMQPURL, queue: queue, prefetch: 2 * e.cfg.Parallel, stop: make(chan struct{}), conns: map[*amqp.Connection]bool{}}
	handle := func(d amqp.Delivery) {
		o := e.byKey[d.MessageId]
		if o == nil {
			_ = d.Reject(false)
			return
		}
		if !c.begin() {
			return
		}
		go func() {
			defer c.wg.Done()
			c.deliver(o, d.Redelivered, func(ctx context.Context, work func(context.Context, claim.Op) (durable.Result, error)) (bool, string) {
				act, err := consumer.Run(ctx, d, func(ctx context.Context, _ *amqp.Delivery, op claim.Op) (durable.Result, error) { return work(ctx, op) })
				return act == claimamqp.Ack && err == nil, act.String()
			}, func() { _ = d.Reject(true) })
		}()
	}
	// Two consumers, each on a connection of its own that it dials again
	// when it closes.
	for range 2 {
		r.loops.Add(1)
		go r.loop(handle)
	}
	e.onClose(func() { r.halt(); c.stop() })
	// The timer window: the consumers' connections close during the work,
	// as when the broker's consumer timeout or the network ends them.
	x.timer, x.timerFault = 2*lease, "requeued-during-work"
	x.timerStart = func(*op) {
		x.quiet.Lock()
		defer x.quiet.Unlock()
		r.closeAll()
	}
	e.expectFaults(x.timerFault)
	return x.w, nil
}

// amqpConsumers are the AMQP family's consumers, each on a connection of
// its own that it dials again when it closes.
type amqpConsumers struct {
	url      string
	queue    string
	prefetch int
	stop     chan struct{}
	loops    sync.WaitGroup

	mu    sync.Mutex
	conns map[*amqp.Connection]bool
}

// loop consumes on a connection, and on a new one each time it closes,
// until halt.
func (r *amqpConsumers) loop(handle func(amqp.Delivery)) {
	defer r.loops.Done()
	for {
		select {
		case <-r.stop:
			return
		default:
		}
		conn, dels, err := r.dial()
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		r.mu.Lock()
		r.conns[conn] = true
		r.mu.Unlock()
		select {
		case <-r.stop: // halted while this one opened: closeAll missed it
			_ = conn.Close()
		default:
		}
		for d := range dels {
			handle(d)
		}
		r.mu.Lock()
		delete(r.conns, conn)
		r.mu.Unlock()
		_ = conn.Close()
	}
}

func (r *amqpConsumers) dial() (*amqp.Connection, <-chan amqp.Delivery, error) {
	conn, err := amqp.Dial(r.url)
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	var dels <-chan amqp.Delivery
	if err == nil {
		if err = ch.Qos(r.prefetch, 0, false); err == nil {
			dels, err = ch.Consume(r.queue, "", false, false, false, false, nil)
		}
	}
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, dels, nil
}

// closeAll closes the consumers' connections: RabbitMQ requeues their
// unacknowledged deliveries, and the loops connect again.
func (r *amqpConsumers) closeAll() {
	r.mu.Lock()
	conns := make([]*amqp.Connection, 0, len(r.conns))
	for c := range r.conns {
		conns = append(conns, c)
	}
	r.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

func (r *amqpConsumers) halt() {
	close(r.stop)
	r.closeAll()
	r.loops.Wait()
}
