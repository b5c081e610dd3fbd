package tracetest

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/oncekey/oncekey/canon"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/lua"
	"github.com/oncekey/oncekey/testkit/settletest"
	"github.com/oncekey/oncekey/testkit/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The raw identity the tests claim with: no span may hold either.
const (
	secretKey    = "key-SECRET-7f3a9c"
	secretTenant = "tenant-SECRET-acme"
	operation    = "POST /orders"
)

type redisMode int

const (
	noRedis redisMode = iota
	liveRedis
	deadRedis // a client whose server refuses connections
)

type fixture struct {
	t   *testing.T
	exp *tracetest.InMemoryExporter
	c   *claim.Claimer[pgx.Tx]
	// forget deletes the fixture's Redis keys (liveRedis): Redis lost them.
	forget func()
}

func setup(t *testing.T, mode redisMode, opts ...claim.Option) *fixture {
	t.Helper()
	_, st := settletest.Store(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	opts = append([]claim.Option{claim.WithTracerProvider(tp)}, opts...)
	forget := func() { t.Fatal("no Redis to forget") }
	switch mode {
	case liveRedis:
		rdb, prefix := testenv.Redis(t)
		opts = append(opts, claim.WithRedis(rdb, lua.Options{Prefix: prefix, Timeout: time.Second}))
		forget = func() {
			// Do sends its Redis completion after its answer: wait until
			// no key holds a lease ("L" or "T", lua/record.lua), so that a
			// completion landing late does not undo the loss.
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
				keys, err := rdb.Keys(t.Context(), prefix+"*").Result()
				if err != nil {
					t.Fatal(err)
				}
				held := false
				for _, k := range keys {
					if v, err := rdb.Get(t.Context(), k).Result(); err == nil && (strings.HasPrefix(v, "L") || strings.HasPrefix(v, "T")) {
						held = true
					}
				}
				if !held {
					break
				}
			}
			keys, err := rdb.Keys(t.Context(), prefix+"*").Result()
			if err == nil && len(keys) > 0 {
				err = rdb.Del(t.Context(), keys...).Err()
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	case deadRedis:
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := lis.Addr().String()
		lis.Close() // nothing listens there now
		rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		t.Cleanup(func() { _ = rdb.Close() })
		opts = append(opts, claim.WithRedis(rdb, lua.Options{Timeout: 200 * time.Millisecond}))
	}
	c, err := claim.New[pgx.Tx](st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, exp: exp, c: c, forget: forget}
}

// acquire claims secretKey (body "a") on c and fails the test, naming
// the step what, unless the claim was acquired.
func acquire(t *testing.T, ctx context.Context, c *claim.Claimer[pgx.Tx], what string) claim.Outcome {
	t.Helper()
	out, err := c.Claim(ctx, request(secretKey, "a"))
	if err != nil || out.Kind != claim.Acquired {
		t.Fatalf("%s: %v %v", what, out.Kind, err)
	}
	return out
}

func request(key, body string) claim.Request {
	return claim.Request{
		Scope:       durable.Scope{Tenant: secretTenant, Operation: operation, Key: key},
		Fingerprint: string(canon.Sum([]byte(body))),
	}
}

// spans returns the ended spans named name.
func (f *fixture) spans(name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range f.exp.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// one returns the only ended span named name.
func (f *fixture) one(name string) tracetest.SpanStub {
	f.t.Helper()
	s := f.spans(name)
	if len(s) != 1 {
		f.t.Fatalf("%d spans named %s, want 1", len(s), name)
	}
	return s[0]
}

// children returns the names of the spans whose parent is s.
func (f *fixture) children(s tracetest.SpanStub) []string {
	var out []string
	for _, c := range f.exp.GetSpans() {
		if c.Parent.SpanID() == s.SpanContext.SpanID() {
			out = append(out, c.Name)
		}
	}
	return out
}

func attr(s tracetest.SpanStub, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// want checks that s has each attribute with the value given.
func want(t *testing.T, s tracetest.SpanStub, kv ...attribute.KeyValue) {
	t.Helper()
	for _, w := range kv {
		got, ok := attr(s, string(w.Key))
		if !ok || got != w.Value {
			t.Errorf("span %s: %s = %v (set %v), want %v", s.Name, w.Key, got.String(), ok, w.Value.String())
		}
	}
}

func has(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

func TestTraces_ClaimCompleteReplay(t *testing.T) {
	t.Parallel()
	f := setup(t, liveRedis)
	ctx := t.Context()
	out := acquire(t, ctx, f.c, "claim")
	work, stop := out.Lease.KeepAlive(context.WithoutCancel(ctx))
	// Propagation: the work's context carries the operation identity as
	// baggage, for a downstream call to send and log.
	if got := baggage.FromContext(work).Member("oncekey.operation_id").Value(); got != out.OperationID {
		t.Fatalf("baggage oncekey.operation_id = %q, want %q", got, out.OperationID)
	}
	_ = stop()
	if err := out.Lease.Complete(ctx, durable.Result{StatusCode: 201, Body: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	cl := f.one("oncekey.claim")
	want(t, cl,
		attribute.String("oncekey.mode", "claim"),
		attribute.String("oncekey.operation", operation),
		attribute.String("oncekey.outcome", "acquired"),
		attribute.String("oncekey.operation_id", out.OperationID),
		attribute.Bool("oncekey.redis.answered", true),
		attribute.Int64("oncekey.generation", int64(out.Lease.Token().Generation)),
		attribute.Bool("oncekey.takeover", false),
		attribute.Bool("oncekey.replay", false),
	)
	if kids := f.children(cl); !has(kids, "oncekey.redis.claim") || !has(kids, "oncekey.durable.claim") {
		t.Fatalf("claim span children %q", kids)
	}
	want(t, f.one("oncekey.redis.claim"), attribute.String("oncekey.redis.result", "acquired"))
	want(t, f.one("oncekey.durable.claim"), attribute.String("oncekey.durable.result", "acquired"))

	fin := f.one("oncekey.finish")
	want(t, fin,
		attribute.String("oncekey.state", "completed"),
		attribute.Bool("oncekey.fenced", false),
		attribute.String("oncekey.operation_id", out.OperationID),
		attribute.Int64("oncekey.generation", int64(out.Lease.Token().Generation)),
	)
	if len(fin.Links) != 1 || fin.Links[0].SpanContext.SpanID() != cl.SpanContext.SpanID() {
		t.Fatalf("finish span links %v, want the claim span %v", fin.Links, cl.SpanContext.SpanID())
	}
	if kids := f.children(fin); !has(kids, "oncekey.durable.finish") {
		t.Fatalf("finish span children %q", kids)
	}
	if len(fin.Events) != 1 || fin.Events[0].Name != "oncekey.redis.cache" {
		t.Fatalf("finish span events %v", fin.Events)
	}

	f.exp.Reset()
	again, err := f.c.Claim(ctx, request(secretKey, "a"))
	if err != nil || again.Kind != claim.Replayed {
		t.Fatalf("retry: %v %v", again.Kind, err)
	}
	rp := f.one("oncekey.claim")
	want(t, rp,
		attribute.String("oncekey.outcome", "replayed"),
		attribute.Bool("oncekey.replay", true),
		attribute.String("oncekey.replay.source", "redis"),
		attribute.String("oncekey.state", "completed"),
		attribute.String("oncekey.operation_id", out.OperationID),
	)
	want(t, f.one("oncekey.redis.claim"), attribute.String("oncekey.redis.result", "cached"))
	if kids := f.children(rp); has(kids, "oncekey.durable.claim") {
		t.Fatalf("a Redis replay asked the database: %q", kids)
	}
}

func TestTraces_RedisDownTakeoverFenced(t *testing.T) {
	t.Parallel()
	// No start margin: with Redis dead, a claim on a loaded machine once
	// took longer than the default tenth of the lease and was refused
	// (ErrLeaseExpired), which is not what this test is about.
	f := setup(t, deadRedis, claim.WithLease(time.Second), claim.WithStartMargin(0))
	ctx := t.Context()
	first := acquire(t, ctx, f.c, "claim")
	want(t, f.one("oncekey.claim"),
		attribute.String("oncekey.outcome", "acquired"),
		attribute.Bool("oncekey.redis.answered", false),
		attribute.Bool("oncekey.takeover", false),
	)
	want(t, f.one("oncekey.redis.claim"), attribute.String("oncekey.redis.result", "error"))
	time.Sleep(1200 * time.Millisecond) // let the lease expire (by the database's clock)

	f.exp.Reset()
	second := acquire(t, ctx, f.c, "takeover")
	g1, g2 := first.Lease.Token().Generation, second.Lease.Token().Generation
	want(t, f.one("oncekey.claim"),
		attribute.Bool("oncekey.takeover", true),
		attribute.Int64("oncekey.generation", int64(g2)),
	)
	if g2 <= g1 {
		t.Fatalf("generation %d after %d", g2, g1)
	}

	f.exp.Reset()
	if err := first.Lease.Complete(ctx, durable.Result{Body: []byte("late")}); !errors.Is(err, claim.ErrFenced) {
		t.Fatalf("late completion: %v, want ErrFenced", err)
	}
	fin := f.one("oncekey.finish")
	want(t, fin, attribute.Bool("oncekey.fenced", true), attribute.Int64("oncekey.generation", int64(g1)))
	if fin.Status.Code != codes.Error || fin.Status.Description != "fenced" {
		t.Fatalf("fenced finish status %v", fin.Status)
	}
	if err := second.Lease.MarkUncertain(ctx); err != nil {
		t.Fatal(err)
	}
	fins := f.spans("oncekey.finish")
	want(t, fins[len(fins)-1], attribute.String("oncekey.state", "uncertain"), attribute.Bool("oncekey.fenced", false))

	f.exp.Reset()
	third, err := f.c.Claim(ctx, request(secretKey, "a"))
	if err != nil || third.Kind != claim.Uncertain {
		t.Fatalf("after uncertain: %v %v", third.Kind, err)
	}
	want(t, f.one("oncekey.claim"),
		attribute.String("oncekey.outcome", "uncertain"),
		attribute.Int64("oncekey.generation", int64(g2)),
	)
}

func TestTraces_Do(t *testing.T) {
	t.Parallel()
	// Locking first (the default on PostgreSQL) and writing at commit (the
	// opt-in): the record is inserted with the COMMIT, and the transaction
	// span says so and holds no claim.
	t.Run("LockFirst", func(t *testing.T) {
		t.Parallel()
		testTracesDo(t, false)
	})
	t.Run("WriteAtCommit", func(t *testing.T) {
		t.Parallel()
		testTracesDo(t, true)
	})
}

func testTracesDo(t *testing.T, atCommit bool) {
	var opts []claim.Option
	if atCommit {
		opts = append(opts, claim.WithWriteAtCommit())
	}
	f := setup(t, liveRedis, opts...)
	ctx := t.Context()
	var bag string
	out, err := f.c.Do(ctx, request(secretKey, "a"), func(ctx context.Context, tx pgx.Tx, op claim.Op) (durable.Result, error) {
		bag = baggage.FromContext(ctx).Member("oncekey.operation_id").Value()
		return durable.Result{Body: []byte("done")}, nil
	})
	if err != nil || out.Kind != claim.Executed {
		t.Fatalf("do: %v %v", out.Kind, err)
	}
	if bag != out.OperationID {
		t.Fatalf("baggage in fn %q, want %q", bag, out.OperationID)
	}
	cl := f.one("oncekey.claim")
	want(t, cl, attribute.String("oncekey.mode", "do"), attribute.String("oncekey.outcome", "executed"), attribute.Bool("oncekey.redis.answered", true))
	tx := f.one("oncekey.durable.transaction")
	if tx.Parent.SpanID() != cl.SpanContext.SpanID() || has(f.children(tx), "oncekey.durable.claim") {
		t.Fatalf("transaction span under %v with children %q (write at commit: %v)", tx.Parent.SpanID(), f.children(tx), atCommit)
	}
	want(t, tx, attribute.String("oncekey.durable.result", "inserted"))

	// Redis lost the key: Do replays the record from the database, and fn
	// does not run.
	f.exp.Reset()
	f.forget()
	rep, err := f.c.Do(ctx, request(secretKey, "a"), func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
		if !atCommit {
			t.Error("fn ran for a finished key")
		}
		return durable.Result{Body: []byte("again")}, nil
	})
	if err != nil || rep.Kind != claim.Replayed || string(rep.Result.Body) != "done" {
		t.Fatalf("replay after Redis lost the key: %v %v", rep.Kind, err)
	}
	want(t, f.one("oncekey.durable.transaction"), attribute.String("oncekey.durable.result", "existing"))
	want(t, f.one("oncekey.claim"), attribute.String("oncekey.outcome", "replayed"), attribute.String("oncekey.replay.source", "durable"))

	f.exp.Reset()
	if _, err := f.c.Do(ctx, request(secretKey, "b"), func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
		t.Error("ran on a mismatch")
		return durable.Result{}, nil
	}); !errors.Is(err, claim.ErrMismatch) {
		t.Fatalf("mismatch: %v", err)
	}
	mm := f.one("oncekey.claim")
	want(t, mm, attribute.String("oncekey.outcome", "mismatch"))
	if mm.Status.Code != codes.Error || mm.Status.Description != "mismatch" {
		t.Fatalf("mismatch status %v", mm.Status)
	}
}

// leaks returns where the spans hold s: in a name, an attribute (of a
// span, event or link) or a status description.
func leaks(spans tracetest.SpanStubs, s string) []string {
	var out []string
	check := func(where string, kvs []attribute.KeyValue) {
		for _, kv := range kvs {
			if strings.Contains(string(kv.Key), s) || strings.Contains(kv.Value.String(), s) {
				out = append(out, where+" "+string(kv.Key))
			}
		}
	}
	for _, sp := range spans {
		if strings.Contains(sp.Name, s) || strings.Contains(sp.Status.Description, s) {
			out = append(out, sp.Name)
		}
		check(sp.Name, sp.Attributes)
		for _, e := range sp.Events {
			if strings.Contains(e.Name, s) {
				out = append(out, sp.Name+" event "+e.Name)
			}
			check(sp.Name+" event "+e.Name, e.Attributes)
		}
		for _, l := range sp.Links {
			check(sp.Name+" link", l.Attributes)
		}
	}
	return out
}

// Every path a claim can take, then a scan of every span for the raw key
// and tenant.
func TestTraces_NoRawKeyOrTenant(t *testing.T) {
	t.Parallel()
	f := setup(t, liveRedis, claim.WithLease(5*time.Second))
	ctx := t.Context()
	a, err := f.c.Claim(ctx, request(secretKey, "a"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := f.c.Claim(ctx, request(secretKey, "a")); err != nil || out.Kind != claim.InProgress {
		t.Fatalf("in progress: %v %v", out.Kind, err)
	}
	if _, err := f.c.Claim(ctx, request(secretKey, "other")); !errors.Is(err, claim.ErrMismatch) {
		t.Fatalf("mismatch: %v", err)
	}
	if err := a.Lease.Complete(ctx, durable.Result{Body: []byte(secretKey + secretTenant)}); err != nil {
		t.Fatal(err)
	}
	if out, err := f.c.Claim(ctx, request(secretKey, "a")); err != nil || out.Kind != claim.Replayed {
		t.Fatalf("replay: %v %v", out.Kind, err)
	}
	b, err := f.c.Claim(ctx, request(secretKey+"-2", "a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.c.Claim(ctx, claim.Request{Scope: durable.Scope{Tenant: secretTenant, Operation: operation, Key: secretKey + "\x01"}, Fingerprint: string(canon.Sum([]byte("a")))}); !errors.Is(err, claim.ErrInvalidScope) {
		t.Fatalf("invalid key: %v", err)
	}
	if _, err := f.c.Do(ctx, request(secretKey+"-3", "a"), func(context.Context, pgx.Tx, claim.Op) (durable.Result, error) {
		return durable.Result{}, claim.Reject(durable.Result{Body: []byte(secretTenant)})
	}); err != nil {
		t.Fatal(err)
	}
	spans := f.exp.GetSpans()
	if len(spans) < 20 {
		t.Fatalf("only %d spans recorded", len(spans))
	}
	for _, s := range []string{secretKey, secretTenant} {
		if where := leaks(spans, s); len(where) > 0 {
			t.Errorf("spans hold %q: %v", s, where)
		}
	}

	// Negative control: the scan finds a raw value where one is.
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	_, sp := tp.Tracer("leaky").Start(ctx, "x", trace.WithAttributes(attribute.String("idempotency.key", "k="+secretKey)))
	sp.AddEvent("e", trace.WithAttributes(attribute.StringSlice("tenants", []string{secretTenant})))
	sp.End()
	defer func() { _ = tp.Shutdown(context.Background()) }() // Shutdown empties the exporter
	if len(leaks(exp.GetSpans(), secretKey)) != 1 || len(leaks(exp.GetSpans(), secretTenant)) != 1 {
		t.Fatalf("the scan missed a leak: %v %v", leaks(exp.GetSpans(), secretKey), leaks(exp.GetSpans(), secretTenant))
	}
}

func TestTraces_Off(t *testing.T) {
	t.Parallel()
	if _, err := claim.New[pgx.Tx](nil, claim.WithTracerProvider(nil)); !errors.Is(err, claim.ErrConfig) {
		t.Fatalf("nil TracerProvider: %v", err)
	}
	_, st := settletest.Store(t)
	c, err := claim.New[pgx.Tx](st)
	if err != nil {
		t.Fatal(err)
	}
	// The caller traces with its own provider: a Claimer without one
	// must leave the caller's span alone (no attributes, no events).
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx, callerSpan := tp.Tracer("caller").Start(t.Context(), "caller")
	out := acquire(t, ctx, c, "claim")
	work, stop := out.Lease.KeepAlive(context.WithoutCancel(ctx))
	if n := baggage.FromContext(work).Len(); n != 0 {
		t.Fatalf("baggage without traces: %d members", n)
	}
	_ = stop()
	if err := out.Lease.Complete(ctx, durable.Result{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Claim(ctx, request(secretKey, "a")); err != nil {
		t.Fatal(err)
	}
	callerSpan.End()
	spans := exp.GetSpans()
	if len(spans) != 1 || len(spans[0].Attributes) != 0 || len(spans[0].Events) != 0 {
		t.Fatalf("a Claimer without a TracerProvider traced into the caller's provider or span: %+v", spans)
	}
}

func TestTraces_Reconcile(t *testing.T) {
	t.Parallel()
	f := setup(t, liveRedis)
	ctx := t.Context()
	out := acquire(t, ctx, f.c, "claim")
	if err := out.Lease.MarkUncertain(ctx); err != nil {
		t.Fatal(err)
	}
	var (
		bag    string
		parent trace.SpanID
	)
	r, err := claim.NewReconciler(f.c, func(ctx context.Context, rec durable.Record) (claim.Resolution, error) {
		// The resolver asks the downstream system: its context carries
		// the reconcile span and the operation identity.
		bag = baggage.FromContext(ctx).Member("oncekey.operation_id").Value()
		parent = trace.SpanContextFromContext(ctx).SpanID()
		return claim.Resolved(durable.Completed, durable.Result{Body: []byte("found")}), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	f.exp.Reset()
	if rep, err := r.RunOnce(ctx); err != nil || rep.Resolved != 1 {
		t.Fatalf("reconcile: %+v %v", rep, err)
	}
	rc := f.one("oncekey.reconcile")
	want(t, rc,
		attribute.String("oncekey.reconcile.result", "completed"),
		attribute.String("oncekey.operation_id", out.OperationID),
	)
	if g, _ := attr(rc, "oncekey.generation"); g.AsInt64() <= int64(out.Lease.Token().Generation) {
		t.Fatalf("reconcile generation %d, not above the original %d", g.AsInt64(), out.Lease.Token().Generation)
	}
	if kids := f.children(rc); !has(kids, "oncekey.durable.adopt") || !has(kids, "oncekey.durable.finish") {
		t.Fatalf("reconcile span children %q", kids)
	}
	if bag != out.OperationID || parent != rc.SpanContext.SpanID() {
		t.Fatalf("resolver context: baggage %q, span %v; want %q under %v", bag, parent, out.OperationID, rc.SpanContext.SpanID())
	}
}
