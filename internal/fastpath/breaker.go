package fastpath

import (
	"sync"
	"sync/atomic"
	"time"
)

// BreakerState is the state of the circuit breaker in front of Redis.
type BreakerState int

// The breaker's states.
const (
	// BreakerClosed: calls go to Redis; consecutive failures are counted.
	BreakerClosed BreakerState = iota
	// BreakerOpen: calls fail at once with [ErrBreakerOpen] until the cool-down
	// has passed.
	BreakerOpen
	// BreakerHalfOpen: the cool-down has passed and one probe call is in flight;
	// others still fail at once. The probe's success closes the breaker,
	// its failure opens it for another cool-down.
	BreakerHalfOpen
)

// String returns "closed", "open" or "half-open", for logs and metric labels.
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	}
	return "unknown"
}

// Defaults of [BreakerOptions], as documented on lua.Options.
const (
	DefaultBreakerFailures = 5
	DefaultBreakerCoolDown = time.Second
)

// BreakerOptions configure the breaker.
type BreakerOptions struct {
	// Failures is how many consecutive failed calls open the breaker.
	// Defaults to [DefaultBreakerFailures].
	Failures int
	// CoolDown is how long the breaker stays open before it lets one probe
	// through. Defaults to [DefaultBreakerCoolDown].
	CoolDown time.Duration
	// Now returns the current time; tests inject a clock. Only
	// differences between its results are used (time.Now's monotonic
	// reading). Defaults to time.Now.
	Now func() time.Time
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
	// trip is closed when the breaker opens from closed, and replaced by
	// a new one when it closes again: a call waiting in the gate's queue
	// stops waiting when it is closed (see [Breaker.tripped]).
	trip chan struct{}
}

// NewBreaker returns a closed breaker. Zero options take their defaults.
// onChange, when not nil, is called on every state change with the new
// state, while the breaker's lock is held: it must be quick and must not
// call the breaker.
func NewBreaker(opts BreakerOptions, onChange func(BreakerState)) *Breaker {
	b := &Breaker{failures: opts.Failures, coolDown: opts.CoolDown, now: opts.Now, onChange: onChange, trip: make(chan struct{})}
	if b.failures <= 0 {
		b.failures = DefaultBreakerFailures
	}
	if b.coolDown <= 0 {
		b.coolDown = DefaultBreakerCoolDown
	}
	if b.now == nil {
		b.now = time.Now
	}
	return b
}

// State returns the current state. An open breaker whose cool-down has
// passed still reports BreakerOpen until a call arrives and becomes the probe.
func (b *Breaker) State() BreakerState { return BreakerState(b.state.Load()) }

// Allow reports whether a call may go to Redis now, and whether that call
// is the half-open probe.
func (b *Breaker) Allow() (probe, ok bool) {
	if b.State() == BreakerClosed {
		return false, true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.State() {
	case BreakerClosed:
		return false, true
	case BreakerOpen:
		if b.now().Sub(b.openedAt) < b.coolDown {
			return false, false
		}
		b.set(BreakerHalfOpen)
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
	if !probe && b.State() == BreakerClosed && b.fails.Load() == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case probe && b.State() == BreakerHalfOpen:
		b.probing = false
		b.fails.Store(0)
		b.set(BreakerClosed)
	case b.State() == BreakerClosed:
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
	case probe && b.State() == BreakerHalfOpen:
		b.probing = false
		b.open()
	case b.State() == BreakerClosed:
		if b.fails.Add(1) >= int64(b.failures) {
			b.open()
		}
	}
}

// Abandon records a call whose outcome says nothing about Redis: the
// caller's own context ended first, or the process saw the call's timeout
// too late to have read a reply in time. It neither counts a failure nor
// clears the count. An abandoned probe lets the next call probe instead.
func (b *Breaker) Abandon(probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe && b.State() == BreakerHalfOpen {
		b.probing = false
	}
}

// tripped returns a channel that is closed once the breaker opens: already
// closed when the breaker is not closed now. A call admitted while the
// breaker was closed and still waiting to be sent gives up when it closes.
func (b *Breaker) tripped() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.trip
}

func (b *Breaker) open() {
	b.openedAt = b.now()
	b.fails.Store(0)
	b.set(BreakerOpen)
}

func (b *Breaker) set(s BreakerState) {
	from := b.State()
	if from == s {
		return
	}
	switch {
	case from == BreakerClosed:
		close(b.trip)
	case s == BreakerClosed:
		b.trip = make(chan struct{})
	}
	b.state.Store(int32(s))
	if b.onChange != nil {
		b.onChange(s)
	}
}
