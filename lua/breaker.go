package lua

import (
	"sync"
	"sync/atomic"
	"time"
)

// BreakerState is the state of the circuit breaker in front of Redis.
type BreakerState int

// The breaker's states.
const (
	// Closed: calls go to Redis; consecutive failures are counted.
	Closed BreakerState = iota
	// Open: calls fail at once with [ErrBreakerOpen] until the cool-down
	// has passed.
	Open
	// HalfOpen: the cool-down has passed and one probe call is in flight;
	// others still fail at once. The probe's success closes the breaker,
	// its failure opens it for another cool-down.
	HalfOpen
)

// String returns "closed", "open" or "half-open", for logs and metric labels.
func (s BreakerState) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half-open"
	}
	return "unknown"
}

// BreakerOptions configure the breaker.
type BreakerOptions struct {
	// Failures is how many consecutive failed calls open the breaker.
	// Defaults to 5.
	Failures int
	// CoolDown is how long the breaker stays open before it lets one probe
	// through. Defaults to 1s.
	CoolDown time.Duration
	// NowFunc returns the current time; tests inject a clock. Only
	// differences between its results are used (time.Now's monotonic
	// reading). Defaults to time.Now.
	NowFunc func() time.Time
}

// Breaker is a small consecutive-failure circuit breaker. It is safe for
// concurrent use. Every [Breaker.Allow] that returns ok must be followed by
// exactly one of [Breaker.Success], [Breaker.Failure] or [Breaker.Abandon]
// with the probe flag Allow returned.
type Breaker struct {
	failures int
	coolDown time.Duration
	now      func() time.Time
	onChange func(BreakerState)

	// state and fails are written under mu and also read without it, so
	// that a closed breaker with no failures admits and records calls
	// without taking the lock.
	state atomic.Int32
	fails atomic.Int64

	mu       sync.Mutex
	openedAt time.Time
	probing  bool
}

// NewBreaker returns a closed breaker. Zero options take their defaults.
// onChange, when not nil, is called on every state change with the new
// state, while the breaker's lock is held: it must be quick and must not
// call the breaker.
func NewBreaker(opts BreakerOptions, onChange func(BreakerState)) *Breaker {
	b := &Breaker{failures: opts.Failures, coolDown: opts.CoolDown, now: opts.NowFunc, onChange: onChange}
	if b.failures <= 0 {
		b.failures = 5
	}
	if b.coolDown <= 0 {
		b.coolDown = time.Second
	}
	if b.now == nil {
		b.now = time.Now
	}
	return b
}

// State returns the current state. An open breaker whose cool-down has
// passed still reports Open until a call arrives and becomes the probe.
func (b *Breaker) State() BreakerState { return BreakerState(b.state.Load()) }

// Allow reports whether a call may go to Redis now, and whether that call
// is the half-open probe.
func (b *Breaker) Allow() (probe, ok bool) {
	if b.State() == Closed {
		return false, true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.State() {
	case Closed:
		return false, true
	case Open:
		if b.now().Sub(b.openedAt) < b.coolDown {
			return false, false
		}
		b.set(HalfOpen)
	}
	// Half-open: one probe at a time.
	if b.probing {
		return false, false
	}
	b.probing = true
	return true, true
}

// Success records a call that Redis answered. A probe's success closes the
// breaker; a success that was admitted before the breaker opened does not.
func (b *Breaker) Success(probe bool) {
	if !probe && b.State() == Closed && b.fails.Load() == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case probe && b.State() == HalfOpen:
		b.probing = false
		b.fails.Store(0)
		b.set(Closed)
	case b.State() == Closed:
		b.fails.Store(0)
	}
}

// Failure records a failed call. The configured number of consecutive
// failures opens a closed breaker; a probe's failure opens it again for
// another cool-down. Failures of calls admitted before the breaker opened
// do not extend the cool-down.
func (b *Breaker) Failure(probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case probe && b.State() == HalfOpen:
		b.probing = false
		b.open()
	case b.State() == Closed:
		if b.fails.Add(1) >= int64(b.failures) {
			b.open()
		}
	}
}

// Abandon records a call whose outcome says nothing about Redis, because
// the caller's own context ended first. An abandoned probe lets the next
// call probe instead.
func (b *Breaker) Abandon(probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe && b.State() == HalfOpen {
		b.probing = false
	}
}

func (b *Breaker) open() {
	b.openedAt = b.now()
	b.fails.Store(0)
	b.set(Open)
}

func (b *Breaker) set(s BreakerState) {
	if b.State() == s {
		return
	}
	b.state.Store(int32(s))
	if b.onChange != nil {
		b.onChange(s)
	}
}
