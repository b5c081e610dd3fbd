package claimgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimgrpc"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/lua"
	"github.com/oncekey/oncekey/testkit/loopback"
	"github.com/oncekey/oncekey/testkit/settletest"
	"github.com/oncekey/oncekey/testkit/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The test service: one hand-registered method over well-known messages,
// so no protoc step is needed. Create takes and returns a Struct.
const createMethod = "/oncekey.test.Orders/Create"

type ordersService interface {
	create(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error)
}

var ordersDesc = grpc.ServiceDesc{
	ServiceName: "oncekey.test.Orders",
	HandlerType: (*ordersService)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Create",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(structpb.Struct)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				return srv.(ordersService).create(ctx, req.(*structpb.Struct))
			}
			if interceptor == nil {
				return h(ctx, in)
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: createMethod}, h)
		},
	}},
}

// principal is what the (fake) authentication interceptor puts in the
// context: the tests authenticate with "authorization: Bearer <tenant>".
type principalKey struct{}

func authenticate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("authorization"); len(v) == 1 && len(v[0]) > len("Bearer ") {
		ctx = context.WithValue(ctx, principalKey{}, v[0][len("Bearer "):])
	}
	return next(ctx, req)
}

func tenantOf(ctx context.Context) (string, error) {
	t, _ := ctx.Value(principalKey{}).(string)
	if t == "" {
		return "", errors.New("unauthenticated")
	}
	return t, nil
}

// recoverPanics turns a handler panic into Internal, as a production
// server's recovery interceptor would (grpc-go itself does not recover).
func recoverPanics(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = status.Errorf(codes.Internal, "panic: %v", p)
		}
	}()
	return next(ctx, req)
}

// fixture is a gRPC server on a loopback listener whose Create inserts an
// order row into PostgreSQL (the effect), guarded by the interceptor
// unless unguarded.
type fixture struct {
	t      testing.TB
	schema testenv.Schema
	store  durable.Store[pgx.Tx]
	c      *claim.Claimer[pgx.Tx]
	conn   *grpc.ClientConn // with the fixture's client interceptors
	addr   string

	runs  atomic.Int64                                                   // handler runs
	onRun atomic.Pointer[func(ctx context.Context, in *structpb.Struct)] // called at the start of each run
}

type config struct {
	redis     bool
	unguarded bool                        // negative control: no interceptor
	closed    bool                        // the Claimer's pool is closed: the store is down
	outer     grpc.UnaryServerInterceptor // runs before the interceptor (after auth)
	options   []claimgrpc.Option
	client    []grpc.UnaryClientInterceptor
	claim     []claim.Option
	// wrap, when set, puts a wrapper (fault injection) around the store
	// the Claimer uses; the fixture keeps the real one for reads.
	wrap func(storeapi.Store[pgx.Tx]) storeapi.Store[pgx.Tx]
}

func setup(t testing.TB, cfg config) *fixture {
	t.Helper()
	s, st := settletest.Store(t, settletest.Orders)
	f := &fixture{t: t, schema: s, store: st}
	opts := cfg.claim
	if cfg.redis {
		rdb, prefix := testenv.Redis(t)
		opts = append(opts, claim.WithRedis(rdb, lua.Options{Prefix: prefix, Timeout: time.Second}))
	}
	var cs durable.Store[pgx.Tx] = st
	var err error
	if cfg.closed {
		down := testenv.Postgres(t) // a pool of its own, closed before use
		down.Pool.Close()
		if cs, err = postgres.New(down.Pool, postgres.WithSchema(s.Name)); err != nil {
			t.Fatal(err)
		}
	}
	if cfg.wrap != nil {
		cs = cfg.wrap(st)
	}
	if f.c, err = claim.New(cs, opts...); err != nil {
		t.Fatal(err)
	}
	chain := []grpc.UnaryServerInterceptor{recoverPanics, authenticate}
	if cfg.outer != nil {
		chain = append(chain, cfg.outer)
	}
	if !cfg.unguarded {
		guard, err := claimgrpc.UnaryServerInterceptor(f.c, tenantOf, cfg.options...)
		if err != nil {
			t.Fatal(err)
		}
		chain = append(chain, guard)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(chain...))
	srv.RegisterService(&ordersDesc, f)
	f.addr = loopback.Serve(t, srv.Serve, srv.Stop)
	f.conn = f.dial(cfg.client...)
	return f
}

