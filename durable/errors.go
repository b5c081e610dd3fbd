package durable

import (
	"errors"
	"fmt"
)

var (
	// ErrFenced is returned by a fenced write whose token no longer owns the
	// record: its lease expired and another owner took over, it was
	// released, or the record reached a final state. It means "this write
	// did not apply": a store returns it only when it knows that, never for
	// a write whose reply was lost and that may have applied (that is
	// ErrUnavailable).
	ErrFenced = errors.New("durable: fenced: lease no longer held")

	// ErrMismatch is returned by Claim when the record exists with another
	// request fingerprint: the idempotency key was reused for a different
	// request. Nothing was written.
	ErrMismatch = errors.New("durable: idempotency key reused with a different request")

	// ErrUnavailable wraps any failure to reach the store (closed pool,
	// refused connection, timeout, lost connection). The outcome of a write
	// that returns it is unknown only where the method's documentation says
	// so; callers must fail closed.
	ErrUnavailable = errors.New("durable: store unavailable")

	// ErrInvalidScope is returned, before anything is written, for a scope
	// that fails [Scope.Validate], and for invalid arguments to a store. Its
	// message names the field and why, for example
	// "durable: invalid key: empty".
	ErrInvalidScope = errors.New("durable: invalid scope")

	// ErrNotFound is returned by Get and Adopt when no record exists.
	ErrNotFound = errors.New("durable: record not found")

	// ErrBusy is returned by Adopt when the record is held by a live lease,
	// or is finished, so it cannot be adopted.
	ErrBusy = errors.New("durable: record not adoptable")
)

// scopeError says which field of a [Scope] is invalid and why. It matches
// [ErrInvalidScope] with errors.Is.
type scopeError struct {
	field  string // "tenant", "operation" or "key"
	reason string
}

func (e *scopeError) Error() string {
	return fmt.Sprintf("durable: invalid %s: %s", e.field, e.reason)
}

// Is reports whether target is ErrInvalidScope.
func (e *scopeError) Is(target error) bool { return target == ErrInvalidScope }
