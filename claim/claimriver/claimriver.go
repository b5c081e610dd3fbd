// Package claimriver runs idempotent work asynchronously and durably on
// River (github.com/riverqueue/river): the first request claims its key and
// records the intent to run as a River job in the same transaction, then
// answers 202 with the operation's Location at once; a River worker runs
// the work under the claim's lease and stores its result, which every
// retry with the same key then gets.
//
// It is a module of its own, so that users of oncekey who do not use River
// do not compile it.
//
// # What it guarantees, at each outcome
//
//   - Enqueue (and the HTTP [Runner.Handler]) claims the key and inserts the
//     job with River's InsertTx in one transaction of the durable store:
//     both commit or neither does. A retry while the work runs gets the same
//     operation identity (202 and the same Location over HTTP), a retry
//     after it finished the stored result, a retry with another payload
//     ErrMismatch (422). A burst of duplicates inserts one job: the claim
//     lets one through, and the job is unique by operation in River too.
//   - The first worker to run the job takes the claim over from the token
//     that recorded it (carried in the job's arguments with the operation
//     identity and the payload, never the raw key) under a new generation:
//     a handover that succeeds once per token. Every later run (River
//     retries a failed attempt, rescues the job of a worker that died,
//     delivers a snoozed job again) adopts the record under a new
//     generation once the earlier lease expired, so an earlier worker that
//     is only paused is fenced: its Complete, Fail or MarkUncertain returns
//     claim.ErrFenced and writes nothing.
//   - The work runs under [claim.Lease.KeepAlive]. Its result (nil error)
//     is stored as completed; a [claim.Reject] error as failed; any other
//     error is retried by River, and on the job's last attempt the record
//     is marked uncertain for the Reconciler: an operation whose work
//     started is never silently failed and never released. A job whose last
//     attempt dies leaves the record processing with an expired lease,
//     which the Reconciler also picks up (claim.ReconcileStaleAfter).
//
// Pass [Job.OperationID] downstream as that system's idempotency key: a
// retry that repeats a call after a crash is then deduplicated there.
package claimriver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/internal/adapter"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
)

// ErrConfig is matched by every configuration error of this package.
var ErrConfig = errors.New("claimriver: invalid configuration")

// Kind is the River job kind of the jobs a Runner inserts and works.
const Kind = "oncekey_operation"

// Job is what the work function gets.
type Job struct {
	// OperationID is the operation's stable identity: the same for every
	// attempt. Use it as the idempotency key of downstream calls.
	OperationID string
	// Operation is the operation name of the claim (for example
	// "POST /deploys"), to tell kinds of work apart.
	Operation string
	// Token is the fencing token of this attempt.
	Token fence.Token
	// Attempt is River's attempt number, from 1.
	Attempt int
	// Payload is the payload given to Enqueue (the request body over HTTP).
	Payload []byte
}

// Work runs one operation. It returns the result to store (completed), an
// error from [claim.Reject] (a final business rejection, stored as
// failed), or any other error (retried by River; uncertain after the last
// attempt). ctx ends when the lease could not be kept alive or River's job
// timeout passed: stop then.
type Work func(ctx context.Context, job Job) (durable.Result, error)

// Args are the arguments of the River job: the operation, the token of the
// claim that recorded it and the payload. Never the raw key.
type Args struct {
	OperationID string    `json:"operation_id" river:"unique"`
	Tenant      string    `json:"tenant"`
	Generation  uint64    `json:"generation"`
	Owner       uuid.UUID `json:"owner"`
	Payload     []byte    `json:"payload,omitempty"`
}

// Kind implements river.JobArgs.
func (Args) Kind() string { return Kind }

// InsertOpts implements river.JobArgsWithInsertOpts: one live job per
// operation (a completed, cancelled or discarded one does not count, so an
// operation restarted after its retention gets a job of its own).
func (Args) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: []rivertype.JobState{
		rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRetryable,
		rivertype.JobStateRunning, rivertype.JobStateScheduled,
	}}}
}

// Runner enqueues and works the operations of one Claimer on River.
type Runner[TTx any] struct {
	c    *claim.Claimer[TTx]
	work Work
	o    config
}

// New returns a Runner for c running work. Errors match [ErrConfig].
func New[TTx any](c *claim.Claimer[TTx], work Work, opts ...Option) (*Runner[TTx], error) {
	if c == nil || work == nil {
		return nil, fmt.Errorf("%w: New needs a Claimer and a Work function", ErrConfig)
	}
	o, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return &Runner[TTx]{c: c, work: work, o: o}, nil
}

// Register adds the Runner's worker to workers (River's registry, given to
// river.Config.Workers).
func (r *Runner[TTx]) Register(workers *river.Workers) error {
	return river.AddWorkerSafely(workers, river.Worker[Args](&worker[TTx]{r: r}))
}

