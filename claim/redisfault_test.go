package claim_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
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

func isClaimScript(keys []string) bool { return len(keys) == 3 }

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
	pttl, err := e.rdb.PTTL(e.t.Context(), fastpath.KeysFor(e.prefix, ref).Result).Result()
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
	lost := &faultyRedis{Scripter: e.rdb, after: func(ctx context.Context, keys []string, reply *redis.Cmd) *redis.Cmd {
		if !isClaimScript(keys) {
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
	n, err := e.rdb.Exists(e.t.Context(), fastpath.KeysFor(e.prefix, e.ref(r)).Lease).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return n == 1
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
		lease, err := e.rdb.HGetAll(t.Context(), k.Lease).Result()
		if err != nil {
			t.Fatal(err)
		}
		if lease["o"] != tok.Owner.String() || lease["g"] != strconv.FormatUint(tok.Generation, 10) {
			t.Fatalf("Redis lease = %v, want owner %s at the durable generation %d", lease, tok.Owner, tok.Generation)
		}
		gen, err := e.rdb.Get(t.Context(), k.Gen).Uint64()
		if err != nil || gen < tok.Generation {
			t.Fatalf("Redis generation counter = %d, %v; want at least the durable %d", gen, err, tok.Generation)
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
