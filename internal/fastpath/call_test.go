package fastpath

import (
	"context"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/testkit/testenv"
)

// A call holds its arguments by pointer; what it sends must be what the
// values it was built from send.
func TestCall_ArgumentsAreTheValues(t *testing.T) {
	t.Parallel()
	owner := uuid.New()
	c := newCall("k1")
	c.str("fp")
	c.uuid(owner)
	c.uuid(uuid.Nil)
	c.int(-7)
	c.uint(1 << 62)
	if got, want := c.keys(), []string{"k1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("keys = %q, want %q", got, want)
	}
	want := []any{"fp", owner.String(), "", int64(-7), strconv.FormatUint(1<<62, 10)}
	if got := c.values(); !reflect.DeepEqual(got, want) {
		t.Errorf("values = %#v, want %#v", got, want)
	}
	if b, _ := c.owner.MarshalBinary(); string(b) != owner.String() {
		t.Errorf("owner text = %q, want %q", b, owner.String())
	}
}

// A script the server does not have yet is sent again with EVAL, on the
// go-redis client path as through redis.Script.Run, and then answers to
// EVALSHA.
func TestSend_FallsBackToEvalOnNoScript(t *testing.T) {
	t.Parallel()
	opt := testenv.RedisOptions(t)
	opt.ContextTimeoutEnabled = true
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	_, prefix := testenv.Redis(t)
	for name, c := range map[string]redis.Scripter{"Client": rdb, "Scripter": struct{ redis.Scripter }{rdb}} {
		t.Run(name, func(t *testing.T) {
			s, err := New(c, Options{Prefix: prefix, Timeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if (s.proc != nil) != (name == "Client") {
				t.Fatalf("proc = %v", s.proc)
			}
			// A source no server has seen: its SHA1 is new.
			src := "return {KEYS[1], ARGV[1], ARGV[2], ARGV[3]} -- " + uuid.NewString()
			rs := redis.NewScript(src)
			sc := &luaScript{Script: rs, sha: rs.Hash(), src: src}
			owner := uuid.New()
			for range 2 {
				call := newCall(prefix + ":k")
				call.str("fp")
				call.uuid(owner)
				call.uint(42)
				v, err := s.run(t.Context(), false, "test", sc, call)
				if err != nil {
					t.Fatal(err)
				}
				if want := []any{prefix + ":k", "fp", owner.String(), "42"}; !reflect.DeepEqual(v, want) {
					t.Fatalf("reply = %#v, want %#v", v, want)
				}
			}
			n, err := rdb.ScriptExists(context.Background(), sc.Hash()).Result()
			if err != nil || !n[0] {
				t.Fatalf("ScriptExists = %v, %v", n, err)
			}
		})
	}
}

// An open breaker answers before any argument is built.
func TestBreakerOpen_BuildsNothing(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { c.Close() })
	s, err := New(c, Options{Breaker: BreakerOptions{Failures: 1, CoolDown: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	s.breaker.Failure(false)
	k := s.KeysAt([32]byte{1})
	a := ClaimArgs{Fingerprint: "fp", Owner: uuid.New(), Lease: time.Second}
	ctx := t.Context()
	if n := testing.AllocsPerRun(100, func() {
		if _, err := s.ClaimKeys(ctx, k, a); err != ErrBreakerOpen {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("%v allocations per refused claim", n)
	}
}
