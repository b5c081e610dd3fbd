package fault

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// The suite's redis-server processes are testkit/redisproc's (started with
// redisproc.New, which needs no test); this file adds what the suite does
// with them.

// AdminClient returns a new client for the server at addr with no retries,
// for the suite's own administrative commands.
func AdminClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 2 * time.Second})
}

// ReplicaOf makes s a replica of addr (it drops its own data and loads the
// primary's) or, with addr "", a primary (REPLICAOF NO ONE).
func ReplicaOf(ctx context.Context, s Node, addr string) error {
	c := AdminClient(s.Addr())
	defer c.Close()
	var err error
	if addr == "" {
		err = c.Do(ctx, "REPLICAOF", "NO", "ONE").Err()
	} else {
		host, port, serr := net.SplitHostPort(addr)
		if serr != nil {
			return fmt.Errorf("%w: replicaof %q: %w", ErrRedisProcess, addr, serr)
		}
		err = c.Do(ctx, "REPLICAOF", host, port).Err()
	}
	if err != nil {
		return fmt.Errorf("%w: replicaof on %s: %w", ErrRedisProcess, s.Addr(), err)
	}
	return nil
}
