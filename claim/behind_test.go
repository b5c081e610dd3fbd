package claim_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/lua"
)

// holdScript holds every call of one script (by its SHA1, alone or in a
// pipeline) until release is closed.
type holdScript struct {
	sha     string
	release chan struct{}
	held    chan struct{} // receives once per held call, when it is held
}

func (h holdScript) match(cmds ...redis.Cmder) bool {
	for _, c := range cmds {
		args := c.Args()
		if len(args) > 1 && strings.EqualFold(c.Name(), "evalsha") && args[1] == h.sha {
			return true
		}
	}
	return false
}

func (h holdScript) hold() {
	select {
	case h.held <- struct{}{}:
	default:
	}
	<-h.release
}

func (h holdScript) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h holdScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.match(cmd) {
			h.hold()
		}
		return next(ctx, cmd)
	}
}

func (h holdScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.match(cmds...) {
			h.hold()
		}
		return next(ctx, cmds)
	}
}

// TestDo_RedisCompletionAfterTheAnswer: Do answers once its commit is
// acknowledged; complete.lua is sent after. Held there, Redis keeps the
// caller's lease, and every retry meanwhile reads the record and replays
// (none is told "in progress"); released, Redis holds the result. Under
// TrustLease, where a young lease answers alone, Do's answer waits for
// complete.lua instead.
func TestDo_RedisCompletionAfterTheAnswer(t *testing.T) {
	t.Parallel()
	e := setup(t, withRedis)
	h := holdScript{sha: redis.NewScript(fastpath.Source("complete.lua")).Hash(), release: make(chan struct{}), held: make(chan struct{}, 1)}
	rc := redis.NewClient(e.rdb.Options())
	t.Cleanup(func() { rc.Close() })
	rc.AddHook(h)
	c, err := claim.New[pgx.Tx](e.store, claim.WithRedis(rc, lua.Options{Prefix: e.prefix, Timeout: 10 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			close(h.release)
		}
	}
	t.Cleanup(release)
	r := req("behind", "v1:b")
	done := make(chan error, 1)
	go func() {
		out, err := c.Do(t.Context(), r, func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
			return durable.Result{StatusCode: 201, Body: []byte("made")}, nil
		})
		if err == nil && out.Kind != claim.Executed {
			err = fmt.Errorf("Do = %v", out.Kind)
		}
		done <- err
	}()
	<-h.held // complete.lua was sent, and is held
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Do had not answered 10s after its complete.lua was held: its answer waits for Redis")
	}
	if st, err := fastpath.ReadStored(t.Context(), e.rdb, fastpath.KeysFor(e.prefix, e.ref(r))); err != nil || st.Kind != fastpath.StoredLease {
		t.Fatalf("Redis holds %+v, %v while complete.lua is held; want the caller's lease", st, err)
	}
	const n = 8
	kinds := make(chan claim.Kind, n)
	for range n {
		go func() {
			out, err := e.c.Claim(t.Context(), r)
			if err != nil {
				t.Error(err)
			}
			kinds <- out.Kind
		}()
	}
	for range n {
		if k := <-kinds; k != claim.Replayed {
			t.Fatalf("a retry while Redis's completion was held got %v, want Replayed", k)
		}
	}
	release()
	e.awaitRedisFinished(r)

	// TrustLease: the completion is on the caller's path.
	trusting, err := claim.New[pgx.Tx](e.store, claim.WithRedis(e.rdb, lua.Options{Prefix: e.prefix, Timeout: 10 * time.Second, TrustLease: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	r2 := req("behind-trusting", "v1:b")
	if out, err := trusting.Do(t.Context(), r2, func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
		return durable.Result{StatusCode: 201, Body: []byte("made")}, nil
	}); err != nil || out.Kind != claim.Executed {
		t.Fatalf("Do = %v, %v", out.Kind, err)
	}
	if st, err := fastpath.ReadStored(t.Context(), e.rdb, fastpath.KeysFor(e.prefix, e.ref(r2))); err != nil || st.Kind != fastpath.StoredResult {
		t.Fatalf("under TrustLease Redis holds %+v, %v when Do returns; want the result", st, err)
	}
}

// TestDo_RedisCompletionsBehindAreBounded: with one completion already
// running after its answer (the bound set to 1), the next Do sends its own
// on its caller's path: it does not answer while complete.lua is held, and
// once released both results are in Redis (none dropped).
func TestDo_RedisCompletionsBehindAreBounded(t *testing.T) {
	t.Parallel()
	e := setup(t, withRedis)
	h := holdScript{sha: redis.NewScript(fastpath.Source("complete.lua")).Hash(), release: make(chan struct{}), held: make(chan struct{}, 2)}
	rc := redis.NewClient(e.rdb.Options())
	t.Cleanup(func() { rc.Close() })
	rc.AddHook(h)
	c, err := claim.New[pgx.Tx](e.store, claim.WithRedis(rc, lua.Options{Prefix: e.prefix, Timeout: 10 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	claim.SetMaxBehind(c, 1)
	released := false
	release := func() {
		if !released {
			released = true
			close(h.release)
		}
	}
	t.Cleanup(release)
	do := func(r claim.Request) error {
		out, err := c.Do(t.Context(), r, func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
			return durable.Result{StatusCode: 201, Body: []byte("made")}, nil
		})
		if err == nil && out.Kind != claim.Executed {
			err = fmt.Errorf("Do = %v", out.Kind)
		}
		return err
	}
	first, second := req("behind-1", "v1:b"), req("behind-2", "v1:b")
	if err := do(first); err != nil { // answers; its completion is held behind
		t.Fatal(err)
	}
	<-h.held
	done := make(chan error, 1)
	go func() { done <- do(second) }()
	<-h.held // the second completion is held too: on its caller's path
	select {
	case err := <-done:
		t.Fatalf("the second Do answered (%v) while its completion was held: the bound of 1 let it run behind", err)
	default:
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e.awaitRedisFinished(first)
	e.awaitRedisFinished(second)
}
