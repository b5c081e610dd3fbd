package postgres_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
)

// Set up a pool with the session timeouts, migrate, and claim then complete
// a key. Needs DATABASE_URL, so it is compiled but not run.
func Example() {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	if err := postgres.ConfigurePool(cfg, postgres.WithLockTimeout(2*time.Second)); err != nil {
		panic(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	store, err := postgres.New(pool, postgres.WithKeySecret([]byte(os.Getenv("IDEMPOTENCY_KEY_SECRET"))))
	if err != nil {
		panic(err)
	}

	res, err := store.Claim(ctx, nil, durable.ClaimParams{
		Scope:       durable.Scope{Tenant: "acme", Operation: "POST /orders", Key: "9b1f4c52-order-42"},
		Fingerprint: "v1:…",
		Owner:       uuid.New(),
		Lease:       30 * time.Second,
		Retention:   24 * time.Hour,
	})

	switch {
	case err != nil:
		panic(err) // ErrMismatch, ErrUnavailable, ...
	case !res.Acquired:
		fmt.Println("replay or in progress:", res.Record.State)
		return
	}
	// ... run the operation, passing res.Ref.OperationID() downstream ...
	err = store.Complete(ctx, nil, res.Ref, res.Token, durable.Result{StatusCode: 201, Body: []byte(`{"id":"ord_1"}`)})
	fmt.Println(err)
}

// Claim, the business write and the completion commit together.
func ExampleStore_InTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	store, _ := postgres.New(pool)
	p := durable.ClaimParams{
		Scope:       durable.Scope{Tenant: "acme", Operation: "POST /orders", Key: "order-43"},
		Fingerprint: "v1:…", Owner: uuid.New(), Lease: 10 * time.Second, Retention: 24 * time.Hour,
	}
	err = store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		res, err := store.Claim(ctx, tx, p)
		if err != nil || !res.Acquired {
			return err // a replay: nothing to do
		}
		if _, err := tx.Exec(ctx, "INSERT INTO orders (id) VALUES ($1)", res.Ref.OperationID()); err != nil {
			return err
		}
		return store.Complete(ctx, tx, res.Ref, res.Token, durable.Result{StatusCode: 201})
	})
	if err != nil {
		// durable.ErrUnavailable from COMMIT: re-read with store.Get to learn the outcome.
		fmt.Println(err)
	}
}
