package claimgrpc_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/oncekey/oncekey/claim/claimgrpc"
)

// attempts counts the calls that leave the client, under the retrying
// interceptor: one per attempt.
func attempts(n *atomic.Int64) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		n.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

func retrying(t *testing.T, opts ...claimgrpc.ClientOption) grpc.UnaryClientInterceptor {
	t.Helper()
	ic, err := claimgrpc.UnaryClientInterceptor(append([]claimgrpc.ClientOption{claimgrpc.WithMaxDelay(time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return ic
}

// A method the server does not guard answers Unavailable after its effect:
// the client must not send it again, since nothing stops a second run
// (issue 27, defect 3: it ran 3 times).
func TestClientInterceptor_UnguardedMethodIsNotRetried(t *testing.T) {
	t.Parallel()
	f := setup(t, config{options: []claimgrpc.Option{claimgrpc.WithMethods(func(string) bool { return false })}})
	var sent atomic.Int64
	cc := f.dial(retrying(t, claimgrpc.WithAttempts(3)), attempts(&sent))
	_, st, _ := f.call(t.Context(), cc, "acme", "", map[string]any{"item": "free", "code": float64(codes.Unavailable)})
	if st.Code() != codes.Unavailable {
		t.Fatalf("status %v, want the handler's Unavailable", st)
	}
	if f.runs.Load() != 1 || f.effects("free") != 1 || sent.Load() != 1 {
		t.Fatalf("unguarded method with WithAttempts(3): %d runs, %d effects, %d attempts; want 1 each", f.runs.Load(), f.effects("free"), sent.Load())
	}
}

// A replay is the operation's stored result: final, even when its code is
// Unavailable (issue 27, defect 3: 4 attempts on a stored Unavailable).
func TestClientInterceptor_ReplayIsNotRetried(t *testing.T) {
	t.Parallel()
	f := setup(t, config{})
	in := map[string]any{"item": "stored", "code": float64(codes.Unavailable)}
	// The first call stores the handler's Unavailable.
	if _, st, _ := f.call(t.Context(), f.conn, "acme", "k-stored", in); st.Code() != codes.Unavailable {
		t.Fatalf("first call: %v", st)
	}
	for _, tc := range []struct {
		name string
		opts []claimgrpc.ClientOption
	}{
		{"Default", nil},
		{"GuardedMethod", []claimgrpc.ClientOption{claimgrpc.WithGuardedMethods(func(m string) bool { return m == createMethod })}},
	} {
		var sent atomic.Int64
		cc := f.dial(retrying(t, append(tc.opts, claimgrpc.WithAttempts(4))...), attempts(&sent))
		_, st, hdr := f.call(claimgrpc.KeyContext(t.Context(), "k-stored"), cc, "acme", "", in)
		if st.Code() != codes.Unavailable || len(hdr.Get(claimgrpc.MetadataReplayed)) != 1 {
			t.Fatalf("%s: %v, header %v; want the stored Unavailable, replayed", tc.name, st, hdr)
		}
		if sent.Load() != 1 {
			t.Fatalf("%s: %d attempts on a replayed answer, want 1", tc.name, sent.Load())
		}
	}
	if f.runs.Load() != 1 || f.effects("stored") != 1 {
		t.Fatalf("%d runs, %d effects", f.runs.Load(), f.effects("stored"))
	}
}

// A guarded method's handler answers Unavailable: with the method declared
// guarded the client tries again, and that retry is the replay, so it
// stops there; the handler ran once. Without the declaration the answer
// (no oncekey marker) is returned as it is.
func TestClientInterceptor_DeclaredGuardedMethod(t *testing.T) {
	t.Parallel()
	f := setup(t, config{})
	for i, tc := range []struct {
		opts []claimgrpc.ClientOption
		sent int64
	}{
		{nil, 1},
		{[]claimgrpc.ClientOption{claimgrpc.WithGuardedMethods(func(m string) bool { return m == createMethod })}, 2},
	} {
		item := fmt.Sprint("declared-", i)
		var sent atomic.Int64
		cc := f.dial(retrying(t, append(tc.opts, claimgrpc.WithAttempts(4))...), attempts(&sent))
		_, st, _ := f.call(t.Context(), cc, "acme", "", map[string]any{"item": item, "code": float64(codes.Unavailable)})
		if st.Code() != codes.Unavailable || sent.Load() != tc.sent || f.effects(item) != 1 {
			t.Fatalf("case %d: %v after %d attempts (want %d), %d effects (want 1)", i, st, sent.Load(), tc.sent, f.effects(item))
		}
	}
}

// The server interceptor's own Unavailable (the store is down; nothing
// ran) shows the method is guarded: it is retried without a declaration.
func TestClientInterceptor_RetriesTheInterceptorsUnavailable(t *testing.T) {
	t.Parallel()
	f := setup(t, config{closed: true})
	var sent atomic.Int64
	cc := f.dial(retrying(t, claimgrpc.WithAttempts(3)), attempts(&sent))
	_, st, _ := f.call(t.Context(), cc, "acme", "k", map[string]any{"item": "down"})
	if r, _, _ := reason(st); st.Code() != codes.Unavailable || r != claimgrpc.ReasonUnavailable {
		t.Fatalf("%v, reason %q", st, r)
	}
	if sent.Load() != 3 || f.runs.Load() != 0 {
		t.Fatalf("%d attempts (want 3), %d runs (want 0)", sent.Load(), f.runs.Load())
	}
}

// An Unavailable from the transport (nothing listens) carries no server
// metadata: retried only for a method declared guarded.
func TestClientInterceptor_TransportUnavailable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	for _, tc := range []struct {
		name string
		opts []claimgrpc.ClientOption
		sent int64
	}{
		{"Undeclared", nil, 1},
		{"Declared", []claimgrpc.ClientOption{claimgrpc.WithGuardedMethods(func(m string) bool { return m == createMethod })}, 3},
	} {
		var sent atomic.Int64
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithChainUnaryInterceptor(retrying(t, append(tc.opts, claimgrpc.WithAttempts(3))...), attempts(&sent)))
		if err != nil {
			t.Fatal(err)
		}
		ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer acme")
		err = cc.Invoke(ctx, createMethod, &structpb.Struct{}, new(structpb.Struct))
		_ = cc.Close()
		if status.Code(err) != codes.Unavailable || sent.Load() != tc.sent {
			t.Fatalf("%s: %v after %d attempts, want Unavailable after %d", tc.name, err, sent.Load(), tc.sent)
		}
	}
}
