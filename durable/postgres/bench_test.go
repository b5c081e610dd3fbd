package postgres_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// BenchmarkClaimComplete measures claim → complete of a fresh key on real
// PostgreSQL, on the pool (two statements) and inside one transaction
// (BEGIN, claim, complete, COMMIT), and reports statements (round trips)
// per operation, counted by a pgx tracer.
func BenchmarkClaimComplete(b *testing.B) {
	res := durable.Result{StatusCode: 201, Body: []byte(`{"id":"ord_1"}`), Version: 1,
		Headers: map[string][]string{"Content-Type": {"application/json"}}}
	params := func(prefix string, i int) storeapi.ClaimParams {
		return storeapi.ClaimParams{
			Scope:       durable.Scope{Tenant: "bench", Operation: "POST /orders", Key: prefix + strconv.Itoa(i)},
			Fingerprint: "v1:bench", Owner: uuid.New(), Lease: 30 * time.Second, Retention: time.Hour,
		}
	}
	b.Run("pool", func(b *testing.B) {
		f := newFixture(b, fixtureOpts{})
		ctx, prefix := context.Background(), testenv.Name("k")
		before := f.stmts.Count()
		i := 0
		for b.Loop() {
			r, err := f.s.Claim(ctx, nil, params(prefix, i))
			if err != nil || !r.Acquired {
				b.Fatalf("Claim = %+v, %v", r, err)
			}
			if err := f.s.Complete(ctx, nil, r.Ref, r.Token, res); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.ReportMetric(float64(f.stmts.Count()-before)/float64(i), "stmts/op")
	})
	b.Run("tx", func(b *testing.B) {
		f := newFixture(b, fixtureOpts{})
		ctx, prefix := context.Background(), testenv.Name("k")
		before := f.stmts.Count()
		i := 0
		for b.Loop() {
			err := f.s.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				r, err := f.s.Claim(ctx, tx, params(prefix, i))
				if err != nil {
					return err
				}
				return f.s.Complete(ctx, tx, r.Ref, r.Token, res)
			})
			if err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.ReportMetric(float64(f.stmts.Count()-before)/float64(i), "stmts/op")
		b.ReportMetric(1, "tx/op")
	})
}

// BenchmarkStats measures Stats on tables of 10,000 and 100,000 records
// (the mix of seed: nearly all finished, a few hundred per 2,000 in the
// small sets Stats counts exactly, after VACUUM ANALYZE), against the full
// count Stats used before ("fullscan": one sequential scan of the table).
// Stats' cost follows the small sets, not the table; the full count's
// follows the table.
//
//	go test -run '^$' -bench 'Stats' ./durable/postgres
func BenchmarkStats(b *testing.B) {
	for _, rows := range []int{10_000, 100_000} {
		b.Run("rows="+strconv.Itoa(rows), func(b *testing.B) {
			f := newFixture(b, fixtureOpts{})
			postgres.Seed(b, f.pool, "idempotency_requests", rows)
			ctx := context.Background()
			b.Run("indexed", func(b *testing.B) {
				for b.Loop() {
					if _, err := f.s.Stats(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("fullscan", func(b *testing.B) {
				for b.Loop() {
					if err := postgres.FullCountStats(ctx, f.s); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkPartitions compares the throughput of claim → complete of fresh
// keys (on the pool, two statements, 16 goroutines) on an unpartitioned
// table, on one WithPartitions(16), and on the same partitioned table with
// sessions forced to generic plans (plan_cache_mode=force_generic_plan).
// Each iteration is one round: each variant runs alone for 300ms in turn,
// so drift on a shared machine hits all of them alike; run it for several
// rounds (-benchtime 10x). It reports each variant's operations per second
// over all rounds and the ratios to plain (below 1: slower).
//
//	go test -run '^$' -bench 'Partitions' -benchtime 10x ./durable/postgres
func BenchmarkPartitions(b *testing.B) {
	res := durable.Result{StatusCode: 201, Body: []byte(`{"id":"ord_1"}`), Version: 1,
		Headers: map[string][]string{"Content-Type": {"application/json"}}}
	part := []postgres.Option{postgres.WithPartitions(16)}
	variants := []struct {
		name string
		f    *fixture
		ops  int64
		busy time.Duration
	}{
		{name: "plain", f: newFixture(b, fixtureOpts{})},
		{name: "partitioned", f: newFixture(b, fixtureOpts{opts: part})},
		{name: "partitioned-generic", f: newFixture(b, fixtureOpts{opts: part, genericPlans: true})},
	}
	var seq atomic.Int64
	prefix := testenv.Name("k")
	const workers, slice = 16, 300 * time.Millisecond
	for b.Loop() {
		for i := range variants {
			v := &variants[i]
			var ops atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			deadline := start.Add(slice)
			for range workers {
				wg.Go(func() {
					for time.Now().Before(deadline) {
						p := storeapi.ClaimParams{
							Scope:       durable.Scope{Tenant: "bench", Operation: "POST /orders", Key: prefix + strconv.FormatInt(seq.Add(1), 10)},
							Fingerprint: "v1:bench", Owner: uuid.New(), Lease: 30 * time.Second, Retention: time.Hour,
						}
						r, err := v.f.s.Claim(context.Background(), nil, p)
						if err != nil || !r.Acquired {
							b.Errorf("Claim = %+v, %v", r, err)
							return
						}
						if err := v.f.s.Complete(context.Background(), nil, r.Ref, r.Token, res); err != nil {
							b.Error(err)
							return
						}
						ops.Add(1)
					}
				})
			}
			wg.Wait()
			v.ops += ops.Load()
			v.busy += time.Since(start)
		}
	}
	rate := func(i int) float64 { return float64(variants[i].ops) / variants[i].busy.Seconds() }
	for i, v := range variants {
		b.ReportMetric(rate(i), v.name+"-ops/s")
		if i > 0 {
			b.ReportMetric(rate(i)/rate(0), v.name+"/plain")
		}
	}
}
