package claim

import (
	"context"
	"errors"
	"time"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
)

// This file is the seam between package claim and oncekey's own adapters
// (claimhttp, claimgrpc, claimriver, the message consumers): typed access
// to what a Claimer knows and does that is not for applications. Like
// package claim/driver it promises nothing between versions, and the API
// budget (internal/cmd/apicount) does not count it. An adapter setting
// that needs the Claimer is added here, and nowhere else in claim.

// Driver is a Claimer as oncekey's adapters reach it. Not for applications:
// no compatibility promise between versions.
type Driver[TTx any] struct{ c *Claimer[TTx] }

// Driver returns c as oncekey's adapters reach it. Not for applications.
func (c *Claimer[TTx]) Driver() Driver[TTx] { return Driver[TTx]{c} }

// Lease returns the lease of the Claimer's claims ([WithLease]).
func (d Driver[TTx]) Lease() time.Duration { return d.c.leaseLength() }

// Retention returns how long the Claimer keeps the result of an operation
// named operation ([WithRetention] and [WithOperationRetention]).
func (d Driver[TTx]) Retention(operation string) time.Duration { return d.c.retentionFor(operation) }

// Polls reports whether the Claimer was configured [WithPoll].
func (d Driver[TTx]) Polls() bool { return d.c.polls() }

// CheckLease applies the lease rule ([ErrInvalidLease]) to lease, given by
// an adapter's option named what to the claims of operation, as a
// [Request.Lease] of that operation: nil for zero (the Claimer's lease),
// else an error matching ErrInvalidLease and [ErrConfig] that names what.
// An adapter calls it when its options are checked, so a bad lease fails
// at start-up rather than on every request.
func (d Driver[TTx]) CheckLease(what, operation string, lease time.Duration) error {
	return d.c.checkLease(what, operation, lease)
}

// InTx runs fn in a new transaction of the Claimer's store.
func (d Driver[TTx]) InTx(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error {
	return d.c.store.InTx(ctx, fn)
}

// ClaimTx claims r inside tx, in the durable store only (Redis is not
// asked: the claim is not visible before tx commits). An Acquired
// outcome's Lease is usable once tx committed; takeover reports that the
// claim took over an expired lease of the same request.
func (d Driver[TTx]) ClaimTx(ctx context.Context, tx TTx, r Request) (out Outcome, takeover bool, err error) {
	return d.c.claimTx(ctx, tx, r)
}

// Resume returns the lease of operation id of tenant, nil when its record
// is not processing (with the record). With tok, the token its claim
// handed to the work (an intent), the lease is handed over once per token
// ([ErrFenced] after). With the zero token it is adopted under a new
// generation once the earlier lease expired (durable.ErrBusy before).
func (d Driver[TTx]) Resume(ctx context.Context, tenant, id string, tok fence.Token) (*Lease, durable.Record, error) {
	return d.c.resume(ctx, tenant, id, tok)
}

// Expire ends l now, fenced, and keeps its record processing: the
// application said nothing happened, and the operation's own next run (a
// River retry) adopts it at once, where a release would free the key for
// any claim. Errors as [Lease.Renew]'s.
func (d Driver[TTx]) Expire(ctx context.Context, l *Lease) error { return l.expire(ctx) }

// RejectedResult returns the result of an error made by [Reject], for
// oncekey's adapters that settle a Lease from a handler's error. Not for
// applications (the seam, as [Driver]).
func RejectedResult(err error) (durable.Result, bool) {
	var rej *rejectError
	if errors.As(err, &rej) {
		return rej.Result, true
	}
	return durable.Result{}, false
}
