package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimgrpc"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/loopback"
)

const grpcMethod = "/oncekey.test.Orders/Create"

// descriptorSet writes a FileDescriptorSet describing google.protobuf.Struct
// (and nothing else) and returns its path: what an operator passes.
func descriptorSet(t *testing.T) string {
	t.Helper()
	set := &descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{protodesc.ToFileDescriptorProto(structpb.File_google_protobuf_struct_proto)}}
	b, err := proto.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "struct.binpb")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A resolve the record's adapter could not replay is refused with a usage
// error (exit 2) that says why, and writes nothing: the record stays
// uncertain under its generation (issue 27, defect 4: resolve wrote an
// HTTP 409 that claimgrpc replayed as OK).
func TestResolveRefusesWhatItCannotEncode(t *testing.T) {
	d := newDB(t, nil)
	ctx := context.Background()
	sc := durable.Scope{Tenant: "acme", Operation: grpcMethod, Key: "k-refused"}
	w := claimScope(t, d.store, sc, time.Hour)
	if err := d.store.MarkUncertain(ctx, w.Ref, w.Token); err != nil {
		t.Fatal(err)
	}
	set := descriptorSet(t)
	base := []string{"-tenant", sc.Tenant, "-operation", sc.Operation, "-key", sc.Key, "-reason", "r", "-operator", "ana"}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"-as", "failed", "-status", "409"}, "-format is required"},
		{[]string{"-format", "soap", "-as", "failed", "-status", "409"}, `-format must be http, grpc or message, got "soap"`},
		{[]string{"-format", "grpc", "-as", "failed", "-status", "409"}, "-format grpc takes -code (a gRPC code), not -status (an HTTP status such as 409 is no gRPC code)"},
		{[]string{"-format", "grpc", "-as", "failed", "-message", "gone"}, "needs -code"},
		{[]string{"-format", "grpc", "-as", "failed", "-code", "OK"}, `-code "OK" is not a gRPC error code`},
		{[]string{"-format", "grpc", "-as", "failed", "-code", "409"}, `-code "409" is not a gRPC error code`},
		{[]string{"-format", "grpc", "-as", "failed", "-code", "NotFound", "-body", "x"}, "takes no -body"},
		{[]string{"-format", "grpc", "-as", "completed"}, "needs -message-type"},
		{[]string{"-format", "grpc", "-as", "completed", "-status", "200"}, "not -status"},
		{[]string{"-format", "grpc", "-as", "completed", "-body", "{}"}, "needs -message-type"},
		{[]string{"-format", "grpc", "-as", "completed", "-message-type", "google.protobuf.Struct"}, "-descriptor-set"},
		{[]string{"-format", "grpc", "-as", "completed", "-message-type", "shop.v1.Reply", "-descriptor-set", set}, `-message-type "shop.v1.Reply" is not in the descriptor set`},
		{[]string{"-format", "grpc", "-as", "completed", "-message-type", "google.protobuf.Struct", "-descriptor-set", set, "-body", "[1]"}, "-body is not a google.protobuf.Struct in protobuf JSON"},
		{[]string{"-format", "grpc", "-as", "completed", "-message-type", "google.protobuf.Struct", "-descriptor-set", filepath.Join(t.TempDir(), "none")}, "-descriptor-set:"},
		{[]string{"-format", "grpc", "-as", "failed", "-code", "NotFound", "-content-type", "text/plain"}, "takes no -content-type"},
		{[]string{"-format", "http", "-as", "failed"}, "-format http needs -status"},
		{[]string{"-format", "http", "-as", "failed", "-status", "409", "-code", "5"}, "-format http takes no -code"},
		{[]string{"-format", "http", "-as", "completed", "-status", "204", "-body", "x"}, "a 204 response has no body"},
		{[]string{"-format", "http", "-as", "completed", "-status", "200", "-result-version", "2"}, "takes no -result-version"},
		{[]string{"-format", "message", "-as", "completed", "-code", "5"}, "-format message takes no -code"},
		{[]string{"-format", "message", "-as", "completed", "-body", "a", "-body-file", set}, "not both"},
	} {
		code, out, errs := oncekey(t, "", d.cmd("resolve", append(append([]string{}, base...), tc.args...)...)...)
		want(t, strings.Join(tc.args, " "), code, 2, out, errs)
		if !strings.Contains(errs, tc.msg) {
			t.Errorf("%q: stderr %q does not say %q", tc.args, errs, tc.msg)
		}
		got, err := d.store.Get(ctx, w.Ref)
		if err != nil || got.State != durable.Uncertain || got.Token != w.Token {
			t.Fatalf("%q: the record is now %+v (%v); want it uncertain at %v, untouched", tc.args, got, err, w.Token)
		}
	}

	// -format message stores the application's own result as given.
	code, out, errs := oncekey(t, "", d.cmd("resolve", append(base, "-format", "message", "-as", "completed", "-status", "7", "-body", "acked", "-result-version", "3")...)...)
	want(t, "resolve -format message", code, 0, out, errs)
	got, err := d.store.Get(ctx, w.Ref)
	if err != nil || got.State != durable.Completed || got.Result.StatusCode != 7 || string(got.Result.Body) != "acked" || got.Result.Version != 3 {
		t.Fatalf("after resolve -format message: %+v %v", got, err)
	}
}

