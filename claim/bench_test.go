package claim_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/lua"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// The claim path's benchmarks, on the real servers, one caller at a time:
// allocations, SQL statements and Redis commands per operation. The
// concurrent figures, side by side with their floors, come from the bench
// tool (go run ./bench).
//
//	go test -run '^$' -bench BenchmarkClaimer -benchtime 2000x ./claim/

// benchCmds counts Redis commands.
type benchCmds struct{ n atomic.Int64 }

func (c *benchCmds) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *benchCmds) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}
func (c *benchCmds) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

type benchFixture struct {
	c     *claim.Claimer[pgx.Tx]
	stmts *testenv.StatementCounter // round trips to PostgreSQL: BEGIN, COMMIT and each batch included
	cmds  *benchCmds
}

// newBenchFixture returns a Claimer on a fresh schema; with Redis when
// luaOpts is not nil.
func newBenchFixture(b *testing.B, luaOpts *lua.Options) *benchFixture {
	b.Helper()
	s := testenv.Postgres(b)
	cfg := poolConfig(b, s.URL)
	if err := postgres.ConfigurePool(cfg); err != nil {
		b.Fatal(err)
	}
	f := &benchFixture{stmts: &testenv.StatementCounter{}, cmds: &benchCmds{}}
	cfg.ConnConfig.Tracer = f.stmts
	_, st := migratedStore(b, cfg, s.Name)
	var opts []claim.Option
	if luaOpts != nil {
		opt := testenv.RedisOptions(b)
		opt.ContextTimeoutEnabled = true
		rdb := redis.NewClient(opt)
		b.Cleanup(func() { rdb.Close() })
		_, prefix := testenv.Redis(b) // deletes prefix:* at the end
		lo := *luaOpts
		lo.Prefix = prefix
		rdb.AddHook(f.cmds)
		opts = append(opts, claim.WithRedis(rdb, lo))
	}
	c, err := claim.New[pgx.Tx](st, opts...)
	if err != nil {
		b.Fatal(err)
	}
	f.c = c
	return f
}

var benchResult = durable.Result{StatusCode: 201, Headers: map[string][]string{"Content-Type": {"application/json"}},
	Body: []byte(`{"id":"ord_1"}`), Version: 1}

const benchFP = "v1:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

func benchReq(key string) claim.Request {
	return claim.Request{Scope: durable.Scope{Tenant: "bench", Operation: "POST /orders", Key: key}, Fingerprint: benchFP}
}

func emptyWrite(context.Context, pgx.Tx, claim.Op) (durable.Result, error) { return benchResult, nil }

// loop runs op b.N times and reports statements and commands per operation,
// and the CPU time this process spent per operation (all its threads, user
// and system): the client's work, which on a shared machine is steadier
// than the wall time of a round trip to the servers.
func (f *benchFixture) loop(b *testing.B, op func(i int)) {
	b.ReportAllocs()
	s0, c0 := f.stmts.Count(), f.cmds.n.Load()
	cpu0 := processCPU(b)
	i := 0
	for b.Loop() {
		op(i)
		i++
	}
	cpu := processCPU(b) - cpu0 // 0 where the platform does not tell
	b.ReportMetric(float64(f.stmts.Count()-s0)/float64(i), "stmts/op")
	b.ReportMetric(float64(f.cmds.n.Load()-c0)/float64(i), "redis/op")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(i), "cpu-ns/op")
}

var benchModes = []struct {
	name string
	lua  *lua.Options
}{{"WithRedis", &lua.Options{}}, {"WithoutRedis", nil}}

