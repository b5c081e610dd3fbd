package claimnats_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimnats"
	"github.com/oncekey/oncekey/claim/driver/consume"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/consumetest"
	"github.com/oncekey/oncekey/testkit/entrytest"
	"github.com/oncekey/oncekey/testkit/settletest"
)

// The entry-point conformance suite against Consumer.Run on a JetStream
// pull consumer. Its top-level tests are not parallel, so no other test of
// the package runs beside them: the negative controls break the
// settlement of the whole process.

func TestConformance(t *testing.T) { entrytest.Run(t, natsDriver) }

func TestConformance_BrokenSettlementsAreCaught(t *testing.T) {
	settletest.CatchBroken(t, natsDriver)
}

const (
	// conformanceAckWait is the consumer's AckWait: the transport's own
	// timer, shorter than the lease, so work outlasts it in several
	// windows and JetStream redelivers the message while it runs.
	conformanceAckWait = time.Second
	// conformanceHeader carries the send a delivery belongs to.
	conformanceHeader = "Entrytest-Send"
)

var natsDriver = consumetest.Driver{Adapter: "claimnats", Stored: "JetStream stored the message",
	Timer: conformanceAckWait, Final: "acknowledged, terminated or held", Consume: natsConsume}

// natsConsume is the suite's consumer on a stream of its own
// (consumetest.Driver.Consume).
func natsConsume(suite entrytest.Env, deliver func(consumetest.Delivery)) (func(ctx context.Context, key, send string, payload []byte) error, func()) {
	t := suite.T
	e := newStream(t, "op")
	cons := e.consumer(e.dial(), conformanceAckWait)
	c, err := claimnats.New(suite.Claimer, claimnats.WithRetryDelay(consumetest.ConformanceRetry))
	if err != nil {
		t.Fatal(err)
	}
	var pub sync.Mutex // one publish at a time, each past the deduplication window
	publish := func(ctx context.Context, key, send string, payload []byte) error {
		msg := nats.NewMsg(e.subject)
		msg.Data = payload
		msg.Header.Set(nats.MsgIdHdr, key)
		msg.Header.Set(conformanceHeader, send)
		pub.Lock()
		defer pub.Unlock()
		for {
			time.Sleep(120 * time.Millisecond) // past JetStream's deduplication window
			ack, err := e.js.PublishMsg(ctx, msg)
			if err != nil || !ack.Duplicate {
				return err
			}
			// JetStream forgets a message identity when a timer purges its
			// deduplication window, not when the window ends, so it may
			// drop a message published past the window: the message never
			// reaches the consumer. Publish it again.
		}
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		deliver(consumetest.Delivery{
			Send:    msg.Headers().Get(conformanceHeader),
			Scope:   durable.Scope{Tenant: "default", Operation: e.subject, Key: msg.Headers().Get(nats.MsgIdHdr)},
			Requeue: func() { _ = msg.NakWithDelay(time.Second) },
			Run: func(ctx context.Context, h consumetest.Handler) (consume.Action, error) {
				return c.Run(ctx, msg, func(ctx context.Context, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
					return h(ctx, op, msg.Data())
				})
			},
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return publish, cc.Stop
}