// dial returns a client connection to addr, closed when the test ends.
func dial(t testing.TB, addr string, interceptors ...grpc.UnaryClientInterceptor) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithChainUnaryInterceptor(interceptors...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// dial returns a client connection to the fixture's server.
func (f *fixture) dial(interceptors ...grpc.UnaryClientInterceptor) *grpc.ClientConn {
	f.t.Helper()
	return dial(f.t, f.addr, interceptors...)
}

// create is the guarded handler. Fields of in: "item" (required), "code"
// (after the insert, answer this gRPC code with an ErrorInfo detail),
// "uncertain" (mark uncertain and answer Unavailable), "release" (say
// nothing happened and answer Unavailable, without inserting), "panic"
// (panic after the insert).
func (f *fixture) create(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
	f.runs.Add(1)
	if hook := f.onRun.Load(); hook != nil {
		(*hook)(ctx, in)
	}
	m := in.AsMap()
	if m["release"] == true {
		if err := claimgrpc.ReleaseKey(ctx); err != nil {
			return nil, err
		}
		return nil, status.Error(codes.Unavailable, "dependency down; nothing done")
	}
	tenant, _ := tenantOf(ctx)
	op := claimgrpc.OperationID(ctx)
	item, _ := m["item"].(string)
	var id int64
	if err := f.schema.Pool.QueryRow(ctx, `INSERT INTO orders (tenant, item, op) VALUES ($1, $2, $3) RETURNING id`, tenant, item, op).Scan(&id); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	switch {
	case m["panic"] == true:
		panic("handler broke after its effect")
	case m["uncertain"] == true:
		if err := claimgrpc.MarkUncertain(ctx); err != nil {
			return nil, err
		}
		return nil, status.Error(codes.Unavailable, "downstream timed out")
	}
	if code, ok := m["code"].(float64); ok {
		st, _ := status.New(codes.Code(code), fmt.Sprintf("declined order %d", id)).WithDetails(&errdetails.ErrorInfo{Reason: "DECLINED", Domain: "test", Metadata: map[string]string{"id": fmt.Sprint(id)}})
		return nil, st.Err()
	}
	return structpb.NewStruct(map[string]any{"id": float64(id), "item": item, "op": op, "time": time.Now().Format(time.RFC3339Nano)})
}

// effects counts the order rows of item: the effects that happened.
func (f *fixture) effects(item string) int {
	f.t.Helper()
	var n int
	if err := f.schema.Pool.QueryRow(context.WithoutCancel(f.t.Context()), `SELECT count(*) FROM orders WHERE item = $1`, item).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// records counts the idempotency records: what was reserved.
func (f *fixture) records() int {
	f.t.Helper()
	var n int
	if err := f.schema.Pool.QueryRow(f.t.Context(), `SELECT count(*) FROM idempotency_requests`).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// call sends Create as tenant with key ("" for none) and returns the reply,
// the status, and the response header.
func (f *fixture) call(ctx context.Context, cc *grpc.ClientConn, tenant, key string, in map[string]any) (*structpb.Struct, *status.Status, metadata.MD) {
	f.t.Helper()
	req, err := structpb.NewStruct(in)
	if err != nil {
		f.t.Fatal(err)
	}
	md := metadata.Pairs("authorization", "Bearer "+tenant)
	if key != "" {
		md.Set(claimgrpc.MetadataKey, key)
	}
	ctx = metadata.NewOutgoingContext(ctx, md)
	var out structpb.Struct
	var header metadata.MD
	err = cc.Invoke(ctx, createMethod, req, &out, grpc.Header(&header))
	if err != nil {
		return nil, status.Convert(err), header
	}
	return &out, status.New(codes.OK, ""), header
}

// reason returns the ErrorInfo reason, operation identity and retry delay
// of an interceptor answer.
func reason(st *status.Status) (reason, opID string, retry time.Duration) {
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == claimgrpc.Domain {
				reason, opID = d.GetReason(), d.GetMetadata()["operation_id"]
			}
		case *errdetails.RetryInfo:
			retry = d.GetRetryDelay().AsDuration()
		}
	}
	return reason, opID, retry
}
