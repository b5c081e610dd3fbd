package postgres_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/internal/storeapi"
	"github.com/oncekey/oncekey/internal/testenv"
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
		before := f.stmts.n.Load()
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
		b.ReportMetric(float64(f.stmts.n.Load()-before)/float64(i), "stmts/op")
	})
	b.Run("tx", func(b *testing.B) {
		f := newFixture(b, fixtureOpts{})
		ctx, prefix := context.Background(), testenv.Name("k")
		before := f.stmts.n.Load()
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
		b.ReportMetric(float64(f.stmts.n.Load()-before)/float64(i), "stmts/op")
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
