package driver

import (
	"context"
	"time"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/internal/adapter"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
)

// Lease returns the lease of c's claims (claim.WithLease).
func Lease[TTx any](c *claim.Claimer[TTx]) time.Duration { return adapter.Lease(c) }

// Retention returns how long c keeps the result of an operation named
// operation (claim.WithRetention and its per-operation form).
func Retention[TTx any](c *claim.Claimer[TTx], operation string) time.Duration {
	return adapter.Retention(c, operation)
}

// Polls reports whether c was configured with claim.WithPoll.
func Polls[TTx any](c *claim.Claimer[TTx]) bool { return adapter.Polls(c) }

// CheckLease applies claim's lease rule (claim.ErrInvalidLease) to lease,
// given by an adapter's option named what to the claims of operation
// under c, as a claim.Request.Lease of that operation: nil for zero (c's
// lease), else an error matching claim.ErrInvalidLease and claim.ErrConfig
// that names what. An adapter calls it when its options are checked, so a
// bad lease fails at start-up rather than on every request.
func CheckLease[TTx any](c *claim.Claimer[TTx], what, operation string, lease time.Duration) error {
	return adapter.CheckLease(c, what, operation, lease)
}

// Rejected returns the result of an error made by claim.Reject, for an
// adapter that settles a claim.Lease from a handler's error.
func Rejected(err error) (durable.Result, bool) { return adapter.Rejected(err) }

// InTx runs fn in a new transaction of c's store.
func InTx[TTx any](ctx context.Context, c *claim.Claimer[TTx], fn func(ctx context.Context, tx TTx) error) error {
	return adapter.InTx(ctx, c, func(ctx context.Context, tx any) error { return fn(ctx, tx.(TTx)) })
}

// ClaimTx claims r inside tx; Redis is not asked. An acquired outcome's
// Lease is usable once tx committed. takeover reports that the claim took
// over an expired lease of the same request.
func ClaimTx[TTx any](ctx context.Context, c *claim.Claimer[TTx], tx TTx, r claim.Request) (out claim.Outcome, takeover bool, err error) {
	o, takeover, err := adapter.ClaimTx(ctx, c, tx, r)
	out, _ = o.(claim.Outcome)
	return out, takeover, err
}

// Resume returns the lease of operation id of tenant, nil when its record
// is not processing (with the record). With tok, the token its claim
// handed to the work (an intent), the lease is handed over once per token
// (claim.ErrFenced after). With the zero token it is adopted under a new
// generation once the earlier lease expired (durable.ErrBusy before).
func Resume[TTx any](ctx context.Context, c *claim.Claimer[TTx], tenant, id string, tok fence.Token) (*claim.Lease, durable.Record, error) {
	l, rec, err := adapter.Resume(ctx, c, tenant, id, tok)
	lease, _ := l.(*claim.Lease)
	return lease, rec, err
}

// Expire ends l now, fenced, and keeps its record processing: the
// application said nothing happened, and the operation's own next run
// (a River retry) adopts it at once, where a release would free the key
// for any claim. Errors as claim.Lease.Renew's.
func Expire(ctx context.Context, l *claim.Lease) error { return adapter.Expire(ctx, l) }
