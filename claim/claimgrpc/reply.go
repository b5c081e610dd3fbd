package claimgrpc

import (
	"errors"
	"fmt"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/wire"
)

// How a reply is stored in a durable.Result:
//
//   - Version: wire.ResultGRPC (1001), so a result in another adapter's
//     format (an HTTP status and body) is refused, never misread;
//   - StatusCode: the gRPC code (0 for OK);
//   - OK: Body is the reply message, marshalled, and the header
//     headerType names its full protobuf name; no other header;
//   - not OK: Body is the google.rpc.Status (code, message, details),
//     marshalled, its code equal to StatusCode; no header.
//
// Before version 1001 existed the interceptor wrote the same shape under
// version 1, which is also the HTTP format's version. A version 1 result
// is replayed only when it has that exact shape (a code 0 with the type
// header, or a code 1 to 16 whose body is a status of that code); an HTTP
// result (a status of 100 or more, no type header) is refused.
//
// A replay resolves the reply's type by that name in the global protobuf
// registry (protoregistry.GlobalTypes), where generated code registers
// every message: the interceptor does not see the handler's reply type
// unless the handler runs, and a replay must not run it.
const (
	resultVersion       = wire.ResultGRPC
	legacyResultVersion = wire.ResultHTTP
	headerType          = "Grpc-Message-Type"
)

var errNotReplayable = errors.New("claimgrpc: stored result is not a gRPC reply")

// ReplyResult returns the result the server interceptor stores for a
// handler that returned reply: store it as completed (a [claim.Reconciler]'s
// claim.Resolved(durable.Completed, res), or oncekey resolve -format grpc)
// and every retry gets reply, marked replayed. reply must be a valid,
// non-nil message whose type the serving binary has in the global protobuf
// registry (generated code registers its messages; a replay of a type it
// lacks answers Internal). A message built from a descriptor
// (dynamicpb) is stored under its full name like a generated one.
func ReplyResult(reply proto.Message) (durable.Result, error) {
	if reply == nil || !reply.ProtoReflect().IsValid() {
		return durable.Result{}, fmt.Errorf("claimgrpc: ReplyResult: %T is not a valid protobuf message", reply)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(reply)
	if err != nil {
		return durable.Result{}, fmt.Errorf("claimgrpc: ReplyResult: %w", err)
	}
	if b == nil {
		b = []byte{}
	}
	return durable.Result{
		StatusCode: int(codes.OK),
		Headers:    map[string][]string{headerType: {string(reply.ProtoReflect().Descriptor().FullName())}},
		Body:       b,
		Version:    resultVersion,
	}, nil
}

// StatusResult returns the result the server interceptor stores for a
// handler that returned st.Err(): store it as failed (claim.Resolved(
// durable.Failed, res), or oncekey resolve -format grpc -as failed) and
// every retry gets st, with its code, message and details, marked
// replayed. A nil or OK status is refused: it is no failure, and a replay
// must not answer OK without a reply.
func StatusResult(st *status.Status) (durable.Result, error) {
	if st == nil || st.Code() == codes.OK {
		return durable.Result{}, errors.New("claimgrpc: StatusResult: an OK or nil status is not a failure (use ReplyResult)")
	}
	p := st.Proto()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(p)
	if err != nil {
		return durable.Result{}, fmt.Errorf("claimgrpc: StatusResult: %w", err)
	}
	return durable.Result{StatusCode: int(p.Code), Body: b, Version: resultVersion}, nil
}

// encodeReply stores the handler's answer: its reply, or its error's status.
func encodeReply(resp any, herr error) (res durable.Result, failed bool, err error) {
	if herr != nil {
		st := status.Convert(herr)
		if st.Code() == codes.OK { // an error that claims OK is not OK
			p := st.Proto()
			p.Code = int32(codes.Unknown)
			st = status.FromProto(p)
		}
		res, err := StatusResult(st)
		return res, true, err
	}
	m, ok := resp.(proto.Message)
	if !ok || m == nil || !m.ProtoReflect().IsValid() {
		return durable.Result{}, false, fmt.Errorf("claimgrpc: reply is %T, not a protobuf message", resp)
	}
	res, err = ReplyResult(m)
	return res, false, err
}

// decodeReply returns the stored answer as the handler gave it: the reply
// message, or the status error. A result in another format, or one that
// does not decode, is errNotReplayable: never an OK it does not hold.
func decodeReply(res *durable.Result) (any, error) {
	switch res.Version {
	case resultVersion:
	case legacyResultVersion:
		if res.StatusCode > int(codes.Unauthenticated) { // an HTTP status: not written by this package
			return nil, fmt.Errorf("%w: version %d with status %d is an HTTP result", errNotReplayable, res.Version, res.StatusCode)
		}
	default:
		return nil, fmt.Errorf("%w: representation version %d", errNotReplayable, res.Version)
	}
	if res.StatusCode != int(codes.OK) {
		if len(res.Headers) != 0 {
			return nil, fmt.Errorf("%w: a status with headers", errNotReplayable)
		}
		var p spb.Status
		if err := proto.Unmarshal(res.Body, &p); err != nil {
			return nil, fmt.Errorf("%w: status: %w", errNotReplayable, err)
		}
		if p.Code == int32(codes.OK) || int(p.Code) != res.StatusCode {
			return nil, fmt.Errorf("%w: status code %d stored as %d", errNotReplayable, p.Code, res.StatusCode)
		}
		return nil, status.ErrorProto(&p)
	}
	names := res.Headers[headerType]
	if len(names) != 1 || len(res.Headers) != 1 {
		return nil, fmt.Errorf("%w: no message type", errNotReplayable)
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(names[0]))
	if err != nil {
		return nil, fmt.Errorf("%w: message type %q: %w", errNotReplayable, names[0], err)
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(res.Body, m); err != nil {
		return nil, fmt.Errorf("%w: %w", errNotReplayable, err)
	}
	return m, nil
}
