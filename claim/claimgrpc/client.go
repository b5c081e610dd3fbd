package claimgrpc

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/oncekey/oncekey/durable"
)

type keyCtx struct{}

// KeyContext returns a context whose calls through the client interceptor
// carry key: use it when the caller keeps its own key for a logical
// operation (for example stored with a job, so a restarted caller retries
// under the same key). The interceptor replaces any idempotency-key
// metadata already in ctx with it.
func KeyContext(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyCtx{}, key)
}

// ClientOption configures [UnaryClientInterceptor]. An option given a bad
// value makes UnaryClientInterceptor fail with an error that matches
// [ErrConfig] and names the option.
type ClientOption func(*clientConfig) error

type clientConfig struct {
	attempts int
	maxDelay time.Duration
	newKey   func() string
	guarded  func(fullMethod string) bool
}

// WithAttempts makes the client interceptor try a call up to n times in
// all, under the same key, while the answer shows that the server guards
// the method (so a retry cannot run it twice) and that a retry is useful.
// It retries:
//
//   - the server interceptor's own answers, which carry an ErrorInfo of
//     [Domain]: Unavailable with [ReasonUnavailable] (the call did not
//     run), Aborted with [ReasonInProgress] or [ReasonPending];
//   - any other Unavailable (a connection refused or dropped, a proxy's,
//     the handler's own) only for the methods [WithGuardedMethods]
//     names: such an answer carries nothing from the interceptor, so
//     only the caller can know that the method is guarded;
//
// and never an answer marked replayed ([MetadataReplayed]): a replay is
// the operation's stored result, final whatever its code. It waits the
// answer's RetryInfo delay (else a backoff from 100ms), at most
// WithMaxDelay, within the call's context. Defaults to 1 (no retries). n
// must be at least 1.
func WithAttempts(n int) ClientOption {
	return func(c *clientConfig) error {
		if n < 1 {
			return configErr("WithAttempts: must be at least 1, got %d", n)
		}
		c.attempts = n
		return nil
	}
}

// WithMaxDelay bounds the wait between two attempts. Defaults to 5s; must
// be positive.
func WithMaxDelay(d time.Duration) ClientOption {
	return func(c *clientConfig) error {
		if d <= 0 {
			return configErr("WithMaxDelay: must be positive, got %v", d)
		}
		c.maxDelay = d
		return nil
	}
}

// WithKeyFunc sets how the client interceptor makes a key for a call that
// has none: once per logical call, reused by every attempt. Each key must
// be unique and 1 to 255 printable ASCII characters. Defaults to a random
// UUID. fn must not be nil.
func WithKeyFunc(fn func() string) ClientOption {
	return func(c *clientConfig) error {
		if fn == nil {
			return configErr("WithKeyFunc: nil function")
		}
		c.newKey = fn
		return nil
	}
}

// WithGuardedMethods names the methods (full names, "/pkg.Service/Method")
// that the server guards with [UnaryServerInterceptor]: for them
// [WithAttempts] also retries an Unavailable that carries nothing from the
// interceptor, such as a dropped connection. Only a guarded method may be
// retried after an answer that does not say whether the handler ran; name
// one the server does not guard and a retry can run it again. Pass the
// same function as the server's [WithMethods] when client and server share
// it. Defaults to none. fn must not be nil.
func WithGuardedMethods(fn func(fullMethod string) bool) ClientOption {
	return func(c *clientConfig) error {
		if fn == nil {
			return configErr("WithGuardedMethods: nil function")
		}
		c.guarded = fn
		return nil
	}
}

// UnaryClientInterceptor returns a gRPC unary client interceptor that gives
// every call an idempotency key: the one from [KeyContext], else the
// idempotency-key metadata the caller already set, else a new one, made
// once per call of the interceptor (one logical call) and sent by every
// attempt of it, those of WithAttempts and of gRPC's own retry policy
// alike. A key that is not 1 to 255 printable ASCII characters fails the
// call with InvalidArgument before anything is sent.
func UnaryClientInterceptor(opts ...ClientOption) (grpc.UnaryClientInterceptor, error) {
	c := clientConfig{attempts: 1, maxDelay: 5 * time.Second, newKey: uuid.NewString, guarded: func(string) bool { return false }}
	for _, o := range opts {
		if o == nil {
			return nil, configErr("nil ClientOption")
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	return c.intercept, nil
}

func (c *clientConfig) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	md, _ := metadata.FromOutgoingContext(ctx)
	key, set := ctx.Value(keyCtx{}).(string)
	switch {
	case set:
	case len(md.Get(MetadataKey)) > 0:
		key = md.Get(MetadataKey)[0]
		if len(md.Get(MetadataKey)) > 1 {
			return status.Error(codes.InvalidArgument, "claimgrpc: more than one "+MetadataKey+" in the outgoing metadata")
		}
	default:
		key, set = c.newKey(), true
	}
	if err := durable.ValidateKey(key); err != nil {
		return status.Error(codes.InvalidArgument, "claimgrpc: invalid idempotency key: "+err.Error())
	}
	if set {
		md = md.Copy()
		md.Set(MetadataKey, key)
		ctx = metadata.NewOutgoingContext(ctx, md)
	}
	if c.attempts == 1 {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	guarded := c.guarded(method)
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		// The header of each attempt, to see whether it is a replay; the
		// caller's own grpc.Header options still get theirs.
		var header metadata.MD
		err := invoker(ctx, method, req, reply, cc, append(opts[:len(opts):len(opts)], grpc.Header(&header))...)
		if err == nil || attempt >= c.attempts {
			return err
		}
		if len(header.Get(MetadataReplayed)) > 0 {
			return err // the stored result: final
		}
		delay, ok := retryDelay(err, guarded)
		if !ok {
			return err
		}
		if delay <= 0 {
			delay = backoff
			backoff *= 2
		}
		t := time.NewTimer(min(delay, c.maxDelay))
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, status.FromContextError(ctx.Err()).Err())
		case <-t.C:
		}
	}
}

// retryDelay reports whether err, an answer that is not a replay, is worth
// retrying under the same key, and the delay its RetryInfo asks for (0
// when none). guarded says the caller declared the method guarded
// (WithGuardedMethods); otherwise only the server interceptor's own
// answers show that it is.
func retryDelay(err error, guarded bool) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	var delay time.Duration
	retry := guarded && st.Code() == codes.Unavailable
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			delay = d.GetRetryDelay().AsDuration()
		case *errdetails.ErrorInfo:
			if d.GetDomain() != Domain {
				continue
			}
			switch {
			case st.Code() == codes.Unavailable && d.GetReason() == ReasonUnavailable,
				st.Code() == codes.Aborted && (d.GetReason() == ReasonInProgress || d.GetReason() == ReasonPending):
				retry = true
			}
		}
	}
	return delay, retry
}
