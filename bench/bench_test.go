package main

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/internal/testenv"
)

func TestHist(t *testing.T) {
	t.Parallel()
	t.Run("BucketsCoverEveryValue", func(t *testing.T) {
		r := rand.New(rand.NewPCG(1, 2))
		for range 100000 {
			v := r.Uint64() >> r.IntN(64)
			i := bucketOf(v)
			if i < 0 || i >= histBuckets {
				t.Fatalf("bucketOf(%d) = %d out of range", v, i)
			}
			if lo := bucketLow(i); lo > v {
				t.Fatalf("bucketLow(bucketOf(%d)) = %d > value", v, lo)
			}
			if i+1 < histBuckets && bucketLow(i+1) <= v {
				t.Fatalf("value %d at or past the next bucket %d", v, bucketLow(i+1))
			}
		}
	})
	t.Run("QuantilesWithinTheBucketError", func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 4))
		vals := make([]time.Duration, 50000)
		var h hist
		for i := range vals {
			vals[i] = time.Duration(r.ExpFloat64() * float64(time.Millisecond))
			h.record(vals[i])
		}
		slices.Sort(vals)
		for _, q := range []float64{0.5, 0.9, 0.99, 0.999, 1} {
			exact := vals[int(q*float64(len(vals)))-1]
			got := h.quantile(q)
			if diff := float64(got-exact) / float64(exact); diff > 0.032 || diff < -0.032 {
				t.Errorf("quantile(%v) = %v, exact %v (off by %.1f%%)", q, got, exact, diff*100)
			}
		}
		if got := h.quantile(1); got != vals[len(vals)-1] {
			t.Errorf("quantile(1) = %v, want the max %v", got, vals[len(vals)-1])
		}
	})
	t.Run("MergeAddsAndEmptyIsZero", func(t *testing.T) {
		var a, b, empty hist
		a.record(time.Millisecond)
		b.record(3 * time.Millisecond)
		a.merge(&b)
		if a.n != 2 || a.quantile(1) != 3*time.Millisecond || a.quantile(0.5) > 1100*time.Microsecond {
			t.Errorf("merged: n %d, max %v, p50 %v", a.n, a.quantile(1), a.quantile(0.5))
		}
		if empty.quantile(0.99) != 0 {
			t.Error("empty histogram has a quantile")
		}
	})
}

