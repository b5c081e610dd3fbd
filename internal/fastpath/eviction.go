package fastpath

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// NoEviction is the only maxmemory-policy under which Redis never deletes
// a key to make room.
const NoEviction = "noeviction"

// CheckEviction reads maxmemory-policy with CONFIG GET (on every master of
// a cluster client, returning the first policy found that is not
// noeviction). Callers log and count a policy other than [NoEviction]: Redis
// may then evict a lease or a cached result. That is not fatal, since
// the durable store arbitrates every claim, but the fast path is degraded.
// It returns an error matching [ErrPolicyUnknown] when the policy cannot be
// read (a managed Redis that disables CONFIG, a lost connection). ctx bounds
// the call; it does not go through the breaker.
func CheckEviction(ctx context.Context, c redis.UniversalClient) (policy string, err error) {
	if cc, ok := c.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			p, err := policyOf(ctx, m)
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			if policy == "" || policy == NoEviction {
				policy = p
			}
			return nil
		})
		if err != nil {
			return "", err
		}
		return policy, nil
	}
	return policyOf(ctx, c)
}

func policyOf(ctx context.Context, c redis.Cmdable) (string, error) {
	m, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrPolicyUnknown, err)
	}
	p, ok := m["maxmemory-policy"]
	if !ok || p == "" {
		return "", fmt.Errorf("%w: CONFIG GET returned no maxmemory-policy", ErrPolicyUnknown)
	}
	return p, nil
}

// EvictionPolicy runs [CheckEviction] on the scripts' client. It returns ""
// and no error when the client cannot send CONFIG GET (it is not a
// redis.UniversalClient, for example a wrapper of one). ctx bounds the call;
// it does not go through the breaker.
func (s *Scripts) EvictionPolicy(ctx context.Context) (policy string, err error) {
	u, ok := s.c.(redis.UniversalClient)
	if !ok {
		return "", nil
	}
	return CheckEviction(ctx, u)
}
