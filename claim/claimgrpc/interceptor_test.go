package claimgrpc_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/oncekey/oncekey/claim/claimgrpc"
	"github.com/oncekey/oncekey/durable"
)

func TestInterceptor_Duplicates(t *testing.T) {
	t.Parallel()
	for _, withRedis := range []bool{false, true} {
		name := "PostgreSQL"
		if withRedis {
			name = "RedisAndPostgreSQL"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, config{redis: withRedis})
			ctx := t.Context()
			in := map[string]any{"item": "book", "tags": map[string]any{"b": 2, "a": 1, "c": 3}}
			first, st, hdr := f.call(ctx, f.conn, "acme", "k1", in)
			if st.Code() != codes.OK {
				t.Fatalf("first call: %v", st)
			}
			if len(hdr.Get(claimgrpc.MetadataReplayed)) != 0 {
				t.Fatal("first call marked replayed")
			}
			for i := range 3 {
				again, st, hdr := f.call(ctx, f.conn, "acme", "k1", in)
				if st.Code() != codes.OK {
					t.Fatalf("retry %d: %v", i, st)
				}
				if !proto.Equal(first, again) {
					t.Fatalf("retry %d replied %v, want the first reply %v", i, again, first)
				}
				if got := hdr.Get(claimgrpc.MetadataReplayed); len(got) != 1 || got[0] != "true" {
					t.Fatalf("retry %d: replayed header %q", i, got)
				}
			}
			if n := f.effects("book"); n != 1 {
				t.Fatalf("%d effects, want 1", n)
			}
			if f.runs.Load() != 1 {
				t.Fatalf("handler ran %d times", f.runs.Load())
			}
			if op := first.GetFields()["op"].GetStringValue(); !strings.HasPrefix(op, "op_") {
				t.Fatalf("handler saw operation id %q", op)
			}
			// Another tenant with the same key is another operation.
			if _, st, _ := f.call(ctx, f.conn, "globex", "k1", in); st.Code() != codes.OK {
				t.Fatal(st)
			}
			if n := f.effects("book"); n != 2 {
				t.Fatalf("%d effects after another tenant's call, want 2", n)
			}
		})
	}
}

func TestInterceptor_ErrorStatusIsStoredAndReplayed(t *testing.T) {
	t.Parallel()
	f := setup(t, config{redis: true})
	ctx := t.Context()
	// The handler acts, then answers an error, even a "retryable" one: the
	// interceptor never takes that to mean nothing happened.
	for _, code := range []codes.Code{codes.FailedPrecondition, codes.Unavailable, codes.Internal} {
		item := "err-" + code.String()
		in := map[string]any{"item": item, "code": float64(code)}
		_, first, _ := f.call(ctx, f.conn, "acme", item, in)
		if first.Code() != code {
			t.Fatalf("first: %v, want %v", first, code)
		}
		for range 2 {
			_, again, hdr := f.call(ctx, f.conn, "acme", item, in)
			if !proto.Equal(first.Proto(), again.Proto()) {
				t.Fatalf("replayed status %v, want %v", again.Proto(), first.Proto())
			}
			if len(again.Details()) != 1 {
				t.Fatalf("details lost: %v", again.Details())
			}
			if got := hdr.Get(claimgrpc.MetadataReplayed); len(got) != 1 {
				t.Fatalf("replayed header %q", got)
			}
		}
		if n := f.effects(item); n != 1 {
			t.Fatalf("%v: %d effects, want 1", code, n)
		}
	}
}

