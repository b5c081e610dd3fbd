package claim_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/lua"
)

// DoTx runs inside a transaction the handler began: the claim, the order
// and the stored result commit with it. finish runs the Redis step after
// the COMMIT. Operation then reads the operation by its identity, within
// its tenant only.
func ExampleClaimer_DoTx() {
	store, db, rdb, prefix, cleanup := exampleEnv()
	defer cleanup()
	ctx := context.Background()
	if _, err := db.Exec(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, item TEXT)`); err != nil {
		panic(err)
	}
	c, err := claim.New[pgx.Tx](store, claim.WithRedis(rdb, lua.Options{Prefix: prefix}))
	if err != nil {
		panic(err)
	}
	req := claim.Request{
		Scope:       durable.Scope{Tenant: "tenant-42", Operation: "POST /orders", Key: "2f6c1b0e-order"},
		Fingerprint: "v1:request-fingerprint-from-package-canon",
	}

	tx, err := db.Begin(ctx) // the handler's own transaction
	if err != nil {
		panic(err)
	}
	out, finish, err := c.DoTx(ctx, tx, req, func(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, item) VALUES ('ord_1', 'book')`); err != nil {
			return durable.Result{}, err
		}
		return durable.Result{StatusCode: 201, Body: []byte(`{"id":"ord_1"}`)}, nil
	})
	if err != nil {
		_ = tx.Rollback(ctx) // DoTx's writes roll back with it: no record, the retry runs again
		panic(err)
	}
	err = tx.Commit(ctx)
	finish(ctx, err)
	if err != nil {
		panic(err)
	}
	fmt.Println(out.Kind, out.State, out.Result.StatusCode)

	rec, err := c.Operation(ctx, "tenant-42", out.OperationID)
	fmt.Println(rec.State, err)
	_, err = c.Operation(ctx, "another-tenant", out.OperationID)
	fmt.Println("another tenant: not found:", errors.Is(err, durable.ErrNotFound))
	// Output:
	// executed completed 201
	// completed <nil>
	// another tenant: not found: true
}
