package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/claim/claimgrpc"
	"github.com/oncekey/oncekey/durable"
)

// grpc-windows: the entry-point windows through claimgrpc's server
// interceptor. The service has one unary method taking and returning a
// BytesValue (a registered message, so a replay can decode it); the
// handler runs the family's work and answers its body. Clients send the
// idempotency key as metadata and retry until a reply (or a final status)
// comes: a reply, first or replayed, is recorded as the stored result it
// must be. The caller-gone window cancels the client's call after the
// effect; the transport's timer is the call's deadline, shorter than the
// work.

const grpcMethod = "/oncekey.chaos.Ops/Do"

type grpcEntry struct {
	x    *entry
	srv  *grpc.Server
	conn *grpc.ClientConn

	mu   sync.Mutex
	sent map[*op]map[int]int // calls per client
}

// grpcResult is the result claimgrpc stores for a reply of body.
func grpcResult(body []byte) durable.Result {
	res, _ := claimgrpc.ReplyResult(wrapperspb.Bytes(body))
	return res
}

func setupGRPCWindows(ctx context.Context, e *env) (*workload, error) {
	x, err := e.newEntry(ctx, allWindows, grpcResult)
	if err != nil {
		return nil, err
	}
	g := &grpcEntry{x: x, sent: map[*op]map[int]int{}}
	lease := e.cfg.Lease
	x.duplicate = func(ctx context.Context, o *op) {
		e.bgs.Add(1) // waited for before the verification pass
		go func() { defer e.bgs.Done(); g.attempt(ctx, x.w, o, e.cfg.Clients) }()
	}
	x.timer, x.timerFault = 2*lease, "deadline-exceeded-during-work"
	if err := x.start(); err != nil {
		return nil, err
	}
	icpt, err := claimgrpc.UnaryServerInterceptor(x.server, func(context.Context) (string, error) { return e.tenant, nil },
		claimgrpc.WithOperation(func(context.Context, string) string { return e.name }),
		claimgrpc.WithFinishTimeout(lease/3), claimgrpc.WithRetryAfter(lease/5), claimgrpc.WithLogger(e.log))
	if err != nil {
		return nil, fmt.Errorf("%w: claimgrpc: %w", ErrSetup, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("%w: listen: %w", ErrSetup, err)
	}
	g.srv = grpc.NewServer(grpc.ChainUnaryInterceptor(g.recovered, icpt))
	g.srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "oncekey.chaos.Ops",
		HandlerType: (*any)(nil),
		Methods:     []grpc.MethodDesc{{MethodName: "Do", Handler: g.method}},
	}, g)
	go func() { _ = g.srv.Serve(ln) }()
	e.onClose(g.srv.Stop)
	if g.conn, err = grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return nil, fmt.Errorf("%w: grpc client: %w", ErrSetup, err)
	}
	e.onClose(func() { _ = g.conn.Close() })
	x.w.entry = g
	x.w.run = x.runClients
	return x.w, nil
}

// method is the service's one method, as generated code would write it.
func (g *grpcEntry) method(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
	in := new(wrapperspb.BytesValue)
	if err := dec(in); err != nil {
		return nil, err
	}
	h := func(ctx context.Context, req any) (any, error) { return g.handle(ctx) }
	if icpt == nil {
		return h(ctx, in)
	}
	return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: grpcMethod}, h)
}

// recovered is the outermost interceptor: it notes the call's arrival and
// turns a panic that went through claimgrpc's into Internal, as a server
// process that survives its handlers' panics does.
func (g *grpcEntry) recovered(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (resp any, err error) {
	if o := g.opOf(ctx); o != nil {
		g.x.arrived(o)
	}
	defer func() {
		if v := recover(); v != nil {
			resp, err = nil, status.Error(codes.Internal, fmt.Sprint("handler panicked: ", v))
		}
	}()
	return next(ctx, req)
}

func (g *grpcEntry) opOf(ctx context.Context) *op {
	md, _ := metadata.FromIncomingContext(ctx)
	if keys := md.Get(claimgrpc.MetadataKey); len(keys) == 1 {
		return g.x.e.byKey[keys[0]]
	}
	return nil
}

// handle runs the family's work under claimgrpc's lease.
func (g *grpcEntry) handle(ctx context.Context) (any, error) {
	o := g.opOf(ctx)
	tok, ok := claimgrpc.Token(ctx)
	if o == nil || !ok {
		return nil, status.Error(codes.InvalidArgument, "unknown operation")
	}
	body, err := g.x.work(ctx, o, claimgrpc.OperationID(ctx), tok)
	switch {
	case errors.Is(err, errEffectUnknown):
		_ = claimgrpc.MarkUncertain(ctx)
		return nil, status.Error(codes.Unknown, "the effect's outcome is unknown")
	case err != nil:
		// Refused by the downstream before any effect: nothing happened.
		_ = claimgrpc.ReleaseKey(ctx)
		return nil, status.Error(codes.Unavailable, "downstream unavailable")
	}
	return wrapperspb.Bytes(body), nil
}

// attempt is one call of client c, its key in metadata.
func (g *grpcEntry) attempt(ctx context.Context, w *workload, o *op, c int) bool {
	e, x := g.x.e, g.x
	epoch, fp, _ := o.get()
	g.mu.Lock()
	if g.sent[o] == nil {
		g.sent[o] = map[int]int{}
	}
	n := g.sent[o][c]
	g.sent[o][c]++
	g.mu.Unlock()
	timeout := w.timeout
	if n == 0 && x.window(o) == winTimer {
		timeout = e.cfg.Lease / 2 // the call's deadline falls during the work
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if x.window(o) == winCallerGone {
		defer x.calls.add(o, cancel)()
	}
	actx = metadata.AppendToOutgoingContext(actx, claimgrpc.MetadataKey, o.scope.Key)
	req := wrapperspb.Bytes(fmt.Appendf(nil, `{"op":%q,"epoch":%d}`, o.key, epoch))
	reply := new(wrapperspb.BytesValue)
	var header metadata.MD
	call := history.Call{Key: o.key, Epoch: epoch, Client: c, Fingerprint: fp, Start: e.rec.Now()}
	err := g.conn.Invoke(actx, grpcMethod, req, reply, grpc.Header(&header))
	call.End = e.rec.Now()
	final := false
	switch code := status.Code(err); {
	case err == nil:
		// The reply as stored: what every replay must decode from.
		stored, merr := proto.MarshalOptions{Deterministic: true}.Marshal(reply)
		if merr != nil {
			stored = nil
		}
		call.Kind, call.Body, call.Status = history.Replay, history.Hash(stored), int(codes.OK)
		final = true
		if len(header.Get(claimgrpc.MetadataReplayed)) > 0 {
			e.observe("grpc-replayed")
		}
	case code == codes.FailedPrecondition:
		call.Kind, call.Note = history.Mismatch, err.Error()
		final = true
	case code == codes.DeadlineExceeded && timeout < w.timeout:
		e.fault(x.timerFault)
		call.Kind, call.Note = history.NoEffect, err.Error()
	default:
		call.Kind, call.Note = history.NoEffect, err.Error()
		e.observe("grpc-" + code.String())
	}
	if call.Kind == history.Replay {
		// The acquisitions are recorded by the store (recStore), with the
		// fingerprint claimgrpc derived from the message, not this label:
		// the two cannot be compared, so the replay is judged by its body.
		call.Fingerprint = ""
	}
	e.rec.Add(call)
	return final
}
