package claim_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/lua"
	"github.com/oncekey/oncekey/testkit/redisproc"
)

// configCounter counts the CONFIG commands a client sends.
type configCounter struct{ n atomic.Int64 }

func (h *configCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *configCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.EqualFold(cmd.Name(), "config") {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *configCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestClaimer_EvictionPolicy checks that New sends nothing to Redis, and
// that the first claim Redis answers reads the maxmemory-policy once: a
// policy that may evict is logged and set on MetricEvictionPolicy.
func TestClaimer_EvictionPolicy(t *testing.T) {
	t.Parallel()
	srv := redisproc.Start(t, redisproc.Options{Args: []string{"--maxmemory-policy", "allkeys-lru"}})
	var dials atomic.Int64
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}})
	t.Cleanup(func() { rdb.Close() })
	configs := &configCounter{}
	rdb.AddHook(configs)
	e := setup(t, withoutRed)

	var buf syncBuf
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	mp := newRecorder()
	c, err := claim.New[pgx.Tx](e.store, claim.WithRedis(rdb, lua.Options{Prefix: "evict", Timeout: time.Second}),
		claim.WithLogger(logger), claim.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	if n := dials.Load(); n != 0 {
		t.Fatalf("New dialled Redis %d times, want none", n)
	}
	if got := evictionGauge(t, mp); got != 0 {
		t.Fatalf("%s = %d before any claim, want 0", "oncekey.redis.eviction", got)
	}
	mustClaim(t, c, req("k1", "v1:a"), claim.Acquired)
	mustClaim(t, c, req("k2", "v1:a"), claim.Acquired)
	if n := configs.n.Load(); n != 1 {
		t.Errorf("CONFIG sent %d times, want once", n)
	}
	if got := evictionGauge(t, mp); got != 1 {
		t.Errorf("%s = %d, want 1", "oncekey.redis.eviction", got)
	}
	if out := buf.String(); !strings.Contains(out, "maxmemory-policy is not noeviction") || !strings.Contains(out, "allkeys-lru") {
		t.Errorf("no eviction warning logged:\n%s", out)
	}
}

func evictionGauge(t *testing.T, mp *recorder) int64 {
	t.Helper()
	sums, err := mp.Collect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	v, ok := sums["oncekey.redis.eviction"]
	if !ok {
		t.Fatalf("oncekey.redis.eviction not reported (all: %v)", sums)
	}
	return v
}
