package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/sqlite"
)

// Claim an idempotency key, insert an order and complete the key in one
// SQLite transaction; the retry of the same request replays the result.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "oncekey-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	db, err := sqlite.Open(filepath.Join(dir, "oncekey.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := sqlite.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	s, err := sqlite.New(db)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, item TEXT)`); err != nil {
		log.Fatal(err)
	}

	placeOrder := func() durable.ClaimResult {
		var out durable.ClaimResult
		err := s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			r, err := s.Claim(ctx, tx, durable.ClaimParams{
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
	fmt.Println("first: acquired", first.Acquired)
	retry := placeOrder()
	fmt.Println("retry: acquired", retry.Acquired, "replays", retry.Record.Result.StatusCode, string(retry.Record.Result.Body))
	fmt.Println("retry: under the first token", retry.Record.Token == first.Token)

	var orders int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&orders); err != nil {
		log.Fatal(err)
	}
	fmt.Println("orders:", orders)
	// Output:
	// first: acquired true
	// retry: acquired false replays 201 {"id":"ord_1"}
	// retry: under the first token true
	// orders: 1
}
