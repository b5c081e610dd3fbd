package claim_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/lua"
)

// faultyRedis is a redis.Scripter in front of a real client that injects
// faults around script calls. before runs before a script is sent; after
// sees its reply and may replace it (a reply lost after the script ran).
// Scripts are told apart by their keys: claim.lua has three
// (lease, gen, result), complete.lua two ending in the result key.
type faultyRedis struct {
	redis.Scripter
	before func(keys []string)
	after  func(ctx context.Context, keys []string, reply *redis.Cmd) *redis.Cmd
}

func (f *faultyRedis) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	if f.before != nil {
		f.before(keys)
	}
	return f.reply(ctx, keys, f.Scripter.Eval(ctx, script, keys, args...))
}

func (f *faultyRedis) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	if f.before != nil {
		f.before(keys)
	}
	return f.reply(ctx, keys, f.Scripter.EvalSha(ctx, sha, keys, args...))
}

func (f *faultyRedis) reply(ctx context.Context, keys []string, cmd *redis.Cmd) *redis.Cmd {
	if f.after == nil || cmd.Err() != nil {
		return cmd // a NOSCRIPT reply did not run the script
	}
	return f.after(ctx, keys, cmd)
}

func isCompleteScript(keys []string) bool {
	return len(keys) == 2 && strings.HasSuffix(keys[1], ":result")
}

// loadScripts loads the scripts into Redis, so that a wrapper sees each call
// once (no NOSCRIPT round trip first).
func (e *env) loadScripts() {
	e.t.Helper()
	s, err := lua.New(e.rdb, lua.Options{Prefix: e.prefix})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := s.Load(e.t.Context()); err != nil {
		e.t.Fatal(err)
	}
}

// assertCacheWithinRecord checks that Redis keeps the cached result of r no
// longer than the durable record lives: its PTTL, read first, is at most
// the record's remaining lifetime read after it.
func (e *env) assertCacheWithinRecord(r claim.Request) {
	e.t.Helper()
	ref := e.ref(r)
	pttl, err := e.rdb.PTTL(e.t.Context(), lua.KeysFor(e.prefix, ref).Result).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	rec, err := e.store.Get(e.t.Context(), ref)
	if err != nil {
		e.t.Fatal(err)
	}
	if pttl <= 0 {
		e.t.Fatalf("result not cached in Redis (PTTL %v)", pttl)
	}
	if pttl > rec.ExpiresIn {
		e.t.Fatalf("Redis caches the result for %v, but the durable record expires in %v: the copy outlives the record", pttl, rec.ExpiresIn)
	}
}

func TestClaimer_RedisCacheNeverOutlivesTheRecord(t *testing.T) {
	t.Parallel()
	// complete.lua calls that take 300ms to reach Redis (well within the
	// 1s per-call timeout): the TTL they carry starts when Redis runs them.
	const delay = 300 * time.Millisecond
	setupSlow := func(t *testing.T) (*env, *claim.Claimer[pgx.Tx]) {
		e := setup(t, withRedis)
		e.loadScripts()
		slow := &faultyRedis{Scripter: e.rdb, before: func(keys []string) {
			if isCompleteScript(keys) {
				time.Sleep(delay)
			}
		}}
		c, err := claim.New[pgx.Tx](e.store, claim.WithRedis(slow, lua.Options{Prefix: e.prefix, Timeout: time.Second}))
		if err != nil {
			t.Fatal(err)
		}
		return e, c
	}

	t.Run("RefillAfterAClaimReplaysFromTheDatabase", func(t *testing.T) {
		t.Parallel()
		e, slow := setupSlow(t)
		r := req("c-refill", "v1:a")
		out := mustClaim(t, e.c, r, claim.Acquired)
		if err := out.Lease.Complete(t.Context(), result("stored")); err != nil {
			t.Fatal(err)
		}
		e.flushRedis()
		if rep := mustClaim(t, slow, r, claim.Replayed); rep.FromCache {
			t.Fatal("replayed from a flushed cache")
		}
		e.assertCacheWithinRecord(r)
	})

	t.Run("RefillAfterDoReplaysFromTheDatabase", func(t *testing.T) {
		t.Parallel()
		e, slow := setupSlow(t)
		e.orders()
		r := req("c-refill-do", "v1:a")
		if out, err := e.c.Do(t.Context(), r, e.insertOrder); err != nil || out.Kind != claim.Executed {
			t.Fatalf("Do = %v, %v", out.Kind, err)
		}
		e.flushRedis()
		if out, err := slow.Do(t.Context(), r, e.insertOrder); err != nil || out.Kind != claim.Replayed {
			t.Fatalf("Do after flush = %v, %v; want Replayed", out.Kind, err)
		}
		e.assertCacheWithinRecord(r)
	})

	t.Run("LeaseComplete", func(t *testing.T) {
		t.Parallel()
		e, slow := setupSlow(t)
		r := req("c-complete", "v1:a")
		out := mustClaim(t, slow, r, claim.Acquired)
		if err := out.Lease.Complete(t.Context(), result("done")); err != nil {
			t.Fatal(err)
		}
		e.assertCacheWithinRecord(r)
	})

	t.Run("DoExecuted", func(t *testing.T) {
		t.Parallel()
		e, slow := setupSlow(t)
		e.orders()
		r := req("c-do", "v1:a")
		if out, err := slow.Do(t.Context(), r, e.insertOrder); err != nil || out.Kind != claim.Executed {
			t.Fatalf("Do = %v, %v", out.Kind, err)
		}
		e.assertCacheWithinRecord(r)
	})
}
