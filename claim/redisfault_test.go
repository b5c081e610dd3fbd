package claim_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"io/fs"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/lua"
)

// faultyRedis is a redis.Scripter in front of a real client that injects
// faults around script calls. before runs before a script is sent; after
// sees its reply and may replace it (a reply lost after the script ran).
// Both are given the script's file name ("claim.lua", "complete.lua", ...),
// found from its SHA1: every script has the record's one key.
type faultyRedis struct {
	redis.Scripter
	before func(script string)
	after  func(ctx context.Context, script string, reply *redis.Cmd) *redis.Cmd
}

func (f *faultyRedis) Eval(ctx context.Context, src string, keys []string, args ...any) *redis.Cmd {
	return f.run(ctx, shaOf(src), func() *redis.Cmd { return f.Scripter.Eval(ctx, src, keys, args...) })
}

func (f *faultyRedis) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return f.run(ctx, sha, func() *redis.Cmd { return f.Scripter.EvalSha(ctx, sha, keys, args...) })
}

func (f *faultyRedis) run(ctx context.Context, sha string, send func() *redis.Cmd) *redis.Cmd {
	name := scriptNames()[sha]
	if f.before != nil {
		f.before(name)
	}
	cmd := send()
	if f.after == nil || cmd.Err() != nil {
		return cmd // a NOSCRIPT reply did not run the script
	}
	return f.after(ctx, name, cmd)
}

func shaOf(src string) string {
	sum := sha1.Sum([]byte(src))
	return hex.EncodeToString(sum[:])
}

// scriptNames maps each embedded script's SHA1 to its file name.
var scriptNames = sync.OnceValue(func() map[string]string {
	m := map[string]string{}
	ents, _ := fs.ReadDir(lua.Sources, ".")
	for _, d := range ents {
		m[shaOf(fastpath.Source(d.Name()))] = d.Name()
	}
	return m
})

// loadScripts loads the scripts into Redis, so that a wrapper sees each call
// once (no NOSCRIPT round trip first).
func (e *env) loadScripts() {
	e.t.Helper()
	s, err := fastpath.New(e.rdb, fastpath.Options{Prefix: e.prefix})
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
	st, err := fastpath.ReadStored(e.t.Context(), e.rdb, fastpath.KeysFor(e.prefix, ref))
	if err != nil {
		e.t.Fatal(err)
	}
	pttl := st.TTL
	if st.Kind != fastpath.StoredResult {
		pttl = 0
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
		slow := &faultyRedis{Scripter: e.rdb, before: func(script string) {
			if script == "complete.lua" {
				time.Sleep(delay)
			}
		}}
		c, err := claim.New[pgx.Tx](e.store, claim.WithRedis(slow, lua.Options{Prefix: e.prefix, Timeout: time.Second}))
		if err != nil {
			t.Fatal(err)
		}
		return e, c
	}

	// Each case stores a result of r through slow (or refills slow's cache
	// from the database) while e.c is the Claimer without the delay.
	for _, tc := range []struct {
		name, key string
		store     func(t *testing.T, e *env, slow *claim.Claimer[pgx.Tx], r claim.Request)
	}{
		{"RefillAfterAClaimReplaysFromTheDatabase", "c-refill", func(t *testing.T, e *env, slow *claim.Claimer[pgx.Tx], r claim.Request) {
			out := mustClaim(t, e.c, r, claim.Acquired)
			if err := out.Lease.Complete(t.Context(), result("stored")); err != nil {
				t.Fatal(err)
			}
			e.flushRedis()
			if rep := mustClaim(t, slow, r, claim.Replayed); rep.FromCache {
				t.Fatal("replayed from a flushed cache")
			}
		}},
		{"RefillAfterDoReplaysFromTheDatabase", "c-refill-do", func(t *testing.T, e *env, slow *claim.Claimer[pgx.Tx], r claim.Request) {
			if out, err := e.c.Do(t.Context(), r, e.insertOrder); err != nil || out.Kind != claim.Executed {
				t.Fatalf("Do = %v, %v", out.Kind, err)
			}
			e.flushRedis()
			if out, err := slow.Do(t.Context(), r, e.insertOrder); err != nil || out.Kind != claim.Replayed {
				t.Fatalf("Do after flush = %v, %v; want Replayed", out.Kind, err)
			}
		}},
		{"LeaseComplete", "c-complete", func(t *testing.T, _ *env, slow *claim.Claimer[pgx.Tx], r claim.Request) {
			out := mustClaim(t, slow, r, claim.Acquired)
			if err := out.Lease.Complete(t.Context(), result("done")); err != nil {
				t.Fatal(err)
			}
		}},
		{"DoExecuted", "c-do", func(t *testing.T, e *env, slow *claim.Claimer[pgx.Tx], r claim.Request) {
			if out, err := slow.Do(t.Context(), r, e.insertOrder); err != nil || out.Kind != claim.Executed {
				t.Fatalf("Do = %v, %v", out.Kind, err)
			}
			e.awaitRedisFinished(r) // sent after Do's answer
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, slow := setupSlow(t)
			e.orders()
			r := req(tc.key, "v1:a")
			tc.store(t, e, slow, r)
			e.assertCacheWithinRecord(r)
		})
	}
}

