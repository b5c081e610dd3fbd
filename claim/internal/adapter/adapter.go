// Package adapter carries, from package claim to package driver (which
// gives them typed to the adapters), the settings and transactional claim
// of a Claimer that are not part of claim's API. Package claim sets the
// functions when it is initialized, before anything can hold a Claimer.
// Only claim and driver use it: the values behind any are claim's types,
// which driver, above claim, names.
package adapter

import (
	"context"
	"time"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
)

var (
	// Retention returns the retention of an operation under claimer (a
	// *claim.Claimer of any transaction type).
	Retention func(claimer any, operation string) time.Duration
	// Polls reports whether claimer was configured with claim.WithPoll.
	Polls func(claimer any) bool
	// Rejected returns the result of an error made by claim.Reject, for
	// adapters that settle a Lease (workflow mode) from a handler's error.
	Rejected func(err error) (durable.Result, bool)
	// CheckLease applies claim's lease rule (see claim.ErrInvalidLease) to
	// a lease an adapter's option gives the claims of operation under
	// claimer, as a claim.Request.Lease of that operation: nil for zero
	// (the Claimer's lease), else an error matching claim.ErrInvalidLease
	// (and claim.ErrConfig) that names the option as what. An adapter
	// calls it when its options are checked, so a bad per-route lease fails
	// at start-up rather than on every request.
	CheckLease func(claimer any, what, operation string, lease time.Duration) error
)

// The asynchronous adapters (claimriver) reach a Claimer (any transaction
// type) through these; the values are claim's types behind any.
var (
	// InTx runs fn in a new transaction of claimer's store (its TTx as tx).
	InTx func(ctx context.Context, claimer any, fn func(ctx context.Context, tx any) error) error
	// ClaimTx claims r (a claim.Request) inside tx and returns the
	// claim.Outcome; an acquired one holds a *claim.Lease usable once tx
	// committed, and takeover reports that it took over an expired lease
	// of the same request. Redis is not asked.
	ClaimTx func(ctx context.Context, claimer, tx, r any) (out any, takeover bool, err error)
	// Resume returns a *claim.Lease (nil when the record is not processing)
	// on operation id of tenant: handed over from tok, the intent's claim
	// token (once per token; ErrFenced after), or with the zero token
	// adopted under a new generation once the earlier lease expired
	// (durable.ErrBusy before).
	Resume func(ctx context.Context, claimer any, tenant, id string, tok fence.Token) (any, durable.Record, error)
	// Expire ends the lease of lease (a *claim.Lease) now, fenced, and
	// keeps the record processing: the application said nothing happened,
	// and the operation's own next run (a River retry) adopts it at once,
	// where a release would free the key for any claim. Errors as
	// claim.Lease.Renew's.
	Expire func(ctx context.Context, lease any) error
	// Lease returns the lease of claimer's claims (claim.WithLease).
	Lease func(claimer any) time.Duration
)
