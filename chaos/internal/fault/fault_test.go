package fault_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/testkit/redisproc"
	"github.com/oncekey/oncekey/testkit/testenv"
)

func redisBinary(t *testing.T) {
	t.Helper()
	if _, err := redisproc.Binary(); err != nil {
		if testenv.CI() {
			t.Fatalf("%v [CI=true: a missing binary fails the test]", err)
		}
		t.Skip(err)
	}
}

func client(t *testing.T, addr string, tweak func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true, ReadTimeout: 200 * time.Millisecond, DialTimeout: 200 * time.Millisecond}
	if tweak != nil {
		tweak(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

func TestProxy(t *testing.T) {
	opt := testenv.RedisOptions(t)
	ctx := t.Context()
	px, err := fault.NewProxy(opt.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Close)
	c := client(t, px.Addr(), func(o *redis.Options) { o.Username, o.Password, o.DB = opt.Username, opt.Password, opt.DB })
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}

	t.Run("BlackholeAnswersNothing", func(t *testing.T) {
		undo, err := px.Blackhole()
		if err != nil {
			t.Fatal(err)
		}
		err = c.Ping(ctx).Err()
		undo()
		if err == nil {
			t.Fatal("PING answered through a blackhole")
		}
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("after the blackhole: %v", err)
		}
	})
	t.Run("CutAfterLosesTheReply", func(t *testing.T) {
		undo, err := px.CutAfter(3)
		if err != nil {
			t.Fatal(err)
		}
		err = c.Echo(ctx, strings.Repeat("x", 100)).Err()
		undo()
		if err == nil {
			t.Fatal("a 100-byte reply came through a cut after 3 bytes")
		}
	})
	t.Run("CutAllClosesConnections", func(t *testing.T) {
		cn := c.Conn()
		defer cn.Close()
		if err := cn.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := px.CutAll(); err != nil {
			t.Fatal(err)
		}
		if err := cn.Ping(ctx).Err(); err == nil {
			t.Fatal("a connection survived CutAll")
		}
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("a new connection after CutAll: %v", err)
		}
	})
	if px.Faults() < 3 {
		t.Fatalf("Faults = %d, want at least 3", px.Faults())
	}
}

func TestScriptDelay_MakesGoRedisResendScripts(t *testing.T) {
	opt := testenv.RedisOptions(t)
	ctx := t.Context()
	px, err := fault.NewScriptDelay(opt.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Close)
	sends := &fault.ScriptSends{}
	c := client(t, px.Addr(), func(o *redis.Options) {
		o.Username, o.Password, o.DB = opt.Username, opt.Password, opt.DB
		o.MaxRetries, o.ReadTimeout, o.Dialer = 3, 50*time.Millisecond, sends.Dialer(nil)
		o.MinRetryBackoff, o.MaxRetryBackoff = time.Millisecond, 5*time.Millisecond
	})
	c.AddHook(sends.Hook())
	script := redis.NewScript(`return 1`)
	if err := script.Run(ctx, c, nil).Err(); err != nil {
		t.Fatal(err)
	}
	px.Set(150 * time.Millisecond)
	err = script.Run(ctx, c, nil).Err()
	px.Set(0)
	if err == nil {
		t.Fatal("a script reply delayed past the read timeout came back in time")
	}
	if sends.Resent() < 1 || px.Delayed() < 2 {
		t.Fatalf("calls %d, sends %d, delayed %d: want the script re-sent", sends.Calls(), sends.Sends(), px.Delayed())
	}
}

