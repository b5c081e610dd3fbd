package claim_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/lua"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// exampleEnv returns a PostgreSQL store on a fresh schema of the test database, its
// pool, a Redis client and a key prefix of the example's own (the test
// servers: DATABASE_URL and REDIS_URL, or their local defaults).
func exampleEnv() (durable.Store[pgx.Tx], *pgxpool.Pool, *redis.Client, string, func()) {
	pool, rdb, prefix, cleanup := testenv.Example()
	ctx := context.Background()
	if err := postgres.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	store, err := postgres.New(pool)
	if err != nil {
		panic(err)
	}
	return store, pool, rdb, prefix, cleanup
}

// Do claims the key, runs the business write and stores its result in one
// transaction. The retry replays the stored result instead of running again.
func ExampleClaimer_Do() {
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
		Scope:       durable.Scope{Tenant: "tenant-42", Operation: "POST /orders", Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		Fingerprint: "v1:request-fingerprint-from-package-canon",
	}
	placeOrder := func(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, item) VALUES ($1, $2)`, "ord_1", "book"); err != nil {
			return durable.Result{}, err // transient: rolled back, key freed
		}
		return durable.Result{StatusCode: 201, Body: []byte(`{"id":"ord_1"}`)}, nil
	}
	for range 2 {
		out, err := c.Do(ctx, req, placeOrder)
		if err != nil {
			panic(err)
		}
		fmt.Println(out.Kind, out.Result.StatusCode, string(out.Result.Body))
	}
	var n int
	_ = db.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
	fmt.Println("orders:", n)
	// Output:
	// executed 201 {"id":"ord_1"}
	// replayed 201 {"id":"ord_1"}
	// orders: 1
}

// Claim returns a lease for work that calls other systems. The operation
// identity goes downstream as that system's idempotency key; the completion
// is fenced by the lease's token.
func ExampleClaimer_Claim() {
	store, _, rdb, prefix, cleanup := exampleEnv()
	defer cleanup()
	ctx := context.Background()
	c, err := claim.New[pgx.Tx](store, claim.WithRedis(rdb, lua.Options{Prefix: prefix}), claim.WithLease(10*time.Second))
	if err != nil {
		panic(err)
	}
	req := claim.Request{
		Scope:       durable.Scope{Tenant: "tenant-42", Operation: "POST /deploys", Key: "deploy-2026-12-02"},
		Fingerprint: "v1:deploy-fingerprint",
	}

	out, err := c.Claim(ctx, req)
	if err != nil {
		panic(err)
	}
	if out.Kind == claim.Acquired {
		work, stop := out.Lease.KeepAlive(ctx)
		_ = work // run the deploy under work; pass out.Lease.OperationID() downstream
		if err := stop(); err != nil {
			panic(err) // the lease was lost: do not publish
		}
		if err := out.Lease.Complete(ctx, durable.Result{StatusCode: 202, Body: []byte("deployed")}); err != nil {
			panic(err)
		}
		fmt.Println("first:", out.Kind)
	}

	dup, _ := c.Claim(ctx, req)
	fmt.Println("retry:", dup.Kind, string(dup.Result.Body))

	_, err = c.Claim(ctx, claim.Request{Scope: req.Scope, Fingerprint: "v1:another-payload"})
	fmt.Println("reuse with another payload is a mismatch:", errors.Is(err, claim.ErrMismatch))
	// Output:
	// first: acquired
	// retry: replayed deployed
	// reuse with another payload is a mismatch: true
}

// A Reconciler resolves operations whose outcome was unknown by asking the
// downstream system with the operation identity.
func ExampleReconciler() {
	store, _, _, _, cleanup := exampleEnv()
	defer cleanup()
	ctx := context.Background()
	c, err := claim.New[pgx.Tx](store)
	if err != nil {
		panic(err)
	}
	req := claim.Request{
		Scope:       durable.Scope{Tenant: "tenant-42", Operation: "POST /payments", Key: "pay-1"},
		Fingerprint: "v1:payment-fingerprint",
	}
	out, err := c.Claim(ctx, req)
	if err != nil {
		panic(err)
	}
	// The gateway timed out after it may have charged: do not guess.
	if err := out.Lease.MarkUncertain(ctx); err != nil {
		panic(err)
	}
	retry, _ := c.Claim(ctx, req)
	fmt.Println("retry while unknown:", retry.Kind)

	gatewayCharged := map[string]bool{out.OperationID: true} // what the gateway would answer
	rec, err := claim.NewReconciler(c, func(ctx context.Context, r durable.Record) (claim.Resolution, error) {
		if gatewayCharged[r.Ref.OperationID()] {
			return claim.Resolved(durable.Completed, durable.Result{StatusCode: 201, Body: []byte("charged")}), nil
		}
		return claim.Unresolved(), nil // ask again on a later pass
	})
	if err != nil {
		panic(err)
	}
	// In a service: go rec.Run(ctx, 30*time.Second). Here, one pass.
	report, err := rec.RunOnce(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("resolved:", report.Resolved)
	after, _ := c.Claim(ctx, req)
	fmt.Println("retry after reconciling:", after.Kind, string(after.Result.Body))
	// Output:
	// retry while unknown: uncertain
	// resolved: 1
	// retry after reconciling: replayed charged
}

// RunSweeper deletes finished records past their retention, every interval,
// until its context is done. Run it beside the service: without it the
// table only grows.
func ExampleClaimer_RunSweeper() {
	store, _, _, _, cleanup := exampleEnv()
	defer cleanup()
	c, err := claim.New[pgx.Tx](store)
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.RunSweeper(ctx, time.Minute) }()

	// ... serve requests ...

	stop() // on shutdown
	fmt.Println("sweeper stopped:", <-done)
	// Output:
	// sweeper stopped: <nil>
}

// Step records each external call of a workflow. A worker that dies after
// the charge leaves it recorded; the retry that takes the operation over
// gets the charge's result back without charging again, and runs only the
// receipt.
func ExampleLease_Step() {
	store, _, rdb, prefix, cleanup := exampleEnv()
	defer cleanup()
	ctx := context.Background()
	c, err := claim.New[pgx.Tx](store, claim.WithRedis(rdb, lua.Options{Prefix: prefix}), claim.WithLease(time.Second))
	if err != nil {
		panic(err)
	}
	req := claim.Request{
		Scope:       durable.Scope{Tenant: "tenant-42", Operation: "POST /payments", Key: "5b0e6c1e-2f1d-4c52-9a55-7f8e0c1a2b3d"},
		Fingerprint: "v1:request-fingerprint-from-package-canon",
	}
	charges := 0
	charge := func(ctx context.Context, key string) ([]byte, error) {
		charges++ // the gateway call, with key as its idempotency key
		return []byte("ch_1"), nil
	}
	receipt := func(ctx context.Context, key string) ([]byte, error) { return []byte("sent"), nil }

	first, err := c.Claim(ctx, req)
	if err != nil {
		panic(err)
	}
	if _, err := first.Lease.Step(ctx, "charge", charge); err != nil {
		panic(err)
	}
	// The worker dies here. Once its lease has run out, a retry takes over.
	time.Sleep(1200 * time.Millisecond)
	retry, err := c.Claim(ctx, req)
	if err != nil || retry.Kind != claim.Acquired {
		panic(fmt.Sprint(retry.Kind, err))
	}
	ch, _ := retry.Lease.Step(ctx, "charge", charge)
	sent, _ := retry.Lease.Step(ctx, "receipt", receipt)
	if err := retry.Lease.Complete(ctx, durable.Result{StatusCode: 201, Body: ch}); err != nil {
		panic(err)
	}
	fmt.Println(string(ch), string(sent), "charges:", charges)
	// Output:
	// ch_1 sent charges: 1
}
