package fastpath_test

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// env is the Redis server the script tests run on.
type env struct {
	raw    redis.UniversalClient // for inspecting keys
	prefix string
	// expire ends key's TTL now: PEXPIRE 1, then wait, the effect of a
	// clock jump.
	expire func(t *testing.T, key string)
}

// backends are the servers every script test runs on.
var backends = []struct {
	name string
	new  func(t *testing.T) env
}{
	{"Redis", realEnv},
}

func realEnv(t *testing.T) env {
	c, prefix := testenv.Redis(t)
	return env{raw: c, prefix: prefix, expire: func(t *testing.T, key string) {
		t.Helper()
		ctx := context.Background()
		if err := c.PExpire(ctx, key, time.Millisecond).Err(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for c.Exists(ctx, key).Val() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("expire %s: still there after 5s", key)
			}
			time.Sleep(time.Millisecond)
		}
	}}
}

// scripts builds Scripts on e with a generous timeout: these tests are about
// the scripts, not about timing.
func (e env) scripts(t *testing.T, opts fastpath.Options) *fastpath.Scripts {
	t.Helper()
	opts.Prefix = e.prefix
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	s, err := fastpath.New(e.raw, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func refFor(t *testing.T, key string) durable.Ref {
	return durable.Scope{Tenant: "tenant-1", Operation: "POST /orders", Key: key + "/" + t.Name()}.Ref(nil)
}

func get(t *testing.T, c redis.UniversalClient, key string) string {
	t.Helper()
	v, err := c.Get(context.Background(), key).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return v
}

func hget(t *testing.T, c redis.UniversalClient, key, field string) string {
	t.Helper()
	v, err := c.HGet(context.Background(), key, field).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return v
}

func exists(t *testing.T, c redis.UniversalClient, key string) bool {
	t.Helper()
	n, err := c.Exists(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

func pttl(t *testing.T, c redis.UniversalClient, key string) time.Duration {
	t.Helper()
	d, err := c.PTTL(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func genOf(g uint64) string { return strconv.FormatUint(g, 10) }

// countingScripter counts the script commands sent through it.
type countingScripter struct {
	redis.Scripter
	n atomic.Int64
}

func (c *countingScripter) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	c.n.Add(1)
	return c.Scripter.Eval(ctx, script, keys, args...)
}

func (c *countingScripter) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	c.n.Add(1)
	return c.Scripter.EvalSha(ctx, sha, keys, args...)
}

// owners returns n fresh owner identities.
func owners(n int) []uuid.UUID {
	o := make([]uuid.UUID, n)
	for i := range o {
		o[i] = uuid.New()
	}
	return o
}

// proposalLagMS is how far claim.lua's clock term stays behind Redis's
// clock: it proposes max(counter + 1, TIME in ms - proposalLagMS).
const proposalLagMS = 59_000

// decimal is a canonical decimal generation, as the scripts store it.
var decimal = regexp.MustCompile(`^[1-9][0-9]*$`)

// redisTime reads the server's clock (TIME), the clock claim.lua reads.
func redisTime(t *testing.T, c redis.UniversalClient) time.Time {
	t.Helper()
	tm, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

// clockFloor is claim.lua's clock term for a Redis clock reading.
func clockFloor(tm time.Time) uint64 { return uint64(tm.UnixMilli()) - proposalLagMS }
