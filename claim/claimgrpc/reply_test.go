package claimgrpc_test

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimgrpc"
	"github.com/oncekey/oncekey/durable"
)

// resolution is what a reconciler stores for one uncertain operation.
type resolution struct {
	state durable.State
	res   durable.Result
}

// uncertainThenResolved makes one uncertain operation per entry of rs (a
// handler that acted, then marked its outcome uncertain), resolves each
// with a Reconciler storing the entry's result, and returns the keys, in
// order.
func uncertainThenResolved(t *testing.T, f *fixture, prefix string, rs []resolution) []string {
	t.Helper()
	byOp := map[string]resolution{}
	keys := make([]string, len(rs))
	for i, r := range rs {
		keys[i] = fmt.Sprint(prefix, i)
		_, st, _ := f.call(t.Context(), f.conn, "acme", keys[i], map[string]any{"item": keys[i], "uncertain": true})
		why, opID, _ := reason(st)
		if st.Code() != codes.Aborted || why != claimgrpc.ReasonUncertain || opID == "" {
			t.Fatalf("%s: %v, reason %q; want uncertain", keys[i], st, why)
		}
		byOp[opID] = r
	}
	rec, err := claim.NewReconciler(f.c, func(_ context.Context, rec durable.Record) (claim.Resolution, error) {
		r, ok := byOp[rec.Ref.OperationID()]
		if !ok {
			return claim.Unresolved(), nil
		}
		return claim.Resolved(r.state, r.res), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := rec.RunOnce(t.Context())
	if err != nil || rep.Resolved != len(rs) {
		t.Fatalf("reconciler: %+v %v; want %d resolved", rep, err, len(rs))
	}
	return keys
}

// A result in another adapter's format is never replayed as a success:
// what `oncekey resolve` wrote before -format existed (an HTTP status, with
// or without a body, as failed or completed), a hand-built result of
// version 0, another adapter's HTTP result. Each retry gets Internal, and
// the handler does not run again (issue 27, defect 4: the first replayed
// as OK with an empty reply, the completed one too).
func TestReplay_ForeignFormatIsNotSuccess(t *testing.T) {
	t.Parallel()
	f := setup(t, config{redis: true})
	rs := []resolution{
		{durable.Failed, durable.Result{StatusCode: 409, Version: 1}},
		{durable.Failed, durable.Result{StatusCode: 409, Body: []byte(`{"error":"conflict"}`), Version: 1}},
		{durable.Completed, durable.Result{StatusCode: 201, Version: 1}},
		{durable.Completed, durable.Result{StatusCode: 200, Headers: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":1}`), Version: 1}},
		{durable.Completed, durable.Result{Body: []byte("done")}},
		{durable.Failed, durable.Result{StatusCode: 5, Body: []byte("not a status"), Version: 1001}},
		{durable.Completed, durable.Result{StatusCode: 0, Version: 1001}}, // no message type
	}
	keys := uncertainThenResolved(t, f, "foreign-", rs)
	for i, k := range keys {
		for range 2 { // from Redis, then again
			reply, st, _ := f.call(t.Context(), f.conn, "acme", k, map[string]any{"item": k, "uncertain": true})
			if st.Code() != codes.Internal || reply != nil {
				t.Fatalf("%+v replayed as %v (reply %v); want Internal, never a success", rs[i].res, st, reply)
			}
		}
	}
	if n := f.runs.Load(); n != int64(len(rs)) {
		t.Fatalf("%d handler runs, want %d (one per operation)", n, len(rs))
	}
}

// A result written through the exported encoders replays exactly as the
// handler's own answer would: StatusResult as the stored status with its
// details, ReplyResult as the reply, also for a reply built the way the
// CLI builds it (a dynamic message from a descriptor and protobuf JSON).
func TestReplay_EncodedResultsReplayExactly(t *testing.T) {
	t.Parallel()
	f := setup(t, config{redis: true})
	declined, err := status.New(codes.FailedPrecondition, "card declined").WithDetails(&errdetails.ErrorInfo{Reason: "DECLINED", Domain: "psp.example"})
	if err != nil {
		t.Fatal(err)
	}
	failed, err := claimgrpc.StatusResult(declined)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := structpb.NewStruct(map[string]any{"charge": "ch_1", "amount": 1200.0})
	completed, err := claimgrpc.ReplyResult(want)
	if err != nil {
		t.Fatal(err)
	}
	dynamic, err := claimgrpc.ReplyResult(dynamicFromJSON(t, want.ProtoReflect().Descriptor(), `{"charge":"ch_1","amount":1200}`))
	if err != nil {
		t.Fatal(err)
	}
	keys := uncertainThenResolved(t, f, "encoded-", []resolution{{durable.Failed, failed}, {durable.Completed, completed}, {durable.Completed, dynamic}})
	for range 2 {
		_, st, hdr := f.call(t.Context(), f.conn, "acme", keys[0], map[string]any{"item": keys[0], "uncertain": true})
		if !proto.Equal(st.Proto(), declined.Proto()) || len(hdr.Get(claimgrpc.MetadataReplayed)) != 1 {
			t.Fatalf("failed: replayed %v (header %v), want %v", st.Proto(), hdr, declined.Proto())
		}
		for _, k := range keys[1:] {
			reply, st, hdr := f.call(t.Context(), f.conn, "acme", k, map[string]any{"item": k, "uncertain": true})
			if st.Code() != codes.OK || !proto.Equal(reply, want) || len(hdr.Get(claimgrpc.MetadataReplayed)) != 1 {
				t.Fatalf("%s: replayed %v %v (header %v), want %v", k, st, reply, hdr, want)
			}
		}
	}
	if n := f.runs.Load(); n != 3 {
		t.Fatalf("%d handler runs, want 3", n)
	}
}

// dynamicFromJSON builds a message of desc from protobuf JSON the way the
// CLI does: through a registry of descriptors, not of generated types.
func dynamicFromJSON(t *testing.T, desc protoreflect.MessageDescriptor, js string) proto.Message {
	t.Helper()
	// The descriptor set an operator would pass, decoded into a registry of
	// files only (no generated types): the CLI's situation.
	set := &descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{protodesc.ToFileDescriptorProto(desc.ParentFile())}}
	files, err := protodesc.NewFiles(set)
	if err != nil {
		t.Fatal(err)
	}
	d, err := files.FindDescriptorByName(desc.FullName())
	if err != nil {
		t.Fatal(err)
	}
	m := dynamicpb.NewMessage(d.(protoreflect.MessageDescriptor))
	if err := (protojson.UnmarshalOptions{Resolver: dynamicpb.NewTypes(files)}).Unmarshal([]byte(js), m); err != nil {
		t.Fatal(err)
	}
	if _, err := protoregistry.GlobalTypes.FindMessageByName(desc.FullName()); err != nil {
		t.Fatal(err) // the server's binary has it: the replay resolves it there
	}
	return m
}

// Results the interceptor wrote under version 1, before gRPC had a version
// of its own, still replay after an upgrade.
func TestReplay_LegacyVersion1(t *testing.T) {
	t.Parallel()
	f := setup(t, config{})
	declined := status.New(codes.NotFound, "no such order")
	failed, _ := claimgrpc.StatusResult(declined)
	want, _ := structpb.NewStruct(map[string]any{"id": 7.0})
	completed, _ := claimgrpc.ReplyResult(want)
	failed.Version, completed.Version = 1, 1
	keys := uncertainThenResolved(t, f, "legacy-", []resolution{{durable.Failed, failed}, {durable.Completed, completed}})
	if _, st, _ := f.call(t.Context(), f.conn, "acme", keys[0], map[string]any{"item": keys[0], "uncertain": true}); !proto.Equal(st.Proto(), declined.Proto()) {
		t.Fatalf("legacy failed: %v", st)
	}
	if reply, st, _ := f.call(t.Context(), f.conn, "acme", keys[1], map[string]any{"item": keys[1], "uncertain": true}); st.Code() != codes.OK || !proto.Equal(reply, want) {
		t.Fatalf("legacy completed: %v %v", st, reply)
	}
}

func TestEncoders_Refuse(t *testing.T) {
	t.Parallel()
	for name, err := range map[string]error{
		"NilStatus":  second(claimgrpc.StatusResult(nil)),
		"OKStatus":   second(claimgrpc.StatusResult(status.New(codes.OK, ""))),
		"NilReply":   second(claimgrpc.ReplyResult(nil)),
		"NilPointer": second(claimgrpc.ReplyResult((*structpb.Struct)(nil))),
	} {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
