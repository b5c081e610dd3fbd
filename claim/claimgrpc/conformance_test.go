package claimgrpc_test

import (
	"context"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/oncekey/oncekey/claim/claimgrpc"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/entrytest"
	"github.com/oncekey/oncekey/testkit/loopback"
	"github.com/oncekey/oncekey/testkit/settletest"
)

// The entry-point conformance suite against the server interceptor. Its
// top-level tests are not parallel, so no other test of the package runs
// beside them: the negative controls break the settlement of the whole
// process.

func TestConformance(t *testing.T) { entrytest.Run(t, grpcDriver{}) }

func TestConformance_BrokenSettlementsAreCaught(t *testing.T) {
	settletest.CatchBroken(t, grpcDriver{})
}

// conformanceDomain marks the suite's business failures: a
// FailedPrecondition with an ErrorInfo of this domain, stored as failed.
const conformanceDomain = "entrytest"

type grpcDriver struct{}

func (grpcDriver) Caps() entrytest.Caps {
	return entrytest.Caps{Tenant: "t1", NotApplicable: map[string]string{
		entrytest.Oversized: "claimgrpc stores every reply whole: it has no result size limit of its own (gRPC's max message size bounds the transport, not what is stored)",
	}}
}

// conformanceService is the test service's Create, calling the suite's
// handler with the request's "payload" field.
type conformanceService struct{ env entrytest.Env }

func (s conformanceService) create(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
	p, _ := in.AsMap()["payload"].(string)
	resp := s.env.Handler(ctx, claimgrpc.OperationID(ctx), []byte(p))
	switch resp.Kind {
	case entrytest.Unknown:
		if err := claimgrpc.MarkUncertain(ctx); err != nil {
			s.env.T.Errorf("MarkUncertain: %v", err)
		}
		return nil, status.Error(codes.Unavailable, "downstream outcome unknown")
	case entrytest.Failure:
		return nil, failure(string(resp.Body)).Err()
	}
	return structpb.NewStruct(map[string]any{"body": string(resp.Body)})
}

func failure(msg string) *status.Status {
	st, err := status.New(codes.FailedPrecondition, msg).WithDetails(&errdetails.ErrorInfo{Reason: "DECLINED", Domain: conformanceDomain})
	if err != nil {
		panic(err)
	}
	return st
}

func (grpcDriver) Start(env entrytest.Env) entrytest.Adapter {
	t := env.T
	guard, err := claimgrpc.UnaryServerInterceptor(env.Claimer, tenantOf)
	if err != nil {
		t.Fatal(err)
	}
	// recoverPanics: grpc-go does not recover a handler's panic; a
	// production server's recovery interceptor does, outside the guard.
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(recoverPanics, authenticate, guard))
	srv.RegisterService(&ordersDesc, conformanceService{env: env})
	return &grpcAdapter{cc: dial(t, loopback.Serve(t, srv.Serve, srv.Stop))}
}

// Encode is what an operator or a Reconciler stores to resolve a call of
// this service: the interceptor's own format, from its exported encoders.
func (grpcDriver) Encode(r entrytest.Response) durable.Result {
	var (
		res durable.Result
		err error
	)
	if r.Kind == entrytest.Failure {
		res, err = claimgrpc.StatusResult(failure(string(r.Body)))
	} else {
		var m *structpb.Struct
		if m, err = structpb.NewStruct(map[string]any{"body": string(r.Body)}); err == nil {
			res, err = claimgrpc.ReplyResult(m)
		}
	}
	if err != nil {
		panic(err)
	}
	return res
}

type grpcAdapter struct{ cc *grpc.ClientConn }

func (a *grpcAdapter) Send(ctx context.Context, key string, payload []byte) entrytest.Answer {
	req, err := structpb.NewStruct(map[string]any{"payload": string(payload)})
	if err != nil {
		return entrytest.Answer{Outcome: entrytest.Error, Detail: err.Error()}
	}
	ctx = metadata.NewOutgoingContext(ctx, metadata.Pairs("authorization", "Bearer t1", claimgrpc.MetadataKey, key))
	var (
		out             structpb.Struct
		header, trailer metadata.MD
	)
	err = a.cc.Invoke(ctx, createMethod, req, &out, grpc.Header(&header), grpc.Trailer(&trailer))
	replayed := len(header.Get(claimgrpc.MetadataReplayed)) > 0 || len(trailer.Get(claimgrpc.MetadataReplayed)) > 0
	outcome := entrytest.Executed
	if replayed {
		outcome = entrytest.Replayed
	}
	if err == nil {
		body, _ := out.AsMap()["body"].(string)
		return entrytest.Answer{Outcome: outcome, Detail: "OK", Result: entrytest.Result{Body: []byte(body)}}
	}
	st := status.Convert(err)
	detail := st.Code().String()
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok {
			continue
		}
		switch info.GetDomain() {
		case conformanceDomain:
			return entrytest.Answer{Outcome: outcome, Detail: detail, Result: entrytest.Result{Failed: true, Body: []byte(st.Message())}}
		case claimgrpc.Domain:
			detail += " " + info.GetReason()
			switch info.GetReason() {
			case claimgrpc.ReasonInProgress, claimgrpc.ReasonPending:
				return entrytest.Answer{Outcome: entrytest.InProgress, Detail: detail}
			case claimgrpc.ReasonUncertain:
				return entrytest.Answer{Outcome: entrytest.Uncertain, Detail: detail}
			case claimgrpc.ReasonKeyReused:
				return entrytest.Answer{Outcome: entrytest.Rejected, Detail: detail}
			}
		}
	}
	return entrytest.Answer{Outcome: entrytest.Error, Detail: detail + ": " + st.Message()}
}
