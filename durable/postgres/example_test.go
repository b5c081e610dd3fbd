package postgres_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
)

// Set up a pool with the session timeouts, migrate, and hand the store to a
// Claimer that claims a key, writes and completes it in one transaction. Needs DATABASE_URL, so it is compiled but not run.
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

	c, err := claim.New(store, claim.WithLease(30*time.Second), claim.WithRetention(24*time.Hour))
	if err != nil {
		panic(err)
	}

	// The claim, the business write and the completion commit together:
	// Do runs placeOrder in a transaction of the store.
	out, err := c.Do(ctx, claim.Request{
		Scope:       durable.Scope{Tenant: "acme", Operation: "POST /orders", Key: "9b1f4c52-order-42"},
		Fingerprint: "v1:…",
	}, func(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) {
		if _, err := tx.Exec(ctx, "INSERT INTO orders (id) VALUES ($1)", op.ID); err != nil {
			return durable.Result{}, err
		}
		return durable.Result{StatusCode: 201, Body: []byte(`{"id":"ord_1"}`)}, nil
	})
	if err != nil {
		panic(err) // claim.ErrMismatch, claim.ErrUnavailable, ...
	}
	fmt.Println(out.Kind, out.Result.StatusCode) // executed, or replayed for a retry
}
