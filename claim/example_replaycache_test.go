package claim_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/lua"
)

// WithReplayCache answers the retries of a finished key from process
// memory. The result this Claimer committed is kept at once, so its
// retries ask no server; another process's result is kept at its first
// replay from Redis or the database.
func ExampleWithReplayCache() {
	store, _, rdb, prefix, cleanup := exampleEnv()
	defer cleanup()
	ctx := context.Background()

	c, err := claim.New[pgx.Tx](store,
		claim.WithRedis(rdb, lua.Options{Prefix: prefix}),
		claim.WithReplayCache(16<<20), // 16 MiB of finished results
	)
	if err != nil {
		panic(err)
	}
	req := claim.Request{
		Scope:       durable.Scope{Tenant: "tenant-42", Operation: "POST /payments", Key: "2c9d1f7e-7b1a-4a47-9d0e-4c1b0f6e2a11"},
		Fingerprint: "v1:request-fingerprint-from-package-canon",
	}
	pay := func(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) {
		return durable.Result{StatusCode: 201, Body: []byte(`{"id":"pay_1"}`)}, nil
	}
	for range 3 {
		out, err := c.Do(ctx, req, pay)
		if err != nil {
			panic(err)
		}
		fmt.Println(out.Kind, out.FromCache, string(out.Result.Body))
	}
	// Output:
	// executed false {"id":"pay_1"}
	// replayed true {"id":"pay_1"}
	// replayed true {"id":"pay_1"}
}
