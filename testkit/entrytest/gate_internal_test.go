package entrytest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/testkit/testenv"
)

// The gate takes Redis down for the client that dials through it, and for
// no other: its connections fail, its dials are refused and counted; once
// it is up again the client reaches Redis again.
func TestRedisGate(t *testing.T) {
	direct, _ := testenv.Redis(t)
	g := &redisGate{conns: map[*gatedConn]struct{}{}}
	opt := testenv.RedisOptions(t)
	opt.Dialer = g.dialer(redis.NewDialer(opt))
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	ping := func(c *redis.Client) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return c.Ping(ctx).Err()
	}
	if err := ping(c); err != nil {
		t.Fatalf("Ping through the gate, up: %v", err)
	}
	g.setDown(true)
	if err := ping(c); err == nil {
		t.Fatal("Ping through the gate, down: succeeded")
	}
	if g.refusals() == 0 {
		t.Fatal("the gate is down and refused no dial")
	}
	if err := ping(direct); err != nil {
		t.Fatalf("Ping beside the gate, down: %v", err)
	}
	g.setDown(false)
	deadline := time.Now().Add(10 * time.Second)
	for err := ping(c); err != nil; err = ping(c) {
		if time.Now().After(deadline) {
			t.Fatalf("Ping through the gate, up again: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
