package claimgrpc

import (
	"context"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/driver/settle"

	"github.com/oncekey/oncekey/fence"
)

// OperationID returns the stable identity of the operation a guarded
// handler runs: the same for every retry and takeover of the tenant,
// operation and key, and revealing none of them ("op_" and 43 base64url
// characters). Pass it downstream as that system's idempotency key. It
// returns "" outside a guarded handler.
func OperationID(ctx context.Context) string { return settle.OperationID(ctx) }

// Token returns the fencing token of the execution a guarded handler runs
// (see package fence), for downstream systems that reject stale writers.
// It reports false outside a guarded handler.
func Token(ctx context.Context) (fence.Token, bool) { return settle.Token(ctx) }

// MarkUncertain records, from a guarded handler, that the outcome of its
// work is unknown (a downstream call timed out after it may have applied).
// When the handler returns, the interceptor marks the record uncertain
// instead of storing the reply, and answers Aborted (ReasonUncertain) like
// every retry until a [claim.Reconciler] resolves it; nothing runs again on
// its own. The handler's own reply is discarded. Errors: [ErrNotGuarded].
func MarkUncertain(ctx context.Context) error { return settle.MarkUncertain(ctx, ErrNotGuarded) }

// ReleaseKey declares, from a guarded handler, that its work had no effect
// (it failed before any external call or write: a dependency was down, a
// precondition did not hold), so the key may run again. When the handler
// returns, the interceptor releases the key instead of storing the reply,
// returns the handler's reply or error as it is, and the next call with the
// key (any request) runs as a new execution.
//
// It is the only way a key is released after its handler started: the
// interceptor never assumes that nothing happened, whatever the handler's
// status code. [MarkUncertain] wins over it. Errors: [ErrNotGuarded].
func ReleaseKey(ctx context.Context) error { return settle.ReleaseKey(ctx, ErrNotGuarded) }

// Step runs one step of the workflow of a guarded handler, at most once per
// operation across retries and takeovers (see [claim.Lease.Step]): a step
// an earlier attempt finished returns its recorded result without running,
// so a retry after a takeover resumes where the work stopped. fn gets the
// step's downstream idempotency key. A step that turns the operation
// uncertain ([claim.ErrStepUncertain]) marks the handler uncertain, as
// [MarkUncertain]. Errors: Step's, and [ErrNotGuarded].
func Step(ctx context.Context, name string, fn func(ctx context.Context, key string) ([]byte, error), opts ...claim.StepOption) ([]byte, error) {
	return settle.Step(ctx, ErrNotGuarded, name, fn, opts...)
}