func TestPair(t *testing.T) {
	redisBinary(t)
	ctx := t.Context()
	t.Run("FailoverLosesUnreplicatedWrites", func(t *testing.T) {
		p, err := fault.StartPair(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		c := client(t, p.Primary().Addr(), nil)
		c.Set(ctx, "before", "1", 0)
		replicated(t, p, "before")
		if err := p.PauseReplication(); err != nil {
			t.Fatal(err)
		}
		c.Set(ctx, "during", "1", 0)
		np, _, err := p.Failover(ctx)
		if err != nil {
			t.Fatal(err)
		}
		nc := client(t, np.Addr(), nil)
		if n := nc.Exists(ctx, "before").Val(); n != 1 {
			t.Errorf("a replicated write is missing after the failover")
		}
		if n := nc.Exists(ctx, "during").Val(); n != 0 {
			t.Errorf("a write made while replication was paused survived the failover")
		}
		if p.Failovers() != 1 || p.Primary() != np {
			t.Errorf("Failovers = %d, primary %s, want 1 and %s", p.Failovers(), p.Primary().Addr(), np.Addr())
		}
	})
	t.Run("SplitBrainHasTwoPrimaries", func(t *testing.T) {
		p, err := fault.StartPair(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		oldC := client(t, p.Primary().Addr(), nil)
		oldC.Set(ctx, "gen", 5, 0)
		replicated(t, p, "gen")
		np, heal, err := p.SplitBrain(ctx)
		if err != nil {
			t.Fatal(err)
		}
		newC := client(t, np.Addr(), nil)
		a, errA := oldC.Incr(ctx, "gen").Result()
		b, errB := newC.Incr(ctx, "gen").Result()
		if errA != nil || errB != nil || a != 6 || b != 6 {
			t.Fatalf("INCR on both sides = %d (%v), %d (%v); want 6 twice", a, errA, b, errB)
		}
		if err := heal(ctx); err != nil {
			t.Fatal(err)
		}
		if p.Primary() != np || p.SplitBrains() != 1 {
			t.Fatalf("after heal the primary is %s, want %s", p.Primary().Addr(), np.Addr())
		}
	})
}

// replicated waits (bounded) until the replica has key.
func replicated(t *testing.T, p *fault.Pair, key string) {
	t.Helper()
	rc := client(t, p.Replica().Addr(), nil)
	for i := 0; i < 250; i++ {
		if rc.Exists(t.Context(), key).Val() == 1 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the replica never received %q", key)
}

func TestEviction(t *testing.T) {
	ctx := t.Context()
	srv := redisproc.Start(t, redisproc.Options{Args: []string{"--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"}})
	c := client(t, srv.Addr(), nil)
	if _, err := fault.Fill(ctx, c, "f", 2000, 2048); err != nil {
		t.Fatal(err)
	}
	if n, err := fault.EvictedKeys(ctx, c); err != nil || n == 0 {
		t.Fatalf("EvictedKeys = %d, %v; want evictions", n, err)
	}
}

func TestVanishLease(t *testing.T) {
	c, prefix := testenv.Redis(t)
	ctx := t.Context()
	ref := durable.Scope{Tenant: "t", Operation: "o", Key: "k"}.Ref(nil)
	key := fastpath.KeysFor(prefix, ref).Record
	owner := "11111111-2222-3333-4444-555555555555"
	if err := c.Set(ctx, key, "L7:30000:"+owner+"fp", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	ok, err := fault.VanishLease(ctx, c, prefix, ref)
	if err != nil || !ok {
		t.Fatalf("VanishLease = %v, %v", ok, err)
	}
	if ttl := c.PTTL(ctx, key).Val(); ttl > time.Millisecond {
		t.Fatalf("lease PTTL after VanishLease = %v", ttl)
	}
	// A cached result is not a lease: left alone.
	if err := c.Set(ctx, key, "R7:2:fpblob", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := fault.VanishLease(ctx, c, prefix, ref); err != nil || ok {
		t.Fatalf("VanishLease on a result = %v, %v; want false", ok, err)
	}
	if ttl := c.PTTL(ctx, key).Val(); ttl < time.Minute {
		t.Fatalf("result PTTL after VanishLease = %v, want untouched", ttl)
	}
}

func TestSkewedClock(t *testing.T) {
	c := fault.NewSkewedClock(-5*time.Hour, time.Minute, 1)
	for i := 0; i < 20; i++ {
		off := time.Until(c.Now())
		if off > -5*time.Hour+2*time.Minute || off < -5*time.Hour-2*time.Minute {
			t.Fatalf("reading %d is off by %v, want -5h ± 1m", i, off)
		}
	}
	if c.Reads() != 20 {
		t.Fatalf("Reads = %d", c.Reads())
	}
}

func TestTerminate(t *testing.T) {
	s := testenv.Postgres(t)
	ctx := t.Context()
	if _, err := s.Pool.Exec(ctx, `CREATE TABLE t (n int)`); err != nil {
		t.Fatal(err)
	}
	t.Run("TerminateRollsTheTransactionBack", func(t *testing.T) {
		tx, err := s.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		tx.Exec(ctx, `INSERT INTO t VALUES (1)`)
		pid, err := fault.BackendPID(ctx, tx)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := fault.Terminate(ctx, s.Pool, pid); err != nil || !ok {
			t.Fatalf("Terminate = %v, %v", ok, err)
		}
		if err := tx.Commit(ctx); err == nil {
			t.Fatal("a terminated transaction committed")
		}
		var n int
		s.Pool.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n)
		if n != 0 {
			t.Fatalf("%d rows after a terminated transaction", n)
		}
	})
}

func TestDownstream(t *testing.T) {
	ctx := t.Context()
	var applied atomic.Int64
	d, err := fault.NewDownstream(fault.DownstreamOptions{
		Apply: func(context.Context, string, fence.Token) (string, error) {
			return "e" + strconv.FormatInt(applied.Add(1), 10), nil
		},
		Plan: func(op string, n int) (fault.Behavior, time.Duration) {
			switch {
			case op == "fail" && n == 0:
				return fault.FailBefore, 0
			case op == "timeout" && n == 0:
				return fault.TimeoutAfter, 0
			}
			return fault.Succeed, 0
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	hc := &http.Client{}
	a, b := uuid.New(), uuid.New()
	status := func(err error) int {
		var de *fault.DownstreamError
		if errors.As(err, &de) {
			return de.Status
		}
		return 0
	}

	id1, err := fault.CallDownstream(ctx, hc, d.URL(), "op", fence.Token{Generation: 2, Owner: a})
	if err != nil {
		t.Fatal(err)
	}
	if id2, err := fault.CallDownstream(ctx, hc, d.URL(), "op", fence.Token{Generation: 3, Owner: b}); err != nil || id2 != id1 {
		t.Fatalf("a repeated call: %q, %v; want the same effect %q", id2, err, id1)
	}
	if _, err := fault.CallDownstream(ctx, hc, d.URL(), "op", fence.Token{Generation: 2, Owner: a}); status(err) != 409 {
		t.Fatalf("a stale token: %v, want 409", err)
	}
	if _, err := fault.CallDownstream(ctx, hc, d.URL(), "op", fence.Token{Generation: 3, Owner: a}); status(err) != 409 || len(d.Conflicts()) != 1 {
		t.Fatalf("generation 3 from a second owner: %v, conflicts %v", err, d.Conflicts())
	}
	if _, err := fault.CallDownstream(ctx, hc, d.URL(), "fail", fence.Token{Generation: 1, Owner: a}); status(err) != 503 {
		t.Fatalf("FailBefore: %v, want 503", err)
	}
	if _, ok := d.Lookup("fail"); ok {
		t.Fatal("FailBefore applied the effect")
	}
	tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = fault.CallDownstream(tctx, hc, d.URL(), "timeout", fence.Token{Generation: 1, Owner: a})
	cancel()
	if err == nil || status(err) != 0 {
		t.Fatalf("TimeoutAfter: %v, want no answer", err)
	}
	if id, err := fault.LookupDownstream(ctx, hc, d.URL(), "timeout"); err != nil || id == "" {
		t.Fatalf("TimeoutAfter did not apply the effect: %q, %v", id, err)
	}
	if s := d.Stats(); s.Applied != 2 || s.Failures != 1 || s.Timeouts != 1 || s.Stale != 1 {
		t.Fatalf("stats = %+v", s)
	}
}
