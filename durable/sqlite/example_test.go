package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/sqlite"
)

// Open and migrate a database, hand the store to a Claimer, and claim an
// idempotency key, insert an order and complete the key in one SQLite
// transaction; the retry of the same request replays the result.
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
	c, err := claim.New(s)
	if err != nil {
		log.Fatal(err)
	}
	req := claim.Request{
		Scope:       durable.Scope{Tenant: "acme", Operation: "POST /orders", Key: "9f1c-order-1"},
		Fingerprint: "v1:book",
	}
	placeOrder := func(ctx context.Context, tx *sql.Tx, op claim.Op) (durable.Result, error) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders VALUES ('ord_1', 'book')`); err != nil {
			return durable.Result{}, err
		}
		return durable.Result{StatusCode: 201, Body: []byte(`{"id":"ord_1"}`), ResourceID: "ord_1"}, nil
	}

	for _, name := range []string{"first", "retry"} {
		out, err := c.Do(ctx, req, placeOrder)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(name+":", out.Kind, out.Result.StatusCode, string(out.Result.Body))
	}
	var orders int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&orders); err != nil {
		log.Fatal(err)
	}
	fmt.Println("orders:", orders)
	// Output:
	// first: executed 201 {"id":"ord_1"}
	// retry: replayed 201 {"id":"ord_1"}
	// orders: 1
}
