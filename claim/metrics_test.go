package claim_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

func TestClaimer_Metrics(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
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

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	sums := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					key := m.Name
					for _, kv := range p.Attributes.ToSlice() {
						key += "|" + string(kv.Key) + "=" + kv.Value.String()
					}
					sums[key] += p.Value
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					key := m.Name
					for _, kv := range p.Attributes.ToSlice() {
						key += "|" + string(kv.Key) + "=" + kv.Value.String()
					}
					sums[key] = p.Value
				}
			}
		}
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