// grpcServer serves Create, guarded by claimgrpc on d's store: the first
// call of a key marks its outcome uncertain (after its effect), so the
// operator has something to resolve. It returns a client connection and
// the count of handler runs.
func grpcServer(t *testing.T, d testDB) (*grpc.ClientConn, *atomic.Int64) {
	t.Helper()
	c, err := claim.New[pgx.Tx](d.store)
	if err != nil {
		t.Fatal(err)
	}
	tenant := func(ctx context.Context) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("tenant"); len(v) == 1 {
			return v[0], nil
		}
		return "", errors.New("no tenant")
	}
	guard, err := claimgrpc.UnaryServerInterceptor(c, tenant)
	if err != nil {
		t.Fatal(err)
	}
	runs := new(atomic.Int64)
	handler := func(ctx context.Context, _ *structpb.Struct) (*structpb.Struct, error) {
		runs.Add(1)
		if err := claimgrpc.MarkUncertain(ctx); err != nil {
			return nil, err
		}
		return nil, status.Error(codes.Unavailable, "downstream timed out")
	}
	desc := grpc.ServiceDesc{
		ServiceName: "oncekey.test.Orders",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Create",
			Handler: func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
				in := new(structpb.Struct)
				if err := dec(in); err != nil {
					return nil, err
				}
				return ic(ctx, in, &grpc.UnaryServerInfo{FullMethod: grpcMethod}, func(ctx context.Context, req any) (any, error) {
					return handler(ctx, req.(*structpb.Struct))
				})
			},
		}},
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(guard))
	srv.RegisterService(&desc, struct{}{})
	cc, err := grpc.NewClient(loopback.Serve(t, srv.Serve, srv.Stop), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc, runs
}

// callCreate sends Create for tenant "acme" under key, and returns the
// reply, the status and whether the answer was marked replayed.
func callCreate(t *testing.T, cc *grpc.ClientConn, key string) (*structpb.Struct, *status.Status, bool) {
	t.Helper()
	ctx := metadata.NewOutgoingContext(t.Context(), metadata.Pairs("tenant", "acme", claimgrpc.MetadataKey, key))
	in, _ := structpb.NewStruct(map[string]any{"item": "rug"})
	var out structpb.Struct
	var hdr metadata.MD
	if err := cc.Invoke(ctx, grpcMethod, in, &out, grpc.Header(&hdr)); err != nil {
		return nil, status.Convert(err), len(hdr.Get(claimgrpc.MetadataReplayed)) == 1
	}
	return &out, status.New(codes.OK, ""), len(hdr.Get(claimgrpc.MetadataReplayed)) == 1
}

// A resolve encoded for grpc replays through the server interceptor
// exactly: a failed one as its status, a completed one as its reply. One
// written in the HTTP format (what resolve wrote for every record before
// -format) is refused by the replay (Internal), never answered OK.
func TestResolveGRPCReplaysThroughTheInterceptor(t *testing.T) {
	d := newDB(t, nil)
	cc, runs := grpcServer(t, d)
	set := descriptorSet(t)
	for _, tc := range []struct {
		key  string
		args []string
		want func(reply *structpb.Struct, st *status.Status) bool
	}{
		{"k-failed", []string{"-format", "grpc", "-as", "failed", "-code", "NOT_FOUND", "-message", "no such order"},
			func(reply *structpb.Struct, st *status.Status) bool {
				return reply == nil && st.Code() == codes.NotFound && st.Message() == "no such order"
			}},
		{"k-completed", []string{"-format", "grpc", "-as", "completed", "-descriptor-set", set, "-message-type", "google.protobuf.Struct", "-body", `{"order":"o_7","amount":1200}`},
			func(reply *structpb.Struct, st *status.Status) bool {
				want, _ := structpb.NewStruct(map[string]any{"order": "o_7", "amount": 1200.0})
				return st.Code() == codes.OK && proto.Equal(reply, want)
			}},
		{"k-http", []string{"-format", "http", "-as", "failed", "-status", "409"},
			func(reply *structpb.Struct, st *status.Status) bool {
				return reply == nil && st.Code() == codes.Internal
			}},
	} {
		_, st, _ := callCreate(t, cc, tc.key)
		if st.Code() != codes.Aborted {
			t.Fatalf("%s: first call %v; want Aborted (uncertain)", tc.key, st)
		}
		args := append([]string{"-tenant", "acme", "-operation", grpcMethod, "-key", tc.key, "-reason", "checked downstream", "-operator", "ana"}, tc.args...)
		code, out, errs := oncekey(t, "", d.cmd("resolve", args...)...)
		want(t, "resolve "+tc.key, code, 0, out, errs)
		for range 2 {
			reply, st, replayed := callCreate(t, cc, tc.key)
			if !tc.want(reply, st) || !replayed {
				t.Fatalf("%s: replayed %v %v (marked replayed: %v)", tc.key, st, reply, replayed)
			}
		}
	}
	if n := runs.Load(); n != 3 {
		t.Fatalf("%d handler runs, want 3 (one per key)", n)
	}
}
