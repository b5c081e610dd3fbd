package fastpath

import (
	"errors"
	"fmt"

	"github.com/oncekey/oncekey/durable"
)

// unavailable is the error of [ErrUnavailable]: its own message, and it
// matches [durable.ErrUnavailable], the project's one word for "could not
// reach a backend".
type unavailable struct{}

func (unavailable) Error() string { return "fastpath: redis unavailable" }
func (unavailable) Unwrap() error { return durable.ErrUnavailable }

var (
	// ErrUnavailable is returned when Redis could not be used for a call:
	// the breaker is open, the call failed or timed out, it waited for a
	// connection past the client's PoolTimeout, or the reply made no sense. It matches [durable.ErrUnavailable]. The claim layer then
	// goes to the durable store alone. A script that timed out may still
	// have run on the server; every script is safe to run again (see each
	// script's header in package lua).
	ErrUnavailable error = unavailable{}

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
	ErrInvalidArgument = errors.New("fastpath: invalid argument")

	// ErrPolicyUnknown is returned by [CheckEviction] when the eviction
	// policy cannot be read, for example on a managed Redis that disables
	// CONFIG. The fast path still works; whether Redis may evict a lease or
	// a cached result is then unknown.
	ErrPolicyUnknown = errors.New("fastpath: cannot read maxmemory-policy (CONFIG GET failed or is disabled)")
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}
