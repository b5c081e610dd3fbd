package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/sqlite"
)

// BenchmarkClaimComplete measures a fresh claim and its completion: on the
// store (two autocommit statements, two commits), inside one transaction
// (one commit), and the replay of a finished key (a claim that writes
// nothing). Each commit is fsynced (synchronous=FULL).
func BenchmarkClaimComplete(b *testing.B) {
	ctx := context.Background()
	res := durable.Result{StatusCode: 201, Body: []byte(`{"id":"o_1"}`), Version: 1}
	p := func(i int) storeapi.ClaimParams {
		return storeapi.ClaimParams{
			Scope:       durable.Scope{Tenant: "t", Operation: "POST /orders", Key: fmt.Sprintf("bench-%d", i)},
			Fingerprint: "v1:bench", Owner: uuid.New(), Lease: time.Minute, Retention: time.Hour,
		}
	}
	report := func(b *testing.B, s *sqlite.Store, before int64) {
		b.ReportMetric(float64(s.Statements()-before)/float64(b.N), "stmts/op")
	}

	b.Run("Store", func(b *testing.B) {
		s := benchStore(b)
		before := s.Statements()
		i := 0
		for b.Loop() {
			r, err := s.Claim(ctx, nil, p(i))
			if err != nil || !r.Acquired {
				b.Fatal(r, err)
			}
			if err := s.Complete(ctx, nil, r.Ref, r.Token, res); err != nil {
				b.Fatal(err)
			}
			i++
		}
		report(b, s, before)
	})

	b.Run("InTx", func(b *testing.B) {
		s := benchStore(b)
		before := s.Statements()
		i := 0
		for b.Loop() {
			err := s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				r, err := s.Claim(ctx, tx, p(i))
				if err != nil {
					return err
				}
				return s.Complete(ctx, tx, r.Ref, r.Token, res)
			})
			if err != nil {
				b.Fatal(err)
			}
			i++
		}
		report(b, s, before)
	})

	b.Run("Replay", func(b *testing.B) {
		s := benchStore(b)
		r, err := s.Claim(ctx, nil, p(-1))
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, nil, r.Ref, r.Token, res); err != nil {
			b.Fatal(err)
		}
		before := s.Statements()
		for b.Loop() {
			r, err := s.Claim(ctx, nil, p(-1))
			if err != nil || r.Acquired || r.Record.State != durable.Completed {
				b.Fatal(r, err)
			}
		}
		report(b, s, before)
	})

	b.Run("ParallelStore", func(b *testing.B) {
		s := benchStore(b)
		before := s.Statements()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r, err := s.Claim(ctx, nil, p(int(uuid.New().ID())))
				if err != nil || !r.Acquired {
					b.Fatal(r, err)
				}
				if err := s.Complete(ctx, nil, r.Ref, r.Token, res); err != nil {
					b.Fatal(err)
				}
			}
		})
		report(b, s, before)
	})
}

func benchStore(b *testing.B) *sqlite.Store {
	s, err := sqlite.OpenStore(context.Background(), filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	if err := s.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	return s
}
