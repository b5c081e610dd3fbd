package claim

import (
	"fmt"
	"time"
)

// minLease is the shortest lease the lease rule accepts (see
// [ErrInvalidLease]). [Lease.KeepAlive] renews every third of the lease,
// each renewal due a third after the previous one was sent, and cancels the
// work when only the start margin (by default a tenth of the lease) is left.
// So a renewal has from a third of the lease to nine tenths of it, 0.57 of
// the lease, to reach the database, commit and come back: 57ms at 100ms.
// That covers a commit round trip (a few milliseconds with its fsync) and a
// scheduling stall or GC pause of tens of milliseconds; a shorter lease is
// lost to the first slow fsync or stall, and the work is cancelled, or
// taken over, with nothing wrong but the clock. A claim, too, must come back
// with more than the margin left (10ms at 100ms), or it is given back.
const minLease = 100 * time.Millisecond

// checkLease is the lease rule, the one check of every lease a claim can be
// given (see [ErrInvalidLease]): the Claimer's ([WithLease], checked by
// [New] against every retention), a [Request.Lease], and an adapter's
// per-route lease (through package adapter). what names the input in the
// error; margin is the explicit start margin ([WithStartMargin]), 0 without
// one (the default, a tenth of the lease, always fits); retention is the
// operation's (operation "" for the Claimer's default retention). A zero
// lease means the default and is not checked here: the caller substitutes
// the Claimer's lease, which [New] checked.
func checkLease(what string, lease, margin, retention time.Duration, operation string) error {
	switch {
	case lease < 0:
		return leaseErr("%s %v is negative (zero means the default)", what, lease)
	case lease < minLease:
		return leaseErr("%s %v is shorter than %v: a renewal every third of the lease could not land before the start margin is reached", what, lease, minLease)
	case margin >= lease:
		return leaseErr("%s %v is not longer than the start margin %v (WithStartMargin)", what, lease, margin)
	case lease > retention && operation == "":
		return leaseErr("%s %v is longer than the retention %v (WithRetention): the record must outlive the lease", what, lease, retention)
	case lease > retention:
		return leaseErr("%s %v is longer than the retention %v of operation %q: the record must outlive the lease", what, lease, retention, operation)
	}
	return nil
}

// leaseErr returns an error matching [ErrInvalidLease] (and so [ErrConfig])
// that says what is wrong.
func leaseErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidLease}, args...)...)
}

// invalidLease is the type of [ErrInvalidLease]: its own sentinel, matched
// by errors.Is with [ErrConfig] too.
type invalidLease struct{}

func (invalidLease) Error() string { return "claim: invalid lease" }

// Is makes an invalid lease a configuration error.
func (invalidLease) Is(target error) bool { return target == ErrConfig }

// explicitMargin returns the start margin set with [WithStartMargin], or 0.
func (cfg *config) explicitMargin() time.Duration {
	if cfg.marginSet {
		return cfg.margin
	}
	return 0
}

// requestLease returns the lease of a claim of r: r.Lease when set, checked
// by the lease rule against the operation's retention, else the Claimer's.
func (c *Claimer[TTx]) requestLease(r Request) (time.Duration, error) {
	if r.Lease == 0 {
		return c.cfg.lease, nil
	}
	return r.Lease, c.checkLease("Request.Lease", r.Scope.Operation, r.Lease)
}

// checkLease applies the lease rule to a lease given for one claim of
// operation (named what in the error); zero is the default and fits.
func (c *Claimer[TTx]) checkLease(what, operation string, lease time.Duration) error {
	if lease == 0 {
		return nil
	}
	return checkLease(what, lease, c.cfg.explicitMargin(), c.retentionFor(operation), operation)
}
