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

func TestConformance(t *testing.T) { entrytest.Run(t, amqpDriver) }

func TestConformance_BrokenSettlementsAreCaught(t *testing.T) {
	settletest.CatchBroken(t, amqpDriver)
}

// conformanceHeader carries the send a delivery belongs to.
const conformanceHeader = "entrytest-send"

// amqpDriver's Timer stays zero: RabbitMQ's only timer on a delivery is
// the broker's consumer_timeout (30 minutes by default, checked about once
// a minute), which no window of a test can outlast; the long-work window
// outlasts the lease.
var amqpDriver = consumetest.Driver{Adapter: "claimamqp", Stored: "RabbitMQ took the message",
	Final: "acknowledged, dead-lettered or held", Consume: amqpConsume}

// amqpConsume is the suite's consumer on a queue of its own
// (consumetest.Driver.Consume).
func amqpConsume(suite entrytest.Env, deliver func(consumetest.Delivery)) (func(ctx context.Context, key, send string, payload []byte) error, func()) {
	t := suite.T
	e := newQueue(t)
	c, err := claimamqp.New(suite.Claimer, e.queue, claimamqp.WithRetryDelay(consumetest.ConformanceRetry))
	if err != nil {
		t.Fatal(err)
	}
	var pub sync.Mutex // an amqp.Channel publishes one message at a time
	publish := func(ctx context.Context, key, send string, payload []byte) error {
		pub.Lock()
		defer pub.Unlock()
		return e.ch.PublishWithContext(ctx, "", e.queue, false, false, amqp.Publishing{
			MessageId: key, ContentType: "application/json", Body: payload,
			Headers: amqp.Table{conformanceHeader: send},
		})
	}
	_, ch := e.dial()
	if err := ch.Qos(50, 0, false); err != nil {
		t.Fatal(err)
	}
	ds := e.deliveries(ch)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range ds {
			send, _ := d.Headers[conformanceHeader].(string)
			deliver(consumetest.Delivery{
				Send:    send,
				Scope:   durable.Scope{Tenant: "default", Operation: e.queue, Key: d.MessageId},
				Requeue: func() { time.AfterFunc(time.Second, func() { _ = d.Reject(true) }) },
				Run: func(ctx context.Context, h consumetest.Handler) (consume.Action, error) {
					return c.Run(ctx, d, func(ctx context.Context, d *amqp.Delivery, op claim.Op) (durable.Result, error) {
						return h(ctx, op, d.Body)
					})
				},
			})
		}
	}()
	return publish, func() {
		_ = ch.Close() // ends ds; RabbitMQ requeues what was unacknowledged
		<-done
	}
}
