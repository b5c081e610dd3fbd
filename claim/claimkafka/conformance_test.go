package claimkafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimkafka"
	"github.com/oncekey/oncekey/claim/driver/consume"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/consumetest"
	"github.com/oncekey/oncekey/testkit/entrytest"
	"github.com/oncekey/oncekey/testkit/settletest"
)

// The entry-point conformance suite against Consumer.Run on a Kafka
// consumer group. Its top-level tests are not parallel, so no other test
// of the package runs beside them: the negative controls break the
// settlement of the whole process.

func TestConformance(t *testing.T) { entrytest.Run(t, kafkaDriver) }

func TestConformance_BrokenSettlementsAreCaught(t *testing.T) {
	settletest.CatchBroken(t, kafkaDriver)
}

// conformanceHeader carries the send a record belongs to.
const conformanceHeader = "entrytest-send"

// kafkaDriver's Timer stays zero: Kafka has no timer on a record being
// handled (the group's session is kept by the client's heartbeats, apart
// from the handler).
var kafkaDriver = consumetest.Driver{Adapter: "claimkafka", Stored: "Kafka appended the record",
	Final: "marked settled", Consume: kafkaConsume}

// kafkaConsume is the suite's consumer on a topic of its own, 4
// partitions written round robin so a key's copies race across
// partitions (consumetest.Driver.Consume). Each record is handed to
// deliver from Poll, which waits for its Run before the next record of
// its partition.
func kafkaConsume(suite entrytest.Env, deliver func(consumetest.Delivery)) (func(ctx context.Context, key, send string, payload []byte) error, func()) {
	t := suite.T
	e := newTopic(t, 4)
	cons, err := claimkafka.New(suite.Claimer, e.member(), claimkafka.WithRetryDelay(consumetest.ConformanceRetry))
	if err != nil {
		t.Fatal(err)
	}
	publish := func(ctx context.Context, key, send string, payload []byte) error {
		return e.prod.ProduceSync(ctx, &kgo.Record{Topic: e.topic, Value: payload, Headers: []kgo.RecordHeader{
			{Key: claimkafka.DefaultHeader, Value: []byte(key)}, {Key: conformanceHeader, Value: []byte(send)},
		}}).FirstErr()
	}
	type result struct {
		a   claimkafka.Action
		err error
	}
	stop := poll(t, context.Background(), cons, func(ctx context.Context, rec *kgo.Record) (claimkafka.Action, error) {
		done := make(chan result, 2)
		deliver(consumetest.Delivery{
			Send:  header(rec, conformanceHeader),
			Scope: durable.Scope{Tenant: "default", Operation: e.topic, Key: header(rec, claimkafka.DefaultHeader)},
			// The Run panicked: not settled; Poll rewinds the partition
			// to it, a second later.
			Requeue: func() { time.AfterFunc(time.Second, func() { done <- result{claimkafka.Retry, nil} }) },
			Run: func(ctx context.Context, h consumetest.Handler) (consume.Action, error) {
				a, err := cons.Run(ctx, rec, func(ctx context.Context, rec *kgo.Record, op claim.Op) (durable.Result, error) {
					return h(ctx, op, rec.Value)
				})
				done <- result{a, err}
				return a, err
			},
		})
		select {
		case r := <-done:
			return r.a, r.err
		case <-ctx.Done():
			return claimkafka.Retry, ctx.Err()
		}
	})
	return publish, stop
}

// header returns rec's header key ("" without).
func header(rec *kgo.Record, key string) string {
	for _, h := range rec.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
