package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/sqlite"
)

// TestStore_ClaimWriteCompleteInOneTx claims an idempotency key, inserts an
// order and completes the key in one SQLite transaction, on a store from
// New over the caller's database; the retry of the same request replays the
// result under the first token. (It was the package example before the claim
// protocol became internal; the example now goes through package claim.)
func TestStore_ClaimWriteCompleteInOneTx(t *testing.T) {
	ctx := t.Context()
	log := t
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "oncekey.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := sqlite.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	st, err := sqlite.New(db)
	if err != nil {
		log.Fatal(err)
	}
	s := st.(storeapi.Store[*sql.Tx])
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, item TEXT)`); err != nil {
		log.Fatal(err)
	}

	placeOrder := func() storeapi.ClaimResult {
		var out storeapi.ClaimResult
		err := s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			r, err := s.Claim(ctx, tx, storeapi.ClaimParams{
				Scope:       durable.Scope{Tenant: "acme", Operation: "POST /orders", Key: "9f1c-order-1"},
				Fingerprint: "v1:book",
				Owner:       uuid.New(),
				Lease:       30 * time.Second,
				Retention:   24 * time.Hour,
			})

			out = r
			if err != nil || !r.Acquired {
				return err // a duplicate: nothing to do in this transaction
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO orders VALUES ('ord_1', 'book')`); err != nil {
				return err
			}
			return s.Complete(ctx, tx, r.Ref, r.Token, durable.Result{
				StatusCode: 201, Body: []byte(`{"id":"ord_1"}`), ResourceID: "ord_1",
			})

		})
		if err != nil {
			log.Fatal(err)
		}
		return out
	}

	first := placeOrder()
	retry := placeOrder()
	var orders int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&orders); err != nil {
		log.Fatal(err)
	}
	got := fmt.Sprintf("first: acquired %v\nretry: acquired %v replays %d %s\nretry: under the first token %v\norders: %d",
		first.Acquired, retry.Acquired, retry.Record.Result.StatusCode, retry.Record.Result.Body, retry.Record.Token == first.Token, orders)
	want := `first: acquired true
retry: acquired false replays 201 {"id":"ord_1"}
retry: under the first token true
orders: 1`
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

// A claim outside a transaction that the rule refuses (a replay, a live
// lease) is answered by a read, without the store's write lock: it does not
// queue behind a transaction that holds the lock. The control: a claim that
// must write (a new key) does wait for that transaction.
func TestStore_RefusedClaimDoesNotWaitForWriters(t *testing.T) {
	s := open(t)
	ctx := t.Context()
	finished, running := newScope(), newScope()
	p := params(finished, "v1:a")
	r := mustClaim(t, s, p)
	if err := s.Complete(ctx, nil, r.Ref, r.Token, durable.Result{StatusCode: 201, Body: []byte("done")}); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, s, params(running, "v1:a"))

	holding, release := make(chan struct{}), make(chan struct{})
	txDone := make(chan error, 1)
	go func() {
		txDone <- s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			if _, err := s.Claim(ctx, tx, params(newScope(), "v1:a")); err != nil {
				return err
			}
			close(holding) // the transaction holds the write lock
			<-release
			return nil
		})
	}()
	<-holding
	for _, sc := range []durable.Scope{finished, running} {
		res, err := s.Claim(ctx, nil, params(sc, "v1:a"))
		if err != nil || res.Acquired || res.Record == nil {
			t.Fatalf("refused claim while a writer holds the lock = %+v, %v", res, err)
		}
	}
	if got := errOf(s.Claim(ctx, nil, params(finished, "v1:other"))); !errors.Is(got, durable.ErrMismatch) {
		t.Fatalf("reuse with another fingerprint = %v; want ErrMismatch", got)
	}
	if n := s.WriteWaiters(); n != 0 {
		t.Fatalf("%d claims wait for the write lock; want none", n)
	}
	fresh := make(chan error, 1)
	go func() {
		_, err := s.Claim(ctx, nil, params(newScope(), "v1:a"))
		fresh <- err
	}()
	waitUntil(t, "the fresh claim waits for the write lock", func() bool { return s.WriteWaiters() == 1 })
	close(release)
	if err := <-txDone; err != nil {
		t.Fatal(err)
	}
	if err := <-fresh; err != nil {
		t.Fatal(err)
	}
}

func errOf(_ storeapi.ClaimResult, err error) error { return err }
