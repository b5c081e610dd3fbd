package claimclient

import (
	"sync"
	"time"
)

// Defaults of a [RetryBudget].
const (
	defaultBudgetRatio  = 0.1
	defaultBudgetFloor  = 10
	defaultBudgetWindow = 10 * time.Second
)

// budgetSlots is the resolution of the sliding window.
const budgetSlots = 10

// BudgetOption configures a [RetryBudget]. An option given a bad value
// makes [NewRetryBudget] fail with an error that matches [ErrConfig] and
// names the option.
type BudgetOption func(*budgetConfig) error

type budgetConfig struct {
	ratio  float64
	floor  int
	window time.Duration
}

// WithRatio sets the fraction of requests that may be retried over the
// window, between 0 and 1. Defaults to 0.1 (10%).
func WithRatio(r float64) BudgetOption {
	return func(c *budgetConfig) error {
		if !(r >= 0 && r <= 1) {
			return configErr("WithRatio: must be between 0 and 1, got %v", r)
		}
		c.ratio = r
		return nil
	}
}

// WithFloor sets how many retries the window allows on top of the ratio,
// so a client with little traffic can still retry. Defaults to 10; 0
// means none; must not be negative.
func WithFloor(n int) BudgetOption {
	return func(c *budgetConfig) error {
		if n < 0 {
			return configErr("WithFloor: must not be negative, got %d", n)
		}
		c.floor = n
		return nil
	}
}

// WithWindow sets the length of the sliding window. Defaults to 10s; at
// least 10ms.
func WithWindow(d time.Duration) BudgetOption {
	return func(c *budgetConfig) error {
		if d < 10*time.Millisecond {
			return configErr("WithWindow: must be at least 10ms, got %v", d)
		}
		c.window = d
		return nil
	}
}

// RetryBudget bounds retries to floor + ratio × requests over a sliding
// window, so that clients retrying through an incident add at most that
// fraction of load instead of multiplying it by their attempt count
// (retry amplification). A budget may be shared by several [Transport]s.
// It is safe for concurrent use.
type RetryBudget struct {
	ratio float64
	floor int
	slot  time.Duration
	now   func() time.Time

	mu    sync.Mutex
	slots [budgetSlots]budgetSlot
}

type budgetSlot struct {
	index             int64 // which slot of time this counts; stale when old
	requests, retries int
}

// NewRetryBudget returns a budget configured by opts; with none, the
// defaults: 10% of requests plus 10 per 10s window. Errors: [ErrConfig]
// naming the bad option.
func NewRetryBudget(opts ...BudgetOption) (*RetryBudget, error) {
	return newRetryBudget(opts, time.Now)
}

func newRetryBudget(opts []BudgetOption, now func() time.Time) (*RetryBudget, error) {
	c := budgetConfig{ratio: defaultBudgetRatio, floor: defaultBudgetFloor, window: defaultBudgetWindow}
	for _, opt := range opts {
		if opt == nil {
			return nil, configErr("nil BudgetOption")
		}
		if err := opt(&c); err != nil {
			return nil, err
		}
	}
	return &RetryBudget{ratio: c.ratio, floor: c.floor, slot: c.window / budgetSlots, now: now}, nil
}

// current returns the slot for now, reset if it held an older period, and
// the sums over the window. b.mu is held.
func (b *RetryBudget) current() (s *budgetSlot, requests, retries int) {
	idx := b.now().UnixNano() / int64(b.slot)
	s = &b.slots[idx%budgetSlots]
	if s.index != idx {
		*s = budgetSlot{index: idx}
	}
	for i := range b.slots {
		if t := &b.slots[i]; idx-t.index < budgetSlots {
			requests += t.requests
			retries += t.retries
		}
	}
	return s, requests, retries
}

// request records an original (not retried) request.
func (b *RetryBudget) request() {
	b.mu.Lock()
	s, _, _ := b.current()
	s.requests++
	b.mu.Unlock()
}

// tryRetry withdraws one retry and reports true when the window allows it,
// and reports false, recording nothing, when the budget is spent.
func (b *RetryBudget) tryRetry() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, requests, retries := b.current()
	if float64(retries) >= float64(b.floor)+b.ratio*float64(requests) {
		return false
	}
	s.retries++
	return true
}
