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

// wrap maps a durable error to this package's sentinel while keeping the
// cause: errors.Is matches both the claim and the durable sentinel. op names
// the step; the claim itself ("claim") is not named again after the
// package's "claim: " prefix.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	for _, s := range []error{ErrMismatch, ErrInvalidScope, ErrUnavailable, ErrFenced} {
		if errors.Is(err, errors.Unwrap(s)) && !errors.Is(err, s) {
			if op == "claim" {
				return fmt.Errorf("%w: %w", s, err)
			}
			return fmt.Errorf("%w: %s: %w", s, op, err)
		}
	}
	if op == "claim" {
		return fmt.Errorf("claim: %w", err)
	}
	return fmt.Errorf("claim: %s: %w", op, err)
}

// invalidArg returns err, an invalid scope or argument found by the store's
// validation, as this package's error: it matches [ErrInvalidScope] and err,
// and its message is err's prefixed once with "claim: " ("claim: durable:
// invalid fingerprint: ..."), not err's wrapped in the sentinel's message.
// Any other error is wrapped as [wrap] does.
func invalidArg(err error) error {
	if !errors.Is(err, durable.ErrInvalidScope) {
		return wrap("claim", err)
	}
	return &invalidArgError{err: err}
}

type invalidArgError struct{ err error }

func (e *invalidArgError) Error() string   { return "claim: " + e.err.Error() }
func (e *invalidArgError) Unwrap() []error { return []error{ErrInvalidScope, e.err} }
