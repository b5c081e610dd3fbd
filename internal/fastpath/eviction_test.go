package fastpath_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/testkit/redisproc"
)

func TestCheckEviction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, policy := range []string{"noeviction", "allkeys-lru", "volatile-ttl"} {
		t.Run("Reports/"+policy, func(t *testing.T) {
			t.Parallel()
			srv := redisproc.Start(t, redisproc.Options{Args: []string{"--maxmemory-policy", policy}})
			c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
			t.Cleanup(func() { c.Close() })
			if got, err := fastpath.CheckEviction(ctx, c); err != nil || got != policy {
				t.Fatalf("CheckEviction = %q, %v; want %q", got, err, policy)
			}
		})
	}
	t.Run("RenamedConfigIsErrPolicyUnknown", func(t *testing.T) {
		t.Parallel()
		// Like a managed Redis that disables CONFIG.
		srv := redisproc.Start(t, redisproc.Options{Args: []string{"--rename-command", "CONFIG", ""}})
		c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		t.Cleanup(func() { c.Close() })
		if got, err := fastpath.CheckEviction(ctx, c); !errors.Is(err, fastpath.ErrPolicyUnknown) {
			t.Fatalf("CheckEviction = %q, %v; want ErrPolicyUnknown", got, err)
		}
	})
}
