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
)

// How a reply is stored in a durable.Result:
//
//   - Version: resultVersion, so a record written by another adapter is not
//     misread;
//   - StatusCode: the gRPC code (0 for OK);
//   - OK: Body is the reply message, marshalled, and the header
//     headerType names its full protobuf name;
//   - not OK: Body is the google.rpc.Status (code, message, details),
//     marshalled.
//
// A replay resolves the reply's type by that name in the global protobuf
// registry (protoregistry.GlobalTypes), where generated code registers
// every message: the interceptor does not see the handler's reply type
// unless the handler runs, and a replay must not run it.
const (
	resultVersion = 1
	headerType    = "Grpc-Message-Type"
)

var errNotReplayable = errors.New("claimgrpc: stored result is not a gRPC reply")

// encodeReply stores the handler's answer: its reply, or its error's status.
func encodeReply(resp any, herr error) (res durable.Result, failed bool, err error) {
	if herr != nil {
		st := status.Convert(herr)
		p := st.Proto()
		if st.Code() == codes.OK { // an error that claims OK is not OK
			p.Code = int32(codes.Unknown)
		}
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(p)
		if err != nil {
			return durable.Result{}, true, err
		}
		return durable.Result{StatusCode: int(p.Code), Body: b, Version: resultVersion}, true, nil
	}
	m, ok := resp.(proto.Message)
	if !ok || m == nil || !m.ProtoReflect().IsValid() {
		return durable.Result{}, false, fmt.Errorf("reply is %T, not a protobuf message", resp)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return durable.Result{}, false, err
	}
	name := string(m.ProtoReflect().Descriptor().FullName())
	return durable.Result{
		StatusCode: int(codes.OK),
		Headers:    map[string][]string{headerType: {name}},
		Body:       b,
		Version:    resultVersion,
	}, false, nil
}

// decodeReply returns the stored answer as the handler gave it: the reply
// message, or the status error. Errors: errNotReplayable.
func decodeReply(res *durable.Result) (any, error) {
	if res.Version != resultVersion {
		return nil, fmt.Errorf("%w: representation version %d", errNotReplayable, res.Version)
	}
	if res.StatusCode != int(codes.OK) {
		var p spb.Status
		if err := proto.Unmarshal(res.Body, &p); err != nil {
			return nil, fmt.Errorf("%w: status: %w", errNotReplayable, err)
		}
		return nil, status.ErrorProto(&p)
	}
	names := res.Headers[headerType]
	if len(names) != 1 {
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
