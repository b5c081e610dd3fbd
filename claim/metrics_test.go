package claim_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

func TestClaimer_Metrics(t *testing.T) {
	t.Parallel()
	mp := newRecorder()
	e := setup(t, withRedis, claim.WithMeterProvider(mp))
	ctx := t.Context()
	const secretKey = "acct-4242-secret-key"
	r := req(secretKey, "v1:a")
	out := mustClaim(t, e.c, r, claim.Acquired)
	if err := out.Lease.Complete(ctx, result("ok")); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, e.c, r, claim.Replayed)
	_, _ = e.c.Claim(ctx, req(secretKey, "v1:other"))
	_, _ = e.c.Do(ctx, req("k2", "v1:a"), func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
		return result("y"), nil
	})

	sums, err := mp.Collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for key := range sums {
		for _, leak := range []string{secretKey, "acme", "POST /orders"} {
			if strings.Contains(key, leak) {
				t.Fatalf("metric %q carries %q", key, leak)
			}
		}
	}
	for key, want := range map[string]int64{
		"oncekey.claims|outcome=acquired": 1,
		"oncekey.claims|outcome=replayed": 1,
		"oncekey.claims|outcome=mismatch": 1,
		"oncekey.claims|outcome=executed": 1,
		"oncekey.replays|source=redis":    1,
		"oncekey.mismatches":              1,
		"oncekey.records|state=completed": 2,
		"oncekey.redis.breaker":           0,
	} {
		if sums[key] != want {
			t.Errorf("%s = %d, want %d (all: %v)", key, sums[key], want, sums)
		}
	}
}
