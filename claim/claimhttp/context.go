package claimhttp

import (
	"context"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/driver/settle"
	"github.com/oncekey/oncekey/fence"
)

// txKey is the context key of the transaction; one type per TTx.
type txKey[TTx any] struct{}

// OperationID returns the stable identity of the operation a guarded
// handler runs: the same for every retry and takeover of the tenant,
// operation and key, and revealing none of them ("op_" and 43 base64url
// characters). Pass it downstream as that system's idempotency key. It
// returns "" outside a guarded handler.
func OperationID(ctx context.Context) string { return settle.OperationID(ctx) }

// Token returns the fencing token of the execution a guarded handler runs
// (see package fence), for downstream systems that reject stale writers, in
// workflow mode. In transaction mode on PostgreSQL the token becomes the
// record's only if the handler's transaction commits (see claim.Op.Token):
// use it for writes through [Tx], not for a fence outside it.
func Token(ctx context.Context) (fence.Token, bool) { return settle.Token(ctx) }

// Tx returns the transaction of a handler guarded in transaction mode
// ([WithInTransaction]): the one that will store the
// result, so the handler's business write commits with it, or not at all.
// It reports false outside such a handler or for another TTx.
func Tx[TTx any](ctx context.Context) (TTx, bool) {
	tx, ok := ctx.Value(txKey[TTx]{}).(TTx)
	return tx, ok
}

// MarkUncertain records, from a handler guarded in workflow mode, that the
// outcome of its work is unknown (a downstream call timed out after it may
// have applied). When the handler returns, the middleware marks the record
// uncertain instead of storing the response, and answers 202
// (ProblemUncertain) like every retry until a [claim.Reconciler] resolves
// it; nothing runs again on its own. The handler's own response is
// discarded. Errors: [ErrNotGuarded] outside a workflow-mode handler
// (transaction-mode handlers make no external calls).
func MarkUncertain(ctx context.Context) error { return settle.MarkUncertain(ctx, ErrNotGuarded) }

// ReleaseKey declares, from a guarded handler, that its work had no effect
// (it failed before any external call or write: a dependency was down, a
// precondition did not hold), so the key may run again. When the handler
// returns, the middleware releases the key instead of storing the response,
// publishes the response as the handler wrote it, and the next request with
// the key (any payload) runs as a new execution. In transaction mode the
// transaction rolls back.
//
// It is the only way that a workflow-mode key is released after its handler
// started: the middleware never assumes that nothing happened. [MarkUncertain] wins over it.
// Errors: [ErrNotGuarded] outside a guarded handler.
func ReleaseKey(ctx context.Context) error { return settle.ReleaseKey(ctx, ErrNotGuarded) }

// Step runs one step of the workflow of a handler guarded in workflow mode,
// at most once per operation across retries and takeovers (see
// [claim.Lease.Step]): a step an earlier attempt finished returns its
// recorded result without running, so a retry after a takeover resumes
// where the work stopped. fn gets the step's downstream idempotency key.
// A step that turns the operation uncertain ([claim.ErrStepUncertain])
// marks the handler uncertain, as [MarkUncertain]. Errors: Step's, and
// [ErrNotGuarded] outside a workflow-mode handler.
func Step(ctx context.Context, name string, fn func(ctx context.Context, key string) ([]byte, error), opts ...claim.StepOption) ([]byte, error) {
	return settle.Step(ctx, ErrNotGuarded, name, fn, opts...)
}
