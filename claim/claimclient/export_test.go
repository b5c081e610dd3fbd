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

// NewTransportWithClock is NewTransport on c; a nil Budget gets one of its
// own on c.Now.
func NewTransportWithClock(base http.RoundTripper, o Options, c Clock) (*Transport, error) {
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
	return newTransport(base, o, h)
}

// NewRetryBudgetWithClock is NewRetryBudget on now.
func NewRetryBudgetWithClock(o BudgetOptions, now func() time.Time) (*RetryBudget, error) {
	return newRetryBudget(o, now)
}

// Request and TryRetry expose the budget's accounting to its test.
func (b *RetryBudget) Request()       { b.request() }
func (b *RetryBudget) TryRetry() bool { return b.tryRetry() }
