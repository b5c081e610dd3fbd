package fastpath_test

import (
	"context"
	"errors"
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

// proposalLagMS is how far claim.lua's proposal stays behind Redis's
// clock: a new lease proposes TIME in ms - proposalLagMS.
const proposalLagMS = 59_000

// redisTime reads the server's clock (TIME), the clock claim.lua reads.
func redisTime(t *testing.T, c redis.UniversalClient) time.Time {
	t.Helper()
	tm, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

// clockFloor is claim.lua's proposal for a Redis clock reading.
func clockFloor(tm time.Time) uint64 { return uint64(tm.UnixMilli()) - proposalLagMS }

// stored reads what k's record key holds, decoded by fastpath.ReadStored.
func stored(t *testing.T, c redis.UniversalClient, k fastpath.Keys) fastpath.Stored {
	t.Helper()
	st, err := fastpath.ReadStored(context.Background(), c, k)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// leaseValue is the record key's value for a lease, in the spec's layout.
func leaseValue(g uint64, length time.Duration, owner uuid.UUID, fingerprint string) string {
	return "L" + genOf(g) + ":" + strconv.FormatInt(length.Milliseconds(), 10) + ":" + owner.String() + fingerprint
}

// wantLease checks that st is owner's lease at generation g for
// fingerprint f, of length n, with a TTL in (0, n].
func wantLease(t *testing.T, st fastpath.Stored, owner uuid.UUID, g uint64, f string, n time.Duration) {
	t.Helper()
	if st.Kind != fastpath.StoredLease || st.Owner != owner.String() || st.Generation != g || st.Fingerprint != f || st.Lease != n {
		t.Errorf("record = %+v, want the lease of %s at generation %d for %q, %v long", st, owner, g, f, n)
		return
	}
	if st.TTL <= 0 || st.TTL > n {
		t.Errorf("lease TTL = %v, want in (0, %v]", st.TTL, n)
	}
}

// wantMarker checks that st is the finished marker of generation g for
// fingerprint f, with a TTL in (lo, hi].
func wantMarker(t *testing.T, st fastpath.Stored, g uint64, f string, lo, hi time.Duration) {
	t.Helper()
	if st.Kind != fastpath.StoredFinished || st.Generation != g || st.Fingerprint != f {
		t.Errorf("record = %+v, want the finished marker of generation %d for %q", st, g, f)
		return
	}
	if st.TTL <= lo || st.TTL > hi {
		t.Errorf("marker TTL = %v, want in (%v, %v]", st.TTL, lo, hi)
	}
}

// wantResult checks that st is the result of generation g for
// fingerprint f, with a TTL in (lo, hi].
func wantResult(t *testing.T, st fastpath.Stored, g uint64, f string, lo, hi time.Duration) {
	t.Helper()
	if st.Kind != fastpath.StoredResult || st.Generation != g || st.Fingerprint != f {
		t.Errorf("record = %+v, want the result of generation %d for %q", st, g, f)
		return
	}
	if st.TTL <= lo || st.TTL > hi {
		t.Errorf("result TTL = %v, want in (%v, %v]", st.TTL, lo, hi)
	}
}
