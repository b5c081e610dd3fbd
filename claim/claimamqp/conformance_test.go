package claimamqp_test

import (
	"context"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimamqp"
	"github.com/oncekey/oncekey/claim/driver/consume"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/consumetest"
	"github.com/oncekey/oncekey/testkit/entrytest"
	"github.com/oncekey/oncekey/testkit/settletest"
)

// The entry-point conformance suite against Consumer.Run on a RabbitMQ
// queue. Its top-level tests are not parallel, so no other test of the
// package runs beside them: the negative controls break the settlement of
// the whole process.

func TestConformance(t *testing.T) { entrytest.Run(t, amqpDriver{}) }

func TestConformance_BrokenSettlementsAreCaught(t *testing.T) {
	settletest.CatchBroken(t, amqpDriver{})
}

const (
	// conformanceSendWait bounds how long Send waits for a message to be
	// acknowledged, dead-lettered or held.
	conformanceSendWait = 6 * time.Second
	// conformanceHeader carries the send a delivery belongs to.
	conformanceHeader = "entrytest-send"
)

type amqpDriver struct{}

func (amqpDriver) Caps() entrytest.Caps {
	return entrytest.Caps{Tenant: "default", NotApplicable: map[string]string{
		entrytest.CallerGone: "a consumer has no caller to go away: the publisher is done once RabbitMQ took the message",
		entrytest.Oversized:  "claimamqp stores the handler's own durable.Result: it has no result size limit of its own",
	}}
	// Timer stays zero: RabbitMQ's only timer on a delivery is the
	// broker's consumer_timeout (30 minutes by default, checked about once
	// a minute), which no window of a test can outlast; the long-work
	// window outlasts the lease.
}

// Encode is the handler's own result: a consumer stores what its handler
// returned (a failure through claim.Reject).
func (amqpDriver) Encode(r entrytest.Response) durable.Result { return consumetest.Encode(r) }

func (amqpDriver) Start(suite entrytest.Env) entrytest.Adapter {
	t := suite.T
	e := newQueue(t)
	c, err := claimamqp.New(suite.Claimer, e.queue, claimamqp.WithRetryDelay(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var pub sync.Mutex // an amqp.Channel publishes one message at a time
	sends := consumetest.NewSends(suite, conformanceSendWait, "acknowledged, dead-lettered or held",
		func(ctx context.Context, key, send string, payload []byte) error {
			pub.Lock()
			defer pub.Unlock()
			return e.ch.PublishWithContext(ctx, "", e.queue, false, false, amqp.Publishing{
				MessageId: key, ContentType: "application/json", Body: payload,
				Headers: amqp.Table{conformanceHeader: send},
			})
		})
	_, ch := e.dial()
	if err := ch.Qos(50, 0, false); err != nil {
		t.Fatal(err)
	}
	ds := e.deliveries(ch)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range ds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// As the application's consume loop does; a panic (the
				// Consumer lets it go on) is requeued after a second.
				send, _ := d.Headers[conformanceHeader].(string)
				scope := durable.Scope{Tenant: "default", Operation: e.queue, Key: d.MessageId}
				sends.Deliver(send, scope, func() { time.AfterFunc(time.Second, func() { _ = d.Reject(true) }) },
					func(h consumetest.Handler) (consume.Action, error) {
						return c.Run(ctx, d, func(ctx context.Context, d *amqp.Delivery, op claim.Op) (durable.Result, error) {
							return h(ctx, op, d.Body)
						})
					})
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ch.Close() // ends ds; RabbitMQ requeues what was unacknowledged
		<-done
		cancel()
		wg.Wait()
	})
	return sends
}
