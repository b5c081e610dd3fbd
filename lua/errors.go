package lua

import (
	"errors"
	"fmt"
)

var (
	// ErrUnavailable is returned when Redis could not be used for a call:
	// the breaker is open, the call failed or timed out, or the reply made
	// no sense. The claim layer then goes to the durable store alone. A
	// script that timed out may still have run on the server; every script
	// is safe to run again (see the package documentation).
	ErrUnavailable = errors.New("lua: redis unavailable")

	// ErrBreakerOpen is returned at once, with no Redis call, while the
	// breaker is open or its half-open probe is in flight. It matches
	// [ErrUnavailable].
	ErrBreakerOpen = fmt.Errorf("%w: breaker open", ErrUnavailable)

	// ErrCorrupt is returned when Redis answered with something the
	// scripts never write: an unknown reply, or a cached result that does
	// not decode. It matches [ErrUnavailable], so the caller falls back to
	// the durable store; it does not count as a breaker failure.
	ErrCorrupt = fmt.Errorf("%w: unexpected reply or corrupt cached value", ErrUnavailable)

	// ErrInvalidArgument is returned, before any Redis call, for a bad
	// option of [New] or a bad argument of a call (for example a nil owner,
	// an empty fingerprint or a lease under 1ms). It does not count as a
	// breaker failure.
	ErrInvalidArgument = errors.New("lua: invalid argument")

	// ErrPolicyUnknown is returned by [CheckEviction] when the eviction
	// policy cannot be read, for example on a managed Redis that disables
	// CONFIG. The fast path still works; whether Redis may evict the
	// generation counter is then unknown.
	ErrPolicyUnknown = errors.New("lua: cannot read maxmemory-policy (CONFIG GET failed or is disabled)")
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}
