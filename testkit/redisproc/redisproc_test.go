package redisproc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/testkit/redisproc"
)

func client(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ReadTimeout: 200 * time.Millisecond, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestServer(t *testing.T) {
	t.Parallel()
	srv := redisproc.Start(t, redisproc.Options{Args: []string{"--maxmemory-policy", "allkeys-lru"}})
	ctx := context.Background()
	c := client(t, srv.Addr())

	t.Run("ArgsAreApplied", func(t *testing.T) {
		got, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		if err != nil || got["maxmemory-policy"] != "allkeys-lru" {
			t.Fatalf("maxmemory-policy = %v, %v", got, err)
		}
	})
	t.Run("PauseStallsAndResumeAnswers", func(t *testing.T) {
		if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := srv.Pause(); err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		err := c.Get(cctx, "k").Err()
		cancel()
		var ne net.Error
		if err == nil || !(errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded)) {
			t.Fatalf("GET on a paused server: %v, want a timeout", err)
		}
		if err := srv.Resume(); err != nil {
			t.Fatal(err)
		}
		if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
			t.Fatalf("GET after resume = %q, %v", got, err)
		}
	})
	t.Run("KillRefusesAndRestartComesBackEmpty", func(t *testing.T) {
		srv.Kill()
		if srv.Running() {
			t.Fatal("Running after Kill")
		}
		if _, err := net.DialTimeout("tcp", srv.Addr(), time.Second); err == nil {
			t.Fatal("dial succeeded after Kill")
		}
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		if !srv.Running() {
			t.Fatal("not Running after Restart")
		}
		n, err := c.DBSize(ctx).Result()
		if err != nil || n != 0 {
			t.Fatalf("DBSIZE after restart = %d, %v; want 0", n, err)
		}
	})
}

func TestPair(t *testing.T) {
	t.Parallel()
	primary, replica := redisproc.Pair(t)
	ctx := context.Background()
	p, r := client(t, primary.Addr()), client(t, replica.Addr())
	if err := p.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := p.Wait(ctx, 1, time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT = %d, %v", n, err)
	}
	if got, err := r.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("replica GET = %q, %v", got, err)
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	addrs := redisproc.Cluster(t, 3)
	ctx := context.Background()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { cc.Close() })
	for i := range 300 {
		if err := cc.Set(ctx, fmt.Sprintf("k%d", i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu      sync.Mutex
		masters []string
	)
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := m.DBSize(ctx).Result()
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("master %s holds no key", m.Options().Addr)
		}
		mu.Lock()
		masters = append(masters, m.Options().Addr)
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(masters) != 3 {
		t.Fatalf("masters = %v", masters)
	}
	info, _ := cc.ClusterInfo(ctx).Result()
	if !strings.Contains(info, "cluster_state:ok") {
		t.Fatalf("cluster info: %s", info)
	}
}
