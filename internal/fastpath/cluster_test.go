package fastpath_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/testkit/redisproc"
)

// TestCluster runs every script on a real three-master Redis Cluster, for a
// few thousand scopes spread over all masters: no CROSSSLOT, no MOVED
// surprises, and the hash tag decides the slot.
func TestCluster(t *testing.T) {
	t.Parallel()
	addrs := redisproc.Cluster(t, 3)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { cc.Close() })
	ctx := context.Background()
	s, err := fastpath.New(cc, fastpath.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("EveryScriptOnThousandsOfScopes", func(t *testing.T) {
		const scopes = 3000
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(16)
		for i := range scopes {
			g.Go(func() error { return clusterRound(gctx, s, i) })
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		// Each finished scope leaves one key: its cached result.
		var mu sync.Mutex
		perMaster := map[string]int64{}
		err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			n, err := m.DBSize(ctx).Result()
			mu.Lock()
			perMaster[m.Options().Addr] = n
			mu.Unlock()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		var total int64
		for _, n := range perMaster {
			total += n
		}
		if len(perMaster) != 3 || total != scopes {
			t.Fatalf("keys per master = %v (total %d), want 3 masters and %d keys", perMaster, total, scopes)
		}
		for addr, n := range perMaster {
			if n < total/5 {
				t.Errorf("master %s holds %d of %d keys: scopes are not spread", addr, n, total)
			}
		}
		t.Logf("keys per master: %v", perMaster)
	})

	t.Run("HashTagDecidesSlot", func(t *testing.T) {
		slot := func(key string) int64 {
			n, err := cc.ClusterKeySlot(ctx, key).Result()
			if err != nil {
				t.Fatalf("CLUSTER KEYSLOT %q: %v", key, err)
			}
			return n
		}
		checkBraceSlots(t, slot)
		// The local rule the unit tests use agrees with the server.
		for _, key := range append([]string{"123456789", "foo", "somekey", "foo{hash_tag}", "foo{}{bar}", "{user1000}.following"}, braceKeys...) {
			if got, want := keySlot(key), slot(key); got != want {
				t.Errorf("keySlot(%q) = %d, CLUSTER KEYSLOT = %d", key, got, want)
			}
		}
	})

	t.Run("WatchWokenOnEveryMaster", func(t *testing.T) {
		// Sharded pub/sub: complete.lua's SPUBLISH goes to the key's own
		// shard, where the watch subscribed. Keys spread over the masters.
		for i := range 12 {
			ref := durable.Scope{Tenant: "t", Operation: "watch", Key: fmt.Sprint("w", i)}.Ref(nil)
			w, err := s.Watch(ctx, s.Keys(ref))
			if err != nil {
				t.Fatalf("Watch: %v", err)
			}
			if _, err := s.Complete(ctx, ref, fence.Token{Generation: 1}, "v1:f", durable.Completed, durable.Result{StatusCode: 200}, time.Hour); err != nil {
				t.Fatal(err)
			}
			select {
			case <-w.C:
			case <-time.After(5 * time.Second):
				t.Fatalf("key %d: the completion did not wake its watch", i)
			}
			w.Close()
		}
	})

	t.Run("CheckEvictionReportsAnyMasterThatEvicts", func(t *testing.T) {
		p, err := fastpath.CheckEviction(ctx, cc)
		if err != nil || p != fastpath.NoEviction {
			t.Fatalf("CheckEviction = %q, %v; want noeviction", p, err)
		}
		m := redis.NewClient(&redis.Options{Addr: addrs[1]})
		defer m.Close()
		if err := m.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
			t.Fatal(err)
		}
		defer m.ConfigSet(context.WithoutCancel(ctx), "maxmemory-policy", "noeviction")
		if p, err := fastpath.CheckEviction(ctx, cc); err != nil || p != "allkeys-lru" {
			t.Fatalf("CheckEviction = %q, %v; want allkeys-lru", p, err)
		}
	})
}

// clusterRound runs claim, busy, renew, syncgen, complete, replay, mismatch
// and release on scope i, checking each reply.
func clusterRound(ctx context.Context, s *fastpath.Scripts, i int) error {
	ref := durable.Scope{Tenant: fmt.Sprintf("tenant-%d", i%7), Operation: "POST /orders", Key: fmt.Sprintf("{key-%d}", i)}.Ref(nil)
	a, b := uuid.New(), uuid.New()
	fail := func(step string, got any, err error) error {
		return fmt.Errorf("scope %d: %s = %+v, %v", i, step, got, err)
	}
	r, err := s.Claim(ctx, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: a, Lease: lease})
	if err != nil || r.Status != fastpath.ClaimAcquired || r.Generation < 1_000_000_000_000 {
		return fail("claim", r, err) // the proposal is Redis's clock in ms - 59s
	}
	if r, err := s.Claim(ctx, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: b, Lease: lease}); err != nil || r.Status != fastpath.ClaimBusy {
		return fail("second claim", r, err)
	}
	tok := fence.Token{Generation: r.Generation + 1, Owner: a}
	if err := s.SyncGen(ctx, ref, tok); err != nil {
		return fail("syncgen", nil, err)
	}
	if held, err := s.Renew(ctx, ref, tok, lease); err != nil || !held {
		return fail("renew", held, err)
	}
	if cached, err := s.Complete(ctx, ref, tok, fp, durable.Completed, sampleResult(), time.Hour); err != nil || !cached {
		return fail("complete", cached, err)
	}
	if r, err := s.Claim(ctx, ref, fastpath.ClaimArgs{Fingerprint: fp, Owner: b, Lease: lease}); err != nil || r.Status != fastpath.ClaimCached || r.Cached.Generation != tok.Generation {
		return fail("replay", r, err)
	}
	if r, err := s.Claim(ctx, ref, fastpath.ClaimArgs{Fingerprint: otherFP, Owner: b, Lease: lease}); err != nil || r.Status != fastpath.ClaimMismatch {
		return fail("mismatch", r, err)
	}
	if held, err := s.Release(ctx, ref, tok); err != nil || held {
		return fail("release after complete", held, err)
	}
	return nil
}