func TestInterceptor_ConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	retry, err := claimgrpc.UnaryClientInterceptor(claimgrpc.WithAttempts(200), claimgrpc.WithMaxDelay(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	f := setup(t, config{redis: true, options: []claimgrpc.Option{claimgrpc.WithRetryAfter(10 * time.Millisecond)}})
	cc := f.dial(retry)
	const n = 8
	var (
		wg      sync.WaitGroup
		replies [n]*structpb.Struct
		sts     [n]*status.Status
		start   = make(chan struct{})
	)
	for i := range n {
		wg.Go(func() {
			<-start
			replies[i], sts[i], _ = f.call(t.Context(), cc, "acme", "same-key", map[string]any{"item": "pen"})
		})
	}
	close(start)
	wg.Wait()
	for i := range n {
		if sts[i].Code() != codes.OK {
			t.Fatalf("call %d: %v", i, sts[i])
		}
		if !proto.Equal(replies[0], replies[i]) {
			t.Fatalf("call %d replied %v, call 0 %v", i, replies[i], replies[0])
		}
	}
	if got := f.effects("pen"); got != 1 {
		t.Fatalf("%d effects, want 1", got)
	}
}

func TestInterceptor_InProgress(t *testing.T) {
	t.Parallel()
	f := setup(t, config{redis: true})
	entered, proceed := make(chan string), make(chan struct{})
	hook := func(ctx context.Context, _ *structpb.Struct) {
		entered <- claimgrpc.OperationID(ctx)
		<-proceed
	}
	f.onRun.Store(&hook)
	in := map[string]any{"item": "lamp"}
	done := make(chan *status.Status)
	go func() {
		_, st, _ := f.call(context.WithoutCancel(t.Context()), f.conn, "acme", "k", in)
		done <- st
	}()
	opID := <-entered
	_, st, _ := f.call(t.Context(), f.conn, "acme", "k", in)
	r, gotOp, retry := reason(st)
	if st.Code() != codes.Aborted || r != claimgrpc.ReasonInProgress || gotOp != opID || retry <= 0 {
		t.Fatalf("duplicate in progress: %v, reason %q, op %q (want %q), retry %v", st, r, gotOp, opID, retry)
	}
	close(proceed)
	if st := <-done; st.Code() != codes.OK {
		t.Fatal(st)
	}
	if _, st, _ := f.call(t.Context(), f.conn, "acme", "k", in); st.Code() != codes.OK {
		t.Fatalf("after the first finished: %v", st)
	}
	if n := f.effects("lamp"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
}

func TestInterceptor_Mismatch(t *testing.T) {
	t.Parallel()
	f := setup(t, config{redis: true})
	if _, st, _ := f.call(t.Context(), f.conn, "acme", "k", map[string]any{"item": "cup"}); st.Code() != codes.OK {
		t.Fatal(st)
	}
	_, st, _ := f.call(t.Context(), f.conn, "acme", "k", map[string]any{"item": "mug"})
	if r, _, _ := reason(st); st.Code() != codes.FailedPrecondition || r != claimgrpc.ReasonKeyReused {
		t.Fatalf("reused key: %v, reason %q", st, r)
	}
	if f.effects("cup") != 1 || f.effects("mug") != 0 || f.runs.Load() != 1 {
		t.Fatalf("effects cup %d mug %d, runs %d", f.effects("cup"), f.effects("mug"), f.runs.Load())
	}
}

func TestInterceptor_StoreDownIsUnavailable(t *testing.T) {
	t.Parallel()
	f := setup(t, config{redis: true, closed: true})
	_, st, _ := f.call(t.Context(), f.conn, "acme", "k", map[string]any{"item": "ink"})
	if r, _, retry := reason(st); st.Code() != codes.Unavailable || r != claimgrpc.ReasonUnavailable || retry <= 0 {
		t.Fatalf("store down: %v, reason %q, retry %v", st, r, retry)
	}
	if f.runs.Load() != 0 || f.effects("ink") != 0 {
		t.Fatalf("handler ran %d times with the store down", f.runs.Load())
	}
}

func TestInterceptor_BadKeyReservesNothing(t *testing.T) {
	t.Parallel()
	f := setup(t, config{redis: true})
	ctx := t.Context()
	_, st, _ := f.call(ctx, f.conn, "acme", "", map[string]any{"item": "a"})
	if r, _, _ := reason(st); st.Code() != codes.InvalidArgument || r != claimgrpc.ReasonKeyMissing {
		t.Fatalf("no key: %v, reason %q", st, r)
	}
	for name, md := range map[string]metadata.MD{
		"TwoValues": metadata.Pairs(claimgrpc.MetadataKey, "a", claimgrpc.MetadataKey, "b"),
		"TooLong":   metadata.Pairs(claimgrpc.MetadataKey, strings.Repeat("k", 256)),
		"Empty":     metadata.Pairs(claimgrpc.MetadataKey, ""),
	} {
		md.Set("authorization", "Bearer acme")
		req, _ := structpb.NewStruct(map[string]any{"item": "a"})
		err := f.conn.Invoke(metadata.NewOutgoingContext(ctx, md), createMethod, req, new(structpb.Struct))
		if r, _, _ := reason(status.Convert(err)); status.Code(err) != codes.InvalidArgument || r != claimgrpc.ReasonKeyInvalid {
			t.Fatalf("%s: %v, reason %q", name, err, r)
		}
	}
	_, st, _ = f.call(ctx, f.conn, "", "k", map[string]any{"item": "a"})
	if st.Code() != codes.Unauthenticated {
		t.Fatalf("no tenant: %v", st)
	}
	if f.runs.Load() != 0 || f.records() != 0 {
		t.Fatalf("bad calls ran %d handlers and reserved %d records", f.runs.Load(), f.records())
	}
}

func TestInterceptor_ClientDisconnectMidHandler(t *testing.T) {
	t.Parallel()
	// outer captures the call's own context, which gRPC cancels when the
	// client goes away, so the handler can wait until the server saw it.
	type callCtxKey struct{}
	outer := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		return next(context.WithValue(ctx, callCtxKey{}, ctx), req)
	}
	f := setup(t, config{redis: true, outer: outer})
	entered := make(chan struct{})
	workErr := make(chan error, 1)
	hook := func(ctx context.Context, _ *structpb.Struct) {
		close(entered)
		<-ctx.Value(callCtxKey{}).(context.Context).Done() // the client is gone
		workErr <- ctx.Err()
	}
	f.onRun.Store(&hook)
	cctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-entered
		cancel()
	}()
	in := map[string]any{"item": "desk"}
	if _, st, _ := f.call(cctx, f.conn, "acme", "k", in); st.Code() != codes.Canceled {
		t.Fatalf("cancelled call: %v", st)
	}
	if err := <-workErr; err != nil {
		t.Fatalf("the handler's context ended with its client: %v", err)
	}
	f.onRun.Store(nil)
	// The work completes once; the retry gets its reply (it may first see
	// it in progress while the result is being stored).
	var reply *structpb.Struct
	for {
		r, st, _ := f.call(t.Context(), f.conn, "acme", "k", in)
		if rs, _, _ := reason(st); st.Code() == codes.Aborted && rs == claimgrpc.ReasonInProgress {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if st.Code() != codes.OK {
			t.Fatalf("retry: %v", st)
		}
		reply = r
		break
	}
	if reply.GetFields()["item"].GetStringValue() != "desk" || f.effects("desk") != 1 || f.runs.Load() != 1 {
		t.Fatalf("reply %v, %d effects, %d runs", reply, f.effects("desk"), f.runs.Load())
	}
}

func TestInterceptor_PanicMarksUncertain(t *testing.T) {
	t.Parallel()
	f := setup(t, config{redis: true})
	in := map[string]any{"item": "vase", "panic": true}
	if _, st, _ := f.call(t.Context(), f.conn, "acme", "k", in); st.Code() != codes.Internal {
		t.Fatalf("panicking handler: %v", st)
	}
	for range 2 {
		_, st, _ := f.call(t.Context(), f.conn, "acme", "k", in)
		if r, op, _ := reason(st); st.Code() != codes.Aborted || r != claimgrpc.ReasonUncertain || op == "" {
			t.Fatalf("retry after a panic: %v, reason %q", st, r)
		}
	}
	ref, err := f.store.Ref(durable.Scope{Tenant: "acme", Operation: createMethod, Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := f.store.Get(t.Context(), ref)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != durable.Uncertain || f.effects("vase") != 1 || f.runs.Load() != 1 {
		t.Fatalf("record %v, %d effects, %d runs", rec.State, f.effects("vase"), f.runs.Load())
	}
}

func TestInterceptor_MarkUncertain(t *testing.T) {
	t.Parallel()
	f := setup(t, config{})
	in := map[string]any{"item": "rug", "uncertain": true}
	for i := range 2 {
		_, st, _ := f.call(t.Context(), f.conn, "acme", "k", in)
		if r, _, _ := reason(st); st.Code() != codes.Aborted || r != claimgrpc.ReasonUncertain {
			t.Fatalf("call %d: %v, reason %q", i, st, r)
		}
	}
	if f.effects("rug") != 1 || f.runs.Load() != 1 {
		t.Fatalf("%d effects, %d runs", f.effects("rug"), f.runs.Load())
	}
}

func TestInterceptor_ReleaseKeyRunsAgain(t *testing.T) {
	t.Parallel()
	f := setup(t, config{redis: true})
	for i := range 2 {
		_, st, _ := f.call(t.Context(), f.conn, "acme", "k", map[string]any{"item": "x", "release": true})
		if st.Code() != codes.Unavailable || st.Message() != "dependency down; nothing done" {
			t.Fatalf("call %d: %v, want the handler's own answer", i, st)
		}
	}
	if f.runs.Load() != 2 {
		t.Fatalf("released key ran %d times, want 2", f.runs.Load())
	}
	// The key is free for any request.
	if _, st, _ := f.call(t.Context(), f.conn, "acme", "k", map[string]any{"item": "y"}); st.Code() != codes.OK {
		t.Fatal(st)
	}
}

func TestInterceptor_WithMethods(t *testing.T) {
	t.Parallel()
	f := setup(t, config{options: []claimgrpc.Option{claimgrpc.WithMethods(func(string) bool { return false })}})
	for range 2 {
		if _, st, _ := f.call(t.Context(), f.conn, "acme", "", map[string]any{"item": "free"}); st.Code() != codes.OK {
			t.Fatal(st)
		}
	}
	if f.effects("free") != 2 || f.records() != 0 {
		t.Fatalf("unguarded method: %d effects, %d records", f.effects("free"), f.records())
	}
}

// TestNegativeControl_NoInterceptor shows the duplicate detector of these
// tests at work: without the interceptor, the same call twice under one
// key has two effects, and effects() sees them.
func TestNegativeControl_NoInterceptor(t *testing.T) {
	t.Parallel()
	f := setup(t, config{unguarded: true})
	in := map[string]any{"item": "twice"}
	first, _, _ := f.call(t.Context(), f.conn, "acme", "k", in)
	second, _, _ := f.call(t.Context(), f.conn, "acme", "k", in)
	if n := f.effects("twice"); n != 2 {
		t.Fatalf("without the interceptor: %d effects, want 2 (the detector is broken)", n)
	}
	if proto.Equal(first, second) {
		t.Fatal("two executions replied the same; the reply comparison would miss a duplicate")
	}
}

func TestClientInterceptor_OneKeyPerLogicalCall(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		seen []string
	)
	// outer records the key of every attempt and fails the first two of
	// each logical call as a dropped connection would.
	outer := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		seen = append(seen, strings.Join(md.Get(claimgrpc.MetadataKey), ","))
		n := len(seen)
		mu.Unlock()
		if n%3 != 0 {
			return nil, status.Error(codes.Unavailable, "connection dropped")
		}
		return next(ctx, req)
	}
	f := setup(t, config{outer: outer})
	// The dropped connections carry nothing from the server interceptor:
	// only a method declared guarded is retried after them.
	retry, err := claimgrpc.UnaryClientInterceptor(claimgrpc.WithAttempts(3), claimgrpc.WithMaxDelay(time.Millisecond),
		claimgrpc.WithGuardedMethods(func(m string) bool { return m == createMethod }))
	if err != nil {
		t.Fatal(err)
	}
	cc := f.dial(retry)
	for range 2 {
		if _, st, _ := f.call(t.Context(), cc, "acme", "", map[string]any{"item": "gen"}); st.Code() != codes.OK {
			t.Fatal(st)
		}
	}
	if _, st, _ := f.call(claimgrpc.KeyContext(t.Context(), "mine"), cc, "acme", "", map[string]any{"item": "own"}); st.Code() != codes.OK {
		t.Fatal(st)
	}
	if len(seen) != 9 {
		t.Fatalf("attempts %q", seen)
	}
	for i := 0; i < 9; i += 3 {
		if seen[i] == "" || seen[i] != seen[i+1] || seen[i] != seen[i+2] {
			t.Fatalf("attempts of one call carried keys %q", seen[i:i+3])
		}
	}
	if _, err := uuid.Parse(seen[0]); err != nil || seen[0] == seen[3] {
		t.Fatalf("generated keys %q and %q", seen[0], seen[3])
	}
	if seen[6] != "mine" {
		t.Fatalf("KeyContext key: %q", seen[6])
	}
	if f.effects("gen") != 2 || f.effects("own") != 1 {
		t.Fatalf("effects gen %d own %d", f.effects("gen"), f.effects("own"))
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	f := setup(t, config{})
	for name, err := range map[string]error{
		"NilTenant":     second(claimgrpc.UnaryServerInterceptor(f.c, nil)),
		"NilOperation":  second(claimgrpc.UnaryServerInterceptor(f.c, tenantOf, claimgrpc.WithOperation(nil))),
		"ZeroRetry":     second(claimgrpc.UnaryServerInterceptor(f.c, tenantOf, claimgrpc.WithRetryAfter(0))),
		"ZeroFinish":    second(claimgrpc.UnaryServerInterceptor(f.c, tenantOf, claimgrpc.WithFinishTimeout(0))),
		"NilOption":     second(claimgrpc.UnaryServerInterceptor(f.c, tenantOf, nil)),
		"ZeroAttempts":  second(claimgrpc.UnaryClientInterceptor(claimgrpc.WithAttempts(0))),
		"NilKeyFunc":    second(claimgrpc.UnaryClientInterceptor(claimgrpc.WithKeyFunc(nil))),
		"NegativeDelay": second(claimgrpc.UnaryClientInterceptor(claimgrpc.WithMaxDelay(-1))),
		"NilGuarded":    second(claimgrpc.UnaryClientInterceptor(claimgrpc.WithGuardedMethods(nil))),
	} {
		if !errors.Is(err, claimgrpc.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
	if err := claimgrpc.MarkUncertain(t.Context()); !errors.Is(err, claimgrpc.ErrNotGuarded) {
		t.Errorf("MarkUncertain outside a handler: %v", err)
	}
	if err := claimgrpc.ReleaseKey(t.Context()); !errors.Is(err, claimgrpc.ErrNotGuarded) {
		t.Errorf("ReleaseKey outside a handler: %v", err)
	}
}

func second[T any](_ T, err error) error { return err }
