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

func TestConformance(t *testing.T) { entrytest.Run(t, natsDriver{}) }

func TestConformance_BrokenSettlementsAreCaught(t *testing.T) {
	settletest.CatchBroken(t, natsDriver{})
}

const (
	// conformanceAckWait is the consumer's AckWait: the transport's own
	// timer, shorter than the lease, so work outlasts it in several
	// windows and JetStream redelivers the message while it runs.
	conformanceAckWait = time.Second
	// conformanceSendWait bounds how long Send waits for a message to be
	// acknowledged, terminated or held.
	conformanceSendWait = 6 * time.Second
	// conformanceHeader carries the send a delivery belongs to.
	conformanceHeader = "Entrytest-Send"
)

type natsDriver struct{}

func (natsDriver) Caps() entrytest.Caps {
	return entrytest.Caps{Tenant: "default", Timer: conformanceAckWait, NotApplicable: map[string]string{
		entrytest.CallerGone: "a consumer has no caller to go away: the publisher is done once JetStream stored the message",
		entrytest.Oversized:  "claimnats stores the handler's own durable.Result: it has no result size limit of its own",
	}}
}

// Encode is the handler's own result: a consumer stores what its handler
// returned (a failure through claim.Reject).
func (natsDriver) Encode(r entrytest.Response) durable.Result { return consumetest.Encode(r) }

func (natsDriver) Start(suite entrytest.Env) entrytest.Adapter {
	t := suite.T
	e := newStream(t, "op")
	cons := e.consumer(e.dial(), conformanceAckWait)
	c, err := claimnats.New(suite.Claimer, claimnats.WithRetryDelay(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var pub sync.Mutex // one publish at a time, each past the deduplication window
	sends := consumetest.NewSends(suite, conformanceSendWait, "acknowledged, terminated or held",
		func(ctx context.Context, key, send string, payload []byte) error {
			msg := nats.NewMsg(e.subject)
			msg.Data = payload
			msg.Header.Set(nats.MsgIdHdr, key)
			msg.Header.Set(conformanceHeader, send)
			pub.Lock()
			defer pub.Unlock()
			time.Sleep(120 * time.Millisecond) // past JetStream's deduplication window
			_, err := e.js.PublishMsg(ctx, msg)
			return err
		})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// As the application's consume loop does; a panic (the
			// Consumer lets it go on) is redelivered after a second.
			scope := durable.Scope{Tenant: "default", Operation: e.subject, Key: msg.Headers().Get(nats.MsgIdHdr)}
			sends.Deliver(msg.Headers().Get(conformanceHeader), scope, func() { _ = msg.NakWithDelay(time.Second) },
				func(h consumetest.Handler) (consume.Action, error) {
					return c.Run(ctx, msg, func(ctx context.Context, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
						return h(ctx, op, msg.Data())
					})
				})
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Stop()
		cancel()
		wg.Wait()
	})
	return sends
}
