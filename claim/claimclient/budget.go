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

// BudgetOptions configure a [RetryBudget]. The zero value is usable.
type BudgetOptions struct {
	// Ratio is the fraction of requests that may be retried over the
	// window, between 0 and 1. Defaults to 0.1 (10%).
	Ratio float64
	// Floor is how many retries the window allows on top of the ratio, so
	// a client with little traffic can still retry. Defaults to 10; a
	// negative Floor means none.
	Floor int
	// Window is the length of the sliding window. Defaults to 10s; at
	// least 10ms.
	Window time.Duration
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
	return newRetryBudget(o, time.Now)
}

func newRetryBudget(o BudgetOptions, now func() time.Time) (*RetryBudget, error) {
	switch {
	case o.Ratio < 0 || o.Ratio > 1:
		return nil, configErr("BudgetOptions.Ratio must be between 0 and 1, got %v", o.Ratio)
	case o.Ratio == 0:
		o.Ratio = defaultBudgetRatio
	}
	switch {
	case o.Floor < 0:
		o.Floor = 0
	case o.Floor == 0:
		o.Floor = defaultBudgetFloor
	}
	switch {
	case o.Window == 0:
		o.Window = defaultBudgetWindow
	case o.Window < 10*time.Millisecond:
		return nil, configErr("BudgetOptions.Window must be at least 10ms")
	}
	return &RetryBudget{ratio: o.Ratio, floor: o.Floor, slot: o.Window / budgetSlots, now: now}, nil
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
