package claim

import (
	"errors"
	"fmt"

	"github.com/oncekey/oncekey/durable"
)

var (
	// ErrMismatch is returned when the idempotency key was already used for
	// a request with another fingerprint. Nothing ran and nothing was
	// reserved. It is the same value as [durable.ErrMismatch]: either name
	// matches with errors.Is.
	ErrMismatch = durable.ErrMismatch

	// ErrInvalidScope is returned, before anything is reserved, for an
	// invalid scope or fingerprint. It is the same value as
	// [durable.ErrInvalidScope].
	ErrInvalidScope = durable.ErrInvalidScope

	// ErrUnavailable is returned when the durable store cannot be reached.
	// The claim failed closed: the caller's code did not run and must not
	// run. It is the same value as [durable.ErrUnavailable].
	ErrUnavailable = durable.ErrUnavailable

	// ErrFenced is returned by a [Lease] method whose lease was lost: it
	// expired and another worker took the key over, or it was released.
	// The caller must not publish its result. It is the same value as
	// [durable.ErrFenced].
	ErrFenced = durable.ErrFenced

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
	// [Claimer.RunSweeper], a lease that breaks the lease rule
	// ([ErrInvalidLease], a [Request.Lease] included), a nil function. Nothing was reserved; fix the
	// code, do not retry.
	ErrConfig = errors.New("claim: invalid configuration")

	// ErrInvalidLease is matched by the error for a lease that breaks the
	// lease rule, which holds for every lease a claim can be given: the
	// Claimer's ([WithLease], checked by [New]) and a [Request.Lease]
	// (checked before anything is reserved). It matches [ErrConfig] too:
	// the lease comes from the code, not from the request's data; fix it,
	// do not retry. The rule:
	//
	//   - zero means the default (30s, or the Claimer's lease for a
	//     Request.Lease); a negative lease is an error;
	//   - at least 100ms: [Lease.KeepAlive] renews every third of the
	//     lease and stops the work when only the start margin (a tenth by
	//     default) is left, so a renewal has 0.57 of the lease to land; below
	//     100ms that is under 57ms, which one slow fsync, GC pause or
	//     scheduling stall exceeds;
	//   - longer than an explicit start margin ([WithStartMargin]);
	//   - not longer than the retention of the operation ([WithRetention],
	//     [WithOperationRetention]): the record must outlive its lease.
	ErrInvalidLease error = invalidLease{}
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

// wrap prefixes a durable error with the package's name and the step, op,
// keeping it for errors.Is: [ErrMismatch], [ErrInvalidScope],
// [ErrUnavailable] and [ErrFenced] are durable's sentinels, so the cause
// already matches them. The claim itself ("claim") is not named again after
// the "claim: " prefix, so an invalid fingerprint reads "claim: durable:
// invalid fingerprint: ...".
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if op == "claim" {
		return fmt.Errorf("claim: %w", err)
	}
	return fmt.Errorf("claim: %s: %w", op, err)
}
