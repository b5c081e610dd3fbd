package claimhttp

import (
	"sync"
	"time"
)

// Defaults of a [RetryBudget].
const (
	DefaultBudgetRatio  = 0.1
	DefaultBudgetFloor  = 10
	DefaultBudgetWindow = 10 * time.Second
)

// budgetSlots is the resolution of the sliding window.
const budgetSlots = 10

// BudgetOptions configure a [RetryBudget].
type BudgetOptions struct {
	// Ratio is the fraction of requests that may be retried over the
	// window, between 0 and 1. Defaults to 0.1 (10%).
	Ratio float64
	// Floor is how many retries the window allows on top of the ratio, so
	// a client with little traffic can still retry. Defaults to 10; set
	// NoFloor for none.
	Floor int
	// NoFloor makes the floor zero.
	NoFloor bool
	// Window is the length of the sliding window. Defaults to 10s; at
	// least 10ms.
	Window time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// RetryBudget bounds retries to Floor + Ratio × requests over a sliding
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

// NewRetryBudget returns a budget. Errors: [ErrConfig] naming the bad
// option.
func NewRetryBudget(o BudgetOptions) (*RetryBudget, error) {
	switch {
	case o.Ratio < 0 || o.Ratio > 1:
		return nil, configErr("BudgetOptions.Ratio must be between 0 and 1, got %v", o.Ratio)
	case o.Ratio == 0:
		o.Ratio = DefaultBudgetRatio
	}
	switch {
	case o.NoFloor:
		o.Floor = 0
	case o.Floor < 0:
		return nil, configErr("BudgetOptions.Floor must not be negative")
	case o.Floor == 0:
		o.Floor = DefaultBudgetFloor
	}
	switch {
	case o.Window == 0:
		o.Window = DefaultBudgetWindow
	case o.Window < 10*time.Millisecond:
		return nil, configErr("BudgetOptions.Window must be at least 10ms")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &RetryBudget{ratio: o.Ratio, floor: o.Floor, slot: o.Window / budgetSlots, now: o.Now}, nil
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

// Request records an original (not retried) request.
func (b *RetryBudget) Request() {
	b.mu.Lock()
	s, _, _ := b.current()
	s.requests++
	b.mu.Unlock()
}

// TryRetry withdraws one retry and reports true when the window allows it,
// and reports false, recording nothing, when the budget is spent.
func (b *RetryBudget) TryRetry() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, requests, retries := b.current()
	if float64(retries) >= float64(b.floor)+b.ratio*float64(requests) {
		return false
	}
	s.retries++
	return true
}
