package claimkafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimkafka"
	"github.com/oncekey/oncekey/claim/driver/consume"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/consumetest"
)

// The scenarios every consumer adapter runs (testkit/consumetest), here
// on a Kafka consumer group.

func TestRun_StoreOutageAtCompletion_OneEffect(t *testing.T) {
	consumetest.StoreOutageAtCompletion(t, newEnv(t))
}

func TestScenarios(t *testing.T) { consumetest.Scenarios(t, newEnv) }

// HoldPassesOn tells the scenarios that a held record is passed on, not
// redelivered (consumetest.HoldPasser): they publish its copies instead.
func (e *env) HoldPassesOn() {}

// identity is the Rig's identity of rec: its header.
func identity(rec *kgo.Record) string { return header(rec, claimkafka.DefaultHeader) }

// ConsumeDo consumes the test's topic in Do mode with a member of its own
// (consumetest.Rig.ConsumeDo); closeConn closes the member's client, as a
// killed consumer's connection closes.
func (e *env) ConsumeDo(ctx context.Context, c *claim.Claimer[pgx.Tx], retry time.Duration, work consumetest.DoWork) (closeConn func()) {
	e.t.Helper()
	cl := e.member()
	cons, err := claimkafka.New(c, cl, claimkafka.WithRetryDelay(retry))
	if err != nil {
		e.t.Fatal(err)
	}
	poll(e.t, ctx, cons, func(ctx context.Context, rec *kgo.Record) (claimkafka.Action, error) {
		a, err := cons.Do(ctx, rec, func(ctx context.Context, tx pgx.Tx, rec *kgo.Record, op claim.Op) (durable.Result, error) {
			return work(ctx, tx, op, identity(rec))
		})
		if a != claimkafka.Retry {
			e.settle(rec)
		}
		return a, err
	})
	return cl.Close
}

// ConsumeRaw consumes the test's topic without the adapter
// (consumetest.Rig.ConsumeRaw).
func (e *env) ConsumeRaw(effect func(id string) error) {
	cl := e.member()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			if fs.IsClientClosed() {
				return
			}
			fs.EachRecord(func(rec *kgo.Record) {
				if effect(identity(rec)) == nil {
					cl.MarkCommitRecords(rec)
					e.settle(rec)
				}
			})
		}
	}()
	e.t.Cleanup(func() { cancel(); <-done })
}

// ConsumeRun consumes the test's topic in workflow mode with a member of
// its own (consumetest.Rig.ConsumeRun); drained waits until every record
// published was settled.
func (e *env) ConsumeRun(c *claim.Claimer[pgx.Tx], s consumetest.Settings, work consumetest.Work,
	record func(consume.Action, error)) (drained func(time.Duration), stop func()) {
	e.t.Helper()
	var opts []claimkafka.Option
	if s.Retry > 0 {
		opts = append(opts, claimkafka.WithRetryDelay(s.Retry))
	}
	if s.Log != nil {
		opts = append(opts, claimkafka.WithLogger(s.Log))
	}
	// s.Uncertain has no Kafka equivalent: an uncertain record is passed on.
	cons, err := claimkafka.New(c, e.member(), opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	stop = poll(e.t, context.Background(), cons, func(ctx context.Context, rec *kgo.Record) (claimkafka.Action, error) {
		a, err := cons.Run(ctx, rec, func(ctx context.Context, _ *kgo.Record, op claim.Op) (durable.Result, error) {
			return work(ctx, op)
		})
		if a != claimkafka.Retry {
			e.settle(rec)
		}
		record(a, err)
		return a, err
	})
	return func(within time.Duration) {
		e.t.Helper()
		consumetest.WaitUntil(e.t, "every record settled", within, func() bool { return e.settledCount() >= e.published() })
	}, stop
}