// Enqueue claims req's key and, when it is acquired, inserts the job with
// client.InsertTx, in one transaction of the Claimer's store. client must
// be a River client on the same database (riverpgxv5 on the store's pool,
// riversqlite on its *sql.DB). It returns the claim's outcome: Acquired
// (the job was inserted; the outcome's Lease is the intent's and must not
// be used), InProgress or Uncertain (nothing was inserted: the operation
// runs or is being reconciled), Replayed (finished: the stored result), or
// the claim's errors (ErrMismatch for another payload under the key).
func (r *Runner[TTx]) Enqueue(ctx context.Context, client *river.Client[TTx], req claim.Request, payload []byte) (claim.Outcome, error) {
	if client == nil {
		return claim.Outcome{}, fmt.Errorf("%w: Enqueue: nil River client", ErrConfig)
	}
	var out claim.Outcome
	err := adapter.InTx(ctx, r.c, func(ctx context.Context, txAny any) error {
		o, takeover, err := adapter.ClaimTx(ctx, r.c, txAny, req)
		if err != nil {
			return err
		}
		out = o.(claim.Outcome)
		if out.Kind != claim.Acquired {
			return nil
		}
		if takeover {
			// The operation's job exists (its worker died or is between
			// attempts): only its next attempt takes it over. Undo this
			// claim rather than hold a lease no worker continues.
			return errLeaveToTheJob
		}
		tok := out.Lease.Token()
		res, err := client.InsertTx(ctx, txAny.(TTx), Args{
			OperationID: out.OperationID, Tenant: req.Scope.Tenant,
			Generation: tok.Generation, Owner: tok.Owner, Payload: payload,
		}, &river.InsertOpts{MaxAttempts: r.o.maxAttempts, Queue: r.o.queue})
		if err != nil {
			return fmt.Errorf("claimriver: insert the job: %w", err)
		}
		if res.UniqueSkippedAsDuplicate {
			// A job of this operation is still live (an earlier epoch's,
			// finishing): it must not run this one. Undo the claim.
			return errLeaveToTheJob
		}
		return nil
	})
	if errors.Is(err, errLeaveToTheJob) {
		return claim.Outcome{Kind: claim.InProgress, OperationID: out.OperationID, RetryAfter: r.o.retryAfter}, nil
	}
	if err != nil {
		return claim.Outcome{OperationID: out.OperationID}, err
	}
	return out, nil
}

// errLeaveToTheJob rolls back an Enqueue whose claim the existing job of
// the operation must continue instead.
var errLeaveToTheJob = errors.New("claimriver: the operation's job continues it")

type worker[TTx any] struct {
	river.WorkerDefaults[Args]
	r *Runner[TTx]
}

// Work runs one attempt of the job under the operation's lease.
func (w *worker[TTx]) Work(ctx context.Context, job *river.Job[Args]) error {
	r, a := w.r, job.Args
	// The first worker to start takes the intent's claim by handover; any
	// other (River delivers a job again after a crash, a retry, a snooze)
	// finds it handed over and adopts the record once the lease it was
	// handed under expired. Every run holds a generation of its own.
	l, rec, err := adapter.Resume(ctx, r.c, a.Tenant, a.OperationID, fence.Token{Generation: a.Generation, Owner: a.Owner})
	if errors.Is(err, durable.ErrFenced) {
		l, rec, err = adapter.Resume(ctx, r.c, a.Tenant, a.OperationID, fence.Token{})
	}
	switch {
	case errors.Is(err, durable.ErrNotFound):
		// Swept after its retention, or never committed: nothing to run.
		return river.JobCancel(fmt.Errorf("claimriver: operation %s: %w", a.OperationID, err))
	case errors.Is(err, durable.ErrBusy):
		// An earlier run still holds a live lease: come back after it.
		return river.JobSnooze(max(rec.LeaseRemaining, time.Second) + time.Second)
	case err != nil:
		return err // River retries
	case l == nil:
		return nil // finished, uncertain (the Reconciler's) or released
	}
	lease := l.(*claim.Lease)
	workCtx, stop := lease.KeepAlive(ctx)
	res, werr := r.work(workCtx, Job{OperationID: a.OperationID, Operation: rec.Ref.Operation, Token: lease.Token(), Attempt: job.Attempt, Payload: a.Payload})
	_ = stop()
	// Finishing writes are fenced; they run even if River cancelled ctx.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.o.finishTimeout)
	defer cancel()
	rejected, isReject := adapter.Rejected(werr)
	switch {
	case werr == nil:
		err = lease.Complete(fctx, res)
	case isReject:
		err = lease.Fail(fctx, rejected)
	case job.Attempt >= job.MaxAttempts:
		if merr := lease.MarkUncertain(fctx); merr != nil && !errors.Is(merr, claim.ErrFenced) {
			return fmt.Errorf("claimriver: last attempt failed (%w) and marking the operation uncertain failed: %w", werr, merr)
		}
		return werr
	default:
		return werr // River retries; the next attempt takes over once this lease expires
	}
	if errors.Is(err, claim.ErrFenced) {
		// A later attempt (or the Reconciler) took the operation over: its
		// outcome stands and this one's is discarded.
		return nil
	}
	return err
}
