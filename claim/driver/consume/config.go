package consume

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// Config is what every consumer adapter configures, for its broker's
// message type M. Each adapter embeds it and its options are one-line
// translations onto the setters, whose errors it wraps in its ErrConfig.
type Config[M any] struct {
	Identity  func(M) string
	Operation func(M) string
	Tenant    func(M) string
	Log       *slog.Logger
	Delays    Delays
	// DeadLetter, when set, is called with each message given up on.
	DeadLetter func(context.Context, M, error)
	// Limit is the broker's delivery limit; 0 is none.
	Limit int
	Meter metric.MeterProvider
}

// NewConfig returns a Config with the shared defaults (discarded logs,
// DefaultDelays) and the adapter's identity, operation and tenant.
func NewConfig[M any](identity, operation, tenant func(M) string) Config[M] {
	return Config[M]{Identity: identity, Operation: operation, Tenant: tenant,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Delays: DefaultDelays}
}

func set[T any](dst *T, v T, isNil bool, option, what string) error {
	if isNil {
		return fmt.Errorf("%s: nil %s", option, what)
	}
	*dst = v
	return nil
}

// SetIdentity sets Identity; f must not be nil.
func (c *Config[M]) SetIdentity(f func(M) string) error {
	return set(&c.Identity, f, f == nil, "WithIdentity", "function")
}

// SetOperation sets Operation; f must not be nil.
func (c *Config[M]) SetOperation(f func(M) string) error {
	return set(&c.Operation, f, f == nil, "WithOperation", "function")
}

// SetTenant sets Tenant; f must not be nil.
func (c *Config[M]) SetTenant(f func(M) string) error {
	return set(&c.Tenant, f, f == nil, "WithTenant", "function")
}

// SetLogger sets Log; l must not be nil.
func (c *Config[M]) SetLogger(l *slog.Logger) error {
	return set(&c.Log, l, l == nil, "WithLogger", "logger")
}

// SetDeadLetter sets DeadLetter; f must not be nil.
func (c *Config[M]) SetDeadLetter(f func(context.Context, M, error)) error {
	return set(&c.DeadLetter, f, f == nil, "WithDeadLetter", "function")
}

// SetMeterProvider sets Meter; mp must not be nil.
func (c *Config[M]) SetMeterProvider(mp metric.MeterProvider) error {
	return set(&c.Meter, mp, mp == nil, "WithMeterProvider", "MeterProvider")
}

// SetRetryDelay sets Delays.Retry; d must be positive.
func (c *Config[M]) SetRetryDelay(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("WithRetryDelay: %v is not positive", d)
	}
	c.Delays.Retry = d
	return nil
}

// SetUncertainDelay sets Delays.Uncertain; d must be positive.
func (c *Config[M]) SetUncertainDelay(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("WithUncertainDelay: %v is not positive", d)
	}
	c.Delays.Uncertain = d
	return nil
}

// SetDeliveryLimit sets Limit; n must not be negative.
func (c *Config[M]) SetDeliveryLimit(n int) error {
	if n < 0 {
		return fmt.Errorf("WithDeliveryLimit: %d is negative", n)
	}
	c.Limit = n
	return nil
}
