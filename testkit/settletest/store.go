package settletest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// Store returns a schema of the test's own (testenv.Postgres), migrated,
// with the tables of the test's effects created in it (each "name
// (columns)", as Orders), and the PostgreSQL store on it: what the
// settlement tests of every entry point claim on, directly or wrapped in
// a Flaky.
func Store(t testing.TB, tables ...string) (testenv.Schema, storeapi.Store[pgx.Tx]) {
	t.Helper()
	s := testenv.Postgres(t)
	if err := postgres.Migrate(t.Context(), s.Pool, postgres.WithSchema(s.Name)); err != nil {
		t.Fatal(err)
	}
	st, err := postgres.New(s.Pool, postgres.WithSchema(s.Name))
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range tables {
		if _, err := s.Pool.Exec(t.Context(), `CREATE TABLE `+s.Name+`.`+table); err != nil {
			t.Fatal(err)
		}
	}
	return s, st.(storeapi.Store[pgx.Tx])
}

// Orders is the effects table of the HTTP and gRPC fixtures, for Store:
// one order row per run of the handler.
const Orders = "orders (id bigserial PRIMARY KEY, tenant text NOT NULL, item text NOT NULL, op text NOT NULL)"

// ErrDown is the error of a write a Flaky store fails: the store
// unreachable (it matches durable.ErrUnavailable).
var ErrDown = fmt.Errorf("%w: injected outage", durable.ErrUnavailable)

// Finishing names the finishing writes of a store, for Flaky.Finishing.
type Finishing uint8

// The finishing writes.
const (
	Complete Finishing = 1 << iota
	Fail
	MarkUncertain
	Release
	// AllFinishing is every finishing write.
	AllFinishing = Complete | Fail | MarkUncertain | Release
)

// Flaky is a store whose lease writes can be made to fail as unreachable
// (ErrDown), as a PostgreSQL that refuses connections would: Renew while
// RenewDown is set, the finishing writes named by Finishing while
// FinishDown is set. Set Store (or call Wrap) before use.
type Flaky struct {
	storeapi.Store[pgx.Tx]
	// Finishing are the finishing writes FinishDown fails and Finishes
	// counts; the others pass through, uncounted.
	Finishing Finishing
	// OutsideTx leaves a finishing write inside the caller's transaction
	// (tx not nil) alone: not failed, not counted.
	OutsideTx bool

	RenewDown  atomic.Bool
	FinishDown atomic.Bool
	Renews     atomic.Int64 // Renew calls
	Finishes   atomic.Int64 // calls of the writes of Finishing
}

// Wrap puts f around s and returns f: a fixture's store wrapper.
func (f *Flaky) Wrap(s storeapi.Store[pgx.Tx]) storeapi.Store[pgx.Tx] {
	f.Store = s
	return f
}

// SetDown sets RenewDown and FinishDown to down: the whole store
// unreachable, or back.
func (f *Flaky) SetDown(down bool) {
	f.RenewDown.Store(down)
	f.FinishDown.Store(down)
}

// finish counts a write w and says whether it fails.
func (f *Flaky) finish(w Finishing, tx pgx.Tx) error {
	if f.Finishing&w == 0 || (f.OutsideTx && tx != nil) {
		return nil
	}
	f.Finishes.Add(1)
	if f.FinishDown.Load() {
		return ErrDown
	}
	return nil
}

// Renew renews the lease unless RenewDown is set.
func (f *Flaky) Renew(ctx context.Context, ref durable.Ref, tok fence.Token, lease time.Duration) error {
	f.Renews.Add(1)
	if f.RenewDown.Load() {
		return ErrDown
	}
	return f.Store.Renew(ctx, ref, tok, lease)
}

// Complete completes, unless it fails (Finishing, FinishDown).
func (f *Flaky) Complete(ctx context.Context, tx pgx.Tx, ref durable.Ref, tok fence.Token, res durable.Result) error {
	if err := f.finish(Complete, tx); err != nil {
		return err
	}
	return f.Store.Complete(ctx, tx, ref, tok, res)
}

// Fail fails the operation, unless the write fails (Finishing, FinishDown).
func (f *Flaky) Fail(ctx context.Context, tx pgx.Tx, ref durable.Ref, tok fence.Token, res durable.Result) error {
	if err := f.finish(Fail, tx); err != nil {
		return err
	}
	return f.Store.Fail(ctx, tx, ref, tok, res)
}

// MarkUncertain marks the operation uncertain, unless the write fails
// (Finishing, FinishDown).
func (f *Flaky) MarkUncertain(ctx context.Context, ref durable.Ref, tok fence.Token) error {
	if err := f.finish(MarkUncertain, nil); err != nil {
		return err
	}
	return f.Store.MarkUncertain(ctx, ref, tok)
}

// Release releases the key, unless the write fails (Finishing,
// FinishDown).
func (f *Flaky) Release(ctx context.Context, tx pgx.Tx, ref durable.Ref, tok fence.Token) error {
	if err := f.finish(Release, tx); err != nil {
		return err
	}
	return f.Store.Release(ctx, tx, ref, tok)
}
