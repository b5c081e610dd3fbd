package claimkafka_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimkafka"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/consumetest"
)

// The consumer throughput of Consumer.Do against the same handler with no
// claim, on kfake and the test servers: b.N records of distinct
// Idempotency-Key headers on 3 partitions, consumed by one member from
// the first record to the last settled. The handler is the same in both:
// one row inserted in a transaction. Compare the two records/s (side by
// side, one run: `go test -run '^$' -bench Consume -benchtime 2000x`).
//
//   - Do: Consumer.Poll and Consumer.Do (the claim, Redis in front, then
//     the row in the claim's transaction, then the mark).
//   - NoClaim: the client's own poll loop, the row in a transaction of
//     its own, then the mark.
func BenchmarkConsume(b *testing.B) {
	for _, v := range []string{"Do", "NoClaim"} {
		b.Run(v, func(b *testing.B) { benchConsume(b, v == "Do") })
	}
}

func benchConsume(b *testing.B, withClaim bool) {
	e := newBenchEnv(b)
	ctx := context.Background()
	recs := make([]*kgo.Record, b.N)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: e.topic, Value: fmt.Appendf(nil, `{"charge":%d}`, i),
			Headers: []kgo.RecordHeader{{Key: claimkafka.DefaultHeader, Value: fmt.Appendf(nil, "bench-%d", i)}}}
	}
	if err := e.prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		b.Fatal(err)
	}
	cl := e.member()
	var settled atomic.Int64
	var first, last atomic.Int64 // unix nanoseconds of the first and last record settled
	done := make(chan struct{})
	insert := func(ctx context.Context, tx pgx.Tx, id string, rec *kgo.Record) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (op_id, msg) VALUES ($1, $2)`, id, string(rec.Value))
		return err
	}
	pctx, stop := context.WithCancel(ctx)
	count := func() {
		now := time.Now().UnixNano()
		first.CompareAndSwap(0, now)
		if settled.Add(1) == int64(b.N) {
			last.Store(now)
			stop()
		}
	}
	b.ResetTimer()
	if withClaim {
		c := consumetest.Claimer(b, e.schema, nil, e.rdb, e.prefix, 5*time.Second)
		cons, err := claimkafka.New(c, cl)
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			defer close(done)
			_ = cons.Poll(pctx, func(ctx context.Context, rec *kgo.Record) (claimkafka.Action, error) {
				a, err := cons.Do(ctx, rec, func(ctx context.Context, tx pgx.Tx, rec *kgo.Record, op claim.Op) (durable.Result, error) {
					return durable.Result{Body: []byte("ok")}, insert(ctx, tx, op.ID, rec)
				})
				if a == claimkafka.Ack {
					count()
				}
				return a, err
			})
		}()
	} else {
		// Poll's shape without the claim: a partition's records in order
		// on a goroutine of their own, the partitions of a batch side by
		// side.
		go func() {
			defer close(done)
			for pctx.Err() == nil {
				fs := cl.PollFetches(pctx)
				var wg sync.WaitGroup
				fs.EachPartition(func(p kgo.FetchTopicPartition) {
					wg.Go(func() {
						for _, rec := range p.Records {
							if pgx.BeginFunc(pctx, e.schema.Pool, func(tx pgx.Tx) error { return insert(pctx, tx, "", rec) }) != nil {
								return
							}
							cl.MarkCommitRecords(rec)
							count()
						}
					})
				})
				wg.Wait()
			}
		}()
	}
	<-done
	b.StopTimer()
	// From the first record settled to the last: the group's join, the
	// same for both, is left out.
	if n := b.N - 1; n > 0 {
		b.ReportMetric(float64(n)/time.Duration(last.Load()-first.Load()).Seconds(), "records/s")
	}
	if rows, _ := consumetest.Effects(b, e.schema); rows != b.N {
		b.Fatalf("%d rows for %d records", rows, b.N)
	}
}
