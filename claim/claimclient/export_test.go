package claimclient

import (
	"context"
	"net/http"
	"time"
)

// Clock is what a test injects into a Transport or a RetryBudget in place
// of the real clock, sleep and randomness.
type Clock struct {
	Now    func() time.Time
	Sleep  func(ctx context.Context, d time.Duration) error
	Jitter func(n time.Duration) time.Duration // nil: the default
}

// NewTransportWithClock is NewTransport on c; without WithBudget the
// transport gets a budget of its own on c.Now.
func NewTransportWithClock(base http.RoundTripper, c Clock, opts ...Option) (*Transport, error) {
	h := defaultHooks()
	if c.Now != nil {
		h.now = c.Now
	}
	if c.Sleep != nil {
		h.sleep = c.Sleep
	}
	if c.Jitter != nil {
		h.jitter = c.Jitter
	}
	return newTransport(base, opts, h)
}

// NewRetryBudgetWithClock is NewRetryBudget on now.
func NewRetryBudgetWithClock(now func() time.Time, opts ...BudgetOption) (*RetryBudget, error) {
	return newRetryBudget(opts, now)
}

// Request and TryRetry expose the budget's accounting to its test.
func (b *RetryBudget) Request()       { b.request() }
func (b *RetryBudget) TryRetry() bool { return b.tryRetry() }