// lostClaimReplies returns a Claimer on store whose claim.lua calls run on
// Redis but whose replies are lost: the client sees a read timeout.
func (e *env) lostClaimReplies(store storeapi.Store[pgx.Tx]) *claim.Claimer[pgx.Tx] {
	e.t.Helper()
	e.loadScripts()
	lost := &faultyRedis{Scripter: e.rdb, after: func(ctx context.Context, script string, reply *redis.Cmd) *redis.Cmd {
		if script != "claim.lua" {
			return reply
		}
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded})
		return cmd
	}}
	c, err := claim.New[pgx.Tx](store, claim.WithRedis(lost, lua.Options{
		Prefix: e.prefix, Timeout: time.Second, BreakerFailures: 1000,
	}))
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// setupLostClaimReplies returns an env with Redis and a Claimer on its
// store whose claim.lua replies are lost.
func setupLostClaimReplies(t *testing.T) (*env, *claim.Claimer[pgx.Tx]) {
	t.Helper()
	e := setup(t, withRedis)
	return e, e.lostClaimReplies(e.store)
}

func (e *env) redisLeaseExists(r claim.Request) bool {
	e.t.Helper()
	st, err := fastpath.ReadStored(e.t.Context(), e.rdb, fastpath.KeysFor(e.prefix, e.ref(r)))
	if err != nil {
		e.t.Fatal(err)
	}
	return st.Kind == fastpath.StoredLease
}

func TestClaimer_LostRedisClaimReply(t *testing.T) {
	t.Parallel()

	t.Run("NotAcquiredDurablyLeavesNoRedisLease", func(t *testing.T) {
		t.Parallel()
		e, lost := setupLostClaimReplies(t)
		r := req("l-held", "v1:a")
		first := mustClaim(t, e.c, r, claim.Acquired)
		e.flushRedis() // Redis lost the first worker's lease
		// The claim script runs and takes a Redis lease, its reply is
		// lost; the database says another worker holds the key.
		mustClaim(t, lost, r, claim.InProgress)
		if e.redisLeaseExists(r) {
			t.Fatal("a Redis lease of the claim that did not acquire durably was left behind")
		}
		// The first worker states that nothing happened: the key is free,
		// and no stale Redis lease answers "in progress" for a lease.
		if err := first.Lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		mustClaim(t, e.c, r, claim.Acquired)
	})

	t.Run("NotAcquiredByDoLeavesNoRedisLease", func(t *testing.T) {
		t.Parallel()
		e, lost := setupLostClaimReplies(t)
		e.orders()
		r := req("l-held-do", "v1:a")
		first := mustClaim(t, e.c, r, claim.Acquired)
		e.flushRedis()
		out, err := lost.Do(t.Context(), r, func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
			t.Error("Do ran fn while another worker held the key")
			return durable.Result{}, nil
		})
		if err != nil || out.Kind != claim.InProgress {
			t.Fatalf("Do = %v, %v; want InProgress", out.Kind, err)
		}
		if e.redisLeaseExists(r) {
			t.Fatal("a Redis lease of the Do that did not acquire durably was left behind")
		}
		if err := first.Lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if out, err := e.c.Do(t.Context(), r, e.insertOrder); err != nil || out.Kind != claim.Executed {
			t.Fatalf("Do after the release = %v, %v; want Executed", out.Kind, err)
		}
	})

	t.Run("ReplayLeavesNoRedisLease", func(t *testing.T) {
		t.Parallel()
		e, lost := setupLostClaimReplies(t)
		r := req("l-done", "v1:a")
		first := mustClaim(t, e.c, r, claim.Acquired)
		if err := first.Lease.Complete(t.Context(), result("done")); err != nil {
			t.Fatal(err)
		}
		e.flushRedis()
		mustClaim(t, lost, r, claim.Replayed)
		if e.redisLeaseExists(r) {
			t.Fatal("a Redis lease of a claim answered by a replay was left behind")
		}
	})

	t.Run("AcquiredSyncsTheRedisLeaseToTheDurableToken", func(t *testing.T) {
		t.Parallel()
		e, lost := setupLostClaimReplies(t)
		r := req("l-acquired", "v1:a")
		// History Redis has forgotten: a released generation.
		prev := mustClaim(t, e.c, r, claim.Acquired)
		if err := prev.Lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		e.flushRedis()
		out := mustClaim(t, lost, r, claim.Acquired)
		tok := out.Lease.Token()
		if tok.Generation <= prev.Lease.Token().Generation {
			t.Fatalf("generation %v not newer than %v", tok, prev.Lease.Token())
		}
		k := fastpath.KeysFor(e.prefix, e.ref(r))
		st, err := fastpath.ReadStored(t.Context(), e.rdb, k)
		if err != nil {
			t.Fatal(err)
		}
		if st.Kind != fastpath.StoredLease || st.Owner != tok.Owner.String() || st.Generation != tok.Generation {
			t.Fatalf("Redis holds %+v, want owner %s's lease at the durable generation %d", st, tok.Owner, tok.Generation)
		}
		mustClaim(t, e.c, r, claim.InProgress)
		if err := out.Lease.Complete(t.Context(), result("ok")); err != nil {
			t.Fatal(err)
		}
		if rep := mustClaim(t, e.c, r, claim.Replayed); !rep.FromCache {
			t.Fatal("the completed result was not cached")
		}
	})

	t.Run("StoreDownLeavesNoRedisLease", func(t *testing.T) {
		t.Parallel()
		e := setup(t, withRedis)
		lost := e.lostClaimReplies(e.downStore().(storeapi.Store[pgx.Tx]))
		r := req("l-down", "v1:a")
		if _, err := lost.Claim(t.Context(), r); !errors.Is(err, claim.ErrUnavailable) {
			t.Fatalf("Claim err = %v, want ErrUnavailable", err)
		}
		if e.redisLeaseExists(r) {
			t.Fatal("a Redis lease of a claim that failed closed was left behind")
		}
		mustClaim(t, e.c, r, claim.Acquired)
	})
}