func TestKeyBook(t *testing.T) {
	t.Parallel()
	b := &keyBook{dups: 10, perRound: 3}
	for _, id := range []string{"a", "b", "c", "c"} {
		if _, err := b.executed(context.Background(), nil, opOf(id)); err != nil {
			t.Fatal(err)
		}
	}
	_ = b.after(context.Background(), &round{n: 0}, 35) // 4 keys
	most, twice, never := b.check()
	if most != 2 || twice != 1 || never != 1 {
		t.Fatalf("check = most %d, twice %d, never %d; want 2, 1, 1", most, twice, never)
	}
	if b.keysTimed.Load() != 4 {
		t.Fatalf("keys timed = %d, want 4", b.keysTimed.Load())
	}
	if _, err := b.keyOf(29); err != nil {
		t.Fatalf("keyOf(29): %v", err)
	}
	if _, err := b.keyOf(30); !errors.Is(err, errRoundDone) {
		t.Fatalf("keyOf(30) = %v, want errRoundDone past the budget", err)
	}
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	t.Run("SmokeShortensWhatIsNotGiven", func(t *testing.T) {
		c, err := parseFlags([]string{"-smoke", "-keys", "7"}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if c.duration != 2*time.Second || c.keys != 7 || !slices.Equal(c.workloads, allWorkloads) {
			t.Fatalf("smoke config: duration %v, keys %d, workloads %v", c.duration, c.keys, c.workloads)
		}
	})
	for _, args := range [][]string{{"-workload", "fresh,nope"}, {"-concurrency", "0"}, {"-dups", "0"}, {"extra"}} {
		if _, err := parseFlags(args, &bytes.Buffer{}); !errors.Is(err, ErrConfig) {
			t.Errorf("parseFlags(%q) = %v, want ErrConfig", args, err)
		}
	}
}

func TestReport_FailuresFailTheRun(t *testing.T) {
	t.Parallel()
	cfg := config{duration: time.Second, round: time.Second}
	lib := &variant{name: "library", vs: "floor", target: 0.85}
	lib.st = stats{ops: 80, errs: 2, firstErr: errors.New("boom"), elapsed: time.Second, rounds: 1}
	floor := &variant{name: "floor", floor: true}
	floor.st = stats{ops: 100, elapsed: time.Second, rounds: 1}
	rep := newReport(cfg)
	rep.add(&workload{name: "w", variants: []*variant{lib, floor}},
		[]extra{{Name: "most executions of one key", Value: 2, Check: true, Failed: true}})
	v := rep.Workloads[0].Variants[0]
	if v.Ratio != 0.8 || v.Meets == nil || *v.Meets {
		t.Errorf("ratio %v meets %v, want 0.8 missing 0.85", v.Ratio, v.Meets)
	}
	if len(rep.Failures) != 2 {
		t.Fatalf("failures = %q, want the errors and the failed check", rep.Failures)
	}
	var out bytes.Buffer
	rep.table(&out)
	for _, want := range []string{"MISSED", "[2 errors]", "FAILED", "FAILURE"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestReport_CostTargetsAreCeilings(t *testing.T) {
	t.Parallel()
	cfg := config{duration: time.Second, round: time.Second}
	mk := func(name string, ops int64, costs ...costTarget) *variant {
		v := &variant{name: name, costs: costs}
		v.st = stats{ops: ops, elapsed: time.Second, rounds: 1}
		return v
	}
	cheap := mk("cheap", 80, costTarget{floor: "floor", atMost: 1.3}) // costs 1.25×
	dear := mk("dear", 50, costTarget{floor: "floor", atMost: 1.45})  // costs 2×
	floor := mk("floor", 100)
	rep := newReport(cfg)
	rep.add(&workload{name: "w", variants: []*variant{cheap, dear, floor}}, nil)
	for i, want := range []struct {
		ratio float64
		meets bool
	}{{1.25, true}, {2, false}} {
		c := rep.Workloads[0].Variants[i].Costs
		if len(c) != 1 || c[0].Ratio != want.ratio || !c[0].AtMost || c[0].Meets == nil || *c[0].Meets != want.meets {
			t.Errorf("variant %d: costs %+v, want ratio %v meets %v", i, c, want.ratio, want.meets)
		}
	}
	if len(rep.Failures) != 0 {
		t.Errorf("a missed target is a failure: %q", rep.Failures)
	}
	var out bytes.Buffer
	rep.table(&out)
	for _, want := range []string{"costs 1.25× floor", "≤ 1.30× met", "costs 2.00× floor", "≤ 1.45× MISSED"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// TestRun_Smoke runs every workload briefly against the real servers and
// checks what the tool checks, plus that it cleans up after itself.
func TestRun_Smoke(t *testing.T) {
	t.Parallel()
	cfg, err := parseFlags([]string{"-redis", testenv.RedisURL(t), "-postgres", testenv.DatabaseURL(t),
		"-duration", "300ms", "-round", "60ms", "-concurrency", "4", "-pg-conns", "4", "-dups", "10", "-keys", "40",
		"-replay-keys", "20", "-backlog", "500", "-sweep-batch", "100", "-redis-timeout", "1s"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var log syncBuffer
	setLog(&log)
	rep, err := run(t.Context(), cfg)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	if len(rep.Workloads) != len(allWorkloads) {
		t.Fatalf("%d workloads reported, want %d", len(rep.Workloads), len(allWorkloads))
	}
	figures := map[string]float64{}
	for _, w := range rep.Workloads {
		for _, v := range w.Variants {
			if v.Requests == 0 || v.Errors != 0 || v.PerSecond <= 0 || v.P99us <= 0 {
				t.Errorf("%s/%s: %d requests, %d errors, %.0f/s, p99 %.0fµs", w.Name, v.Name, v.Requests, v.Errors, v.PerSecond, v.P99us)
			}
			figures[w.Name+"/"+v.Name+"/sql"] = v.SQLPerReq
			figures[w.Name+"/"+v.Name+"/redis"] = v.RedisPerReq
		}
		for _, x := range w.Extras {
			figures[w.Name+"/"+x.Name] = x.Value
		}
	}
	for name, want := range map[string]float64{
		"fresh/floor-2stmt/sql":                              5, // BEGIN, claim, the order INSERT, completion, COMMIT
		"fresh/library/sql":                                  5,
		"fresh/library-no-redis/sql":                         5,
		"fresh/floor-business-tx/sql":                        3, // BEGIN, the order INSERT, COMMIT
		"replay/library/sql":                                 0, // answered by Redis
		"replay/library/redis":                               1,
		"replay/floor-select/sql":                            1,
		"storm/floor-evalsha/sql":                            0,
		"replay/floor-evalsha/sql":                           0,
		"storm/library: most executions of one key":          1,
		"storm/library-no-redis: most executions of one key": 1,
	} {
		if got, ok := figures[name]; !ok || got != want {
			t.Errorf("%s = %v (reported %v), want %v", name, got, ok, want)
		}
	}
	if got := figures["storm/library: durable claims per key"]; got <= 0 || got > 1.05 {
		t.Errorf("storm: durable claims per key = %v, want (0, 1.05]", got)
	}
	for _, w := range rep.Workloads {
		for _, v := range w.Variants {
			for _, c := range v.Costs {
				if c.Meets == nil || c.Ratio <= 0 {
					t.Errorf("%s/%s: cost vs %s not judged: %+v", w.Name, v.Name, c.Vs, c)
				}
			}
		}
	}

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, cfg.postgres)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1`, rep.Schema).Scan(&n); err != nil || n != 0 {
		t.Errorf("schema %s left behind (%d, %v)", rep.Schema, n, err)
	}
	opt, err := redis.ParseURL(cfg.redis)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	if keys, err := rdb.Keys(ctx, rep.Prefix+":*").Result(); err != nil || len(keys) != 0 {
		t.Errorf("%d Redis keys left under %s (%v)", len(keys), rep.Prefix, err)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func opOf(id string) claim.Op { return claim.Op{ID: id} }

// TestRealMain_BadFlag is not parallel: realMain sets go-redis's global
// logger, which the other tests' clients read.
func TestRealMain_BadFlag(t *testing.T) {
	var stderr bytes.Buffer
	if code := realMain([]string{"-workload", "nope"}, &bytes.Buffer{}, &stderr); code != 2 {
		t.Errorf("exit code for a bad flag = %d, want 2", code)
	}
	if !strings.Contains(stderr.String(), "unknown workload") {
		t.Errorf("stderr = %q, want the reason", stderr.String())
	}
}