// BenchmarkClaimer_ClaimComplete: a fresh key claimed, then its lease
// completed (workflow mode: two durable statements, each its own
// transaction).
func BenchmarkClaimer_ClaimComplete(b *testing.B) {
	for _, m := range benchModes {
		b.Run(m.name, func(b *testing.B) {
			f := newBenchFixture(b, m.lua)
			ctx, prefix := context.Background(), testenv.Name("k")
			f.loop(b, func(i int) {
				out, err := f.c.Claim(ctx, benchReq(prefix+strconv.Itoa(i)))
				if err != nil || out.Kind != claim.Acquired {
					b.Fatalf("Claim = %v, %v", out.Kind, err)
				}
				if err := out.Lease.Complete(ctx, benchResult); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}

// BenchmarkClaimer_DoFresh: a fresh key through Do with an empty business
// write (claim and completion in one transaction).
func BenchmarkClaimer_DoFresh(b *testing.B) {
	for _, m := range benchModes {
		b.Run(m.name, func(b *testing.B) {
			f := newBenchFixture(b, m.lua)
			ctx, prefix := context.Background(), testenv.Name("k")
			f.loop(b, func(i int) {
				out, err := f.c.Do(ctx, benchReq(prefix+strconv.Itoa(i)), emptyWrite)
				if err != nil || out.Kind != claim.Executed {
					b.Fatalf("Do = %v, %v", out.Kind, err)
				}
			})
		})
	}
}

// BenchmarkClaimer_Replay: a completed key claimed again. FromRedis is
// answered by the Redis cache alone; FromDatabase by the durable claim,
// with Redis in front but caching no result (MaxCachedBody < 0), or with
// no Redis at all.
func BenchmarkClaimer_Replay(b *testing.B) {
	for _, m := range []struct {
		name      string
		lua       *lua.Options
		fromCache bool
	}{
		{"FromRedis", &lua.Options{}, true},
		{"FromDatabase/WithRedis", &lua.Options{MaxCachedBody: -1}, false},
		{"FromDatabase/WithoutRedis", nil, false},
	} {
		b.Run(m.name, func(b *testing.B) {
			f := newBenchFixture(b, m.lua)
			ctx := context.Background()
			r := benchReq(testenv.Name("k"))
			if out, err := f.c.Do(ctx, r, emptyWrite); err != nil || out.Kind != claim.Executed {
				b.Fatalf("Do = %v, %v", out.Kind, err)
			}
			f.loop(b, func(int) {
				out, err := f.c.Claim(ctx, r)
				if err != nil || out.Kind != claim.Replayed || out.FromCache != m.fromCache {
					b.Fatalf("Claim = %v (from cache %v), %v", out.Kind, out.FromCache, err)
				}
			})
		})
	}
}

// BenchmarkClaimer_DoReplayFromRedis: a completed key sent again through Do
// and answered by the Redis cache alone (the bench tool's replay workload).
func BenchmarkClaimer_DoReplayFromRedis(b *testing.B) {
	f := newBenchFixture(b, &lua.Options{})
	ctx := context.Background()
	r := benchReq(testenv.Name("k"))
	if out, err := f.c.Do(ctx, r, emptyWrite); err != nil || out.Kind != claim.Executed {
		b.Fatalf("Do = %v, %v", out.Kind, err)
	}
	f.loop(b, func(int) {
		out, err := f.c.Do(ctx, r, emptyWrite)
		if err != nil || out.Kind != claim.Replayed || !out.FromCache {
			b.Fatalf("Do = %v (from cache %v), %v", out.Kind, out.FromCache, err)
		}
	})
}

// BenchmarkClaimer_DoStorm: a duplicate of a request in progress through
// Do, answered InProgress after Redis and one read of the record (the
// bench tool's storm workload, while the first request of the key runs).
func BenchmarkClaimer_DoStorm(b *testing.B) {
	f := newBenchFixture(b, &lua.Options{})
	ctx := context.Background()
	r := benchReq(testenv.Name("k"))
	held, err := f.c.Claim(ctx, r)
	if err != nil || held.Kind != claim.Acquired {
		b.Fatalf("Claim = %v, %v", held.Kind, err)
	}
	b.Cleanup(func() { _ = held.Lease.Release(context.Background()) })
	f.loop(b, func(int) {
		out, err := f.c.Do(ctx, r, emptyWrite)
		if err != nil || out.Kind != claim.InProgress {
			b.Fatalf("Do = %v, %v", out.Kind, err)
		}
	})
}
