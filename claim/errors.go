package claim

import (
	"errors"
	"fmt"

	"github.com/oncekey/oncekey/durable"
)

var (
	// ErrMismatch is returned when the idempotency key was already used for
	// a request with another fingerprint. Nothing ran and nothing was
	// reserved. It matches [durable.ErrMismatch] too.
	ErrMismatch = fmt.Errorf("claim: %w", durable.ErrMismatch)

	// ErrInvalidScope is returned, before anything is reserved, for an
	// invalid scope or fingerprint. It matches [durable.ErrInvalidScope].
	ErrInvalidScope = fmt.Errorf("claim: %w", durable.ErrInvalidScope)

	// ErrUnavailable is returned when the durable store cannot be reached.
	// The claim failed closed: the caller's code did not run and must not
	// run. It matches [durable.ErrUnavailable].
	ErrUnavailable = fmt.Errorf("claim: %w", durable.ErrUnavailable)

	// ErrFenced is returned by a [Lease] method whose lease was lost: it
	// expired and another worker took the key over, or it was released.
	// The caller must not publish its result. It matches [durable.ErrFenced].
	ErrFenced = fmt.Errorf("claim: %w", durable.ErrFenced)

	// ErrLeaseExpired is returned when a lease ran out, or is about to,
	// before the work could start or continue:
	//
	//   - from [Claimer.Claim] and [Claimer.Do]: the claim round trip left
	//     less than the start margin. Nothing ran; the key was released
	//     when possible, and the retry is safe.
	//   - as the cause of [Lease.KeepAlive]'s work context: the lease could
	//     not be renewed and only the start margin is left of it. The work
	//     must stop, but the key was NOT released (an effect may have
	//     happened) and may still be held: try Complete, Fail or
	//     MarkUncertain, which are fenced.
	ErrLeaseExpired = errors.New("claim: lease expired")

	// ErrConfig is matched by every error about the library's configuration
	// rather than the data: a bad option to [New], [NewReconciler] or
	// [Claimer.RunSweeper], a [Request.Lease] that does not fit the start
	// margin or the retention, a nil function. Nothing was reserved; fix the
	// code, do not retry.
	ErrConfig = errors.New("claim: invalid configuration")
)

// rejectError is a business rejection returned by the function given to
// [Claimer.Do]: its result is stored as the operation's final, failed
// outcome and replayed to every retry. [Reject] builds one.
type rejectError struct {
	Result durable.Result
}

func (e *rejectError) Error() string {
	return fmt.Sprintf("claim: rejected with status %d", e.Result.StatusCode)
}

// Reject returns an error that makes [Claimer.Do] store res as a failed
// result instead of rolling back: use it for final business rejections
// (insufficient funds, a declined card), not for transient failures. Do
// then returns [Executed] with the state failed, not this error.
func Reject(res durable.Result) error { return &rejectError{Result: res} }

// wrap maps a durable error to this package's sentinel while keeping the
// cause: errors.Is matches both the claim and the durable sentinel.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	for _, s := range []error{ErrMismatch, ErrInvalidScope, ErrUnavailable, ErrFenced} {
		if errors.Is(err, errors.Unwrap(s)) && !errors.Is(err, s) {
			return fmt.Errorf("%w: %s: %w", s, op, err)
		}
	}
	return fmt.Errorf("claim: %s: %w", op, err)
}
