package claimgrpc

import (
	"context"
	"log/slog"
	"time"

	"github.com/oncekey/oncekey/claim/driver/settle"
)

// Option configures [UnaryServerInterceptor]. An option given a bad value
// makes UnaryServerInterceptor fail with an error that matches [ErrConfig]
// and names the option.
type Option func(*config) error

type config struct {
	tenant    func(ctx context.Context) (string, error)
	operation func(ctx context.Context, fullMethod string) string
	methods   func(fullMethod string) bool
	settle.Settings
}

// WithOperation names the operation of a call from its context and full
// method ("/pkg.Service/Method"); keys of different operations never
// interact. Defaults to the full method. An empty name answers Internal
// and claims nothing. fn must not be nil.
func WithOperation(fn func(ctx context.Context, fullMethod string) string) Option {
	return func(c *config) error {
		if fn == nil {
			return configErr("WithOperation: nil function")
		}
		c.operation = fn
		return nil
	}
}

// WithMethods selects the methods the interceptor guards: calls of a full
// method for which fn returns false pass through untouched, with or without
// a key (reads, for example). Defaults to every unary method. fn must not
// be nil.
func WithMethods(fn func(fullMethod string) bool) Option {
	return func(c *config) error {
		if fn == nil {
			return configErr("WithMethods: nil function")
		}
		c.methods = fn
		return nil
	}
}

// WithRetryAfter sets the retry delay (errdetails.RetryInfo) sent with
// Aborted and Unavailable answers, capped at the holder's remaining lease
// for a call in progress; must be positive. Defaults to 1s.
func WithRetryAfter(d time.Duration) Option {
	return func(c *config) error { return configErrOf(c.SetRetryAfter(d)) }
}

// WithFinishTimeout bounds how long the caller waits for the durable step
// after a handler returned (complete, fail, mark uncertain, release),
// retried while the store is unreachable; must be positive. The step runs
// detached from the caller's cancellation, so a caller that went away
// still leaves a stored result for its retry. If it is still not written
// then, the caller gets Aborted (ReasonPending) and the interceptor keeps
// the lease renewed and goes on trying in the background until the lease
// runs out; retries see the operation in progress meanwhile. Defaults to
// 10s.
func WithFinishTimeout(d time.Duration) Option {
	return func(c *config) error { return configErrOf(c.SetFinishTimeout(d)) }
}

// WithLogger logs failures of those steps with l, by operation identity
// only (never a key, tenant or message). Defaults to discarding.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error { return configErrOf(c.SetLogger(l)) }
}

func newConfig(tenant func(ctx context.Context) (string, error), opts []Option) (config, error) {
	c := config{
		tenant:    tenant,
		operation: func(_ context.Context, fullMethod string) string { return fullMethod },
		methods:   func(string) bool { return true },
		Settings:  settle.DefaultSettings(),
	}
	if tenant == nil {
		return c, configErr("nil tenant function (the tenant must come from authentication)")
	}
	for _, o := range opts {
		if o == nil {
			return c, configErr("nil Option")
		}
		if err := o(&c); err != nil {
			return c, err
		}
	}
	return c, nil
}

// configErrOf wraps a shared setting's error in ErrConfig.
func configErrOf(err error) error {
	if err != nil {
		return configErr("%w", err)
	}
	return nil
}
