package fastpath_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// BenchmarkClaim compares, on the same client and the same real Redis, a
// Claim through the wrapper (breaker, per-call timeout, typed reply) with a
// bare EVALSHA of the same script, at 1 and 50 concurrent callers. Every
// iteration claims a new scope (the GET, TIME and SET branch).
//
//	go test -run '^$' -bench BenchmarkClaim -benchtime 20000x ./internal/fastpath/
func BenchmarkClaim(b *testing.B) {
	_, prefix := testenv.Redis(b) // deletes prefix:* at the end
	newClient := func(ctxTimeouts bool) *redis.Client {
		opt := testenv.RedisOptions(b)
		opt.PoolSize = 64
		opt.ContextTimeoutEnabled = ctxTimeouts
		c := redis.NewClient(opt)
		b.Cleanup(func() { c.Close() })
		return c
	}
	ctxClient, defaultClient := newClient(true), newClient(false)
	ctx := context.Background()
	sha, err := ctxClient.ScriptLoad(ctx, fastpath.ClaimSource()).Result()
	if err != nil {
		b.Fatal(err)
	}
	var seq atomic.Int64
	nextRef := func() durable.Ref {
		return durable.Scope{Tenant: "bench", Operation: "POST /orders", Key: strconv.FormatInt(seq.Add(1), 10)}.Ref(nil)
	}
	const leaseMS = 10_000

	wrapper := func(c *redis.Client) func(b *testing.B, owner uuid.UUID) {
		s, err := fastpath.New(c, fastpath.Options{Prefix: prefix, Timeout: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		return func(b *testing.B, owner uuid.UUID) {
			r, err := s.Claim(ctx, nextRef(), fastpath.ClaimArgs{Fingerprint: fp, Owner: owner, Lease: leaseMS * time.Millisecond})
			if err != nil || r.Status != fastpath.ClaimAcquired {
				b.Fatalf("Claim = %+v, %v", r, err)
			}
		}
	}
	bare := func(b *testing.B, owner uuid.UUID) {
		k := fastpath.KeysFor(prefix, nextRef())
		if err := ctxClient.EvalSha(ctx, sha, []string{k.Record}, fp, owner.String(), leaseMS).Err(); err != nil {
			b.Fatal(err)
		}
	}
	variants := []struct {
		name string
		run  func(b *testing.B, owner uuid.UUID)
	}{
		{"wrapper", wrapper(ctxClient)},
		{"wrapper-detached", wrapper(defaultClient)},
		{"bare-evalsha", bare},
	}
	for _, callers := range []int{1, 50} {
		for _, v := range variants {
			b.Run("callers="+strconv.Itoa(callers)+"/"+v.name, func(b *testing.B) {
				b.ReportAllocs()
				if callers == 1 {
					owner := uuid.New()
					for b.Loop() {
						v.run(b, owner)
					}
					return
				}
				// RunParallel starts parallelism × GOMAXPROCS goroutines.
				b.SetParallelism(max(1, (callers+runtime.GOMAXPROCS(0)-1)/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					owner := uuid.New()
					for pb.Next() {
						v.run(b, owner)
					}
				})
			})
		}
	}
}

// cannedScripter answers every script with the same reply, without a
// network: it isolates the wrapper's own cost.
type cannedScripter struct {
	redis.Scripter
	reply any
}

func (c cannedScripter) EvalSha(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetVal(c.reply)
	return cmd
}

// BenchmarkClaimOverhead is the wrapper's CPU cost per Claim on top of the
// client call (key names, breaker, timeout context, reply parsing), against
// a canned reply. The canned client is not a go-redis client, so this is
// the path of a wrapped client (redis.Script.Run); BenchmarkClaim measures
// a go-redis client's.
func BenchmarkClaimOverhead(b *testing.B) {
	ref := durable.Scope{Tenant: "bench", Operation: "POST /orders", Key: "k"}.Ref(nil)
	a := fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: time.Second}
	for _, direct := range []bool{true, false} {
		// A long timeout: this measures CPU, and 50 spinning callers on few
		// cores delay goroutines past 50ms.
		s, err := fastpath.New(cannedScripter{reply: []any{"acquired", "1"}}, fastpath.Options{Timeout: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		fastpath.SetDirect(s, direct)
		mode := "direct"
		if !direct {
			mode = "detached"
		}
		b.Run(mode+"/callers=1", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Claim(context.Background(), ref, a); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(mode+"/callers=50", func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(max(1, 50/runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := s.Claim(context.Background(), ref, a); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// pipeServer is an in-memory Redis that answers every command with the
// same RESP reply: a go-redis client dialled to it runs all of its own
// code (command building, writing, reading, parsing) with no kernel
// network in the way.
func pipeServer(b *testing.B, reply string) *redis.Client {
	c := redis.NewClient(&redis.Options{
		Protocol:              2,
		DisableIdentity:       true,
		PoolSize:              1,
		ContextTimeoutEnabled: true,
		Dialer: func(context.Context, string, string) (net.Conn, error) {
			client, server := net.Pipe()
			go serveCanned(server, reply)
			return client, nil
		},
	})
	b.Cleanup(func() { c.Close() })
	return c
}

// serveCanned reads RESP commands from conn and answers each with reply,
// until conn is closed.
func serveCanned(conn net.Conn, reply string) {
	defer conn.Close()
	r := bufio.NewReader(conn)
	line := func() (string, error) {
		s, err := r.ReadString('\n')
		return strings.TrimSuffix(s, "\r\n"), err
	}
	for {
		head, err := line()
		if err != nil {
			return
		}
		n, _ := strconv.Atoi(strings.TrimPrefix(head, "*"))
		for range n {
			l, err := line()
			if err != nil {
				return
			}
			size, _ := strconv.Atoi(strings.TrimPrefix(l, "$"))
			if _, err := r.Discard(size + 2); err != nil {
				return
			}
		}
		if _, err := io.WriteString(conn, reply); err != nil {
			return
		}
	}
}

// BenchmarkClaimClientCPU is the CPU of one Claim on a go-redis client,
// through the wrapper and as a bare EVALSHA of the same arguments, against
// an in-memory server: the client's whole work per call, steady enough to
// compare on a shared machine.
func BenchmarkClaimClientCPU(b *testing.B) {
	ref := durable.Scope{Tenant: "bench", Operation: "POST /orders", Key: "k"}.Ref(nil)
	a := fastpath.ClaimArgs{Fingerprint: fp, Owner: uuid.New(), Lease: 10 * time.Second}
	const acquired = "*2\r\n$8\r\nacquired\r\n$13\r\n1767225600000\r\n"
	ctx := context.Background()
	b.Run("wrapper", func(b *testing.B) {
		s, err := fastpath.New(pipeServer(b, acquired), fastpath.Options{Timeout: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Claim(ctx, ref, a); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bare-evalsha", func(b *testing.B) {
		c := pipeServer(b, acquired)
		sha := redis.NewScript(fastpath.ClaimSource()).Hash()
		b.ReportAllocs()
		for b.Loop() {
			k := fastpath.KeysFor("", ref)
			if err := c.EvalSha(ctx, sha, []string{k.Record}, a.Fingerprint, a.Owner.String(), a.Lease.Milliseconds()).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
