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
//   - The work runs through the settlement every entry point of oncekey
//     shares: the lease is renewed while it runs, on a context detached
//     from River's, and once it started the outcome is only ever recorded,
//     never released on the library's initiative. Its result (nil error)
//     is stored as completed; a [claim.Reject] error as failed; an error
//     wrapping [ErrNothingHappened] (the application's word that the
//     attempt had no effect) ends the lease and River retries the job,
//     whose next attempt adopts the operation at once and runs it again;
//     any other error, or a panic, marks the operation uncertain, for the
//     Reconciler (River recovers the panic; the job's retry finds the
//     operation uncertain and runs nothing).
//   - The outcome is written while the attempt still runs: a store that is
//     unreachable for a moment is retried, renewing the lease, until the
//     write lands or the lease runs out. River then hears: nil once it is
//     recorded (completed, failed or uncertain), and nil when another run
//     took the operation over (its outcome stands); an error when the
//     lease ran out first, so that River retries the job and its attempt
//     adopts the record after the lease, as after a crash.
//
// # Long work, River's timers, and who retries a crashed worker
//
// The work is bounded by the lease and its renewals, not by River's job
// timeout: River's cancellation of the attempt's context (JobTimeout, a
// per-worker timeout, StopAndCancel, a remote cancel) does not reach the
// work, whose context ends only when the lease is lost or about to run out
// (claim.Lease.KeepAlive). A shutdown therefore waits for the running work
// or abandons it with the process, which is a crash.
//
// A worker that dies leaves its job running in River's table until River's
// stuck-job rescuer moves it: after RescueStuckJobsAfter, 1 hour by
// default, long after the lease. Set river.Config.RescueStuckJobsAfter to
// [Runner.RescueStuckJobsAfter] (the lease, at least JobTimeout): the job
// is then retried about a lease after it began (the rescuer looks every 30
// seconds, then the retry policy's delay), and the retry adopts the record
// once the dead worker's lease expired. This Runner's jobs report the lease
// as their River timeout (Worker.Timeout), only for that rescue: a timeout
// of -1 would make River's rescuer skip them for ever. River logs work that
// outlives it as "stuck"; that is expected of work longer than the lease.
//
// The job owns its operation's retries while it is live: a retried
// request never takes the operation over (it answers 202 and leaves it to
// the job), and a Reconciler given [Runner.SkipLiveJobs] skips processing
// records whose job is still live. The Reconciler has the uncertain
// records, and the processing ones whose job is gone (its last attempt
// failed or died, or it was cancelled).
//
// Pass [Job.OperationID] downstream as that system's idempotency key: a
// retry that repeats a call after a crash is then deduplicated there.
package claimriver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/driver/consume"
	"github.com/oncekey/oncekey/claim/driver/settle"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
)

// ErrConfig is matched by every configuration error of this package.
var ErrConfig = errors.New("claimriver: invalid configuration")

// ErrNothingHappened, wrapped by a [Work] function's error, is the
// application's word that the attempt had no effect (it failed before
// anything was sent downstream): the attempt's lease is ended at once with
// the record kept processing, and River retries the job, whose next attempt
// adopts the operation and runs it again. Any other error of the work marks
// the operation uncertain. It is the same value as claimnats' and
// claimamqp's ErrNothingHappened.
var ErrNothingHappened = consume.ErrNothingHappened

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
	// Tenant is the tenant of the claim: whose operation it is, for the
	// work to record what it makes under that tenant.
	Tenant string
	// Token is the fencing token of this attempt.
	Token fence.Token
	// Attempt is River's attempt number, from 1.
	Attempt int
	// Payload is the payload given to Enqueue (the request body over HTTP).
	Payload []byte
}

// Work runs one operation. It returns the result to store (completed), an
// error from [claim.Reject] (a final business rejection, stored as
// failed), an error wrapping [ErrNothingHappened] (no effect: River retries
// the job and the operation runs again), or any other error (the operation
// is marked uncertain, for the Reconciler; River does not run it again).
// ctx ends only when the lease could not be kept alive (lost to another
// run, or about to run out): stop then. River's job timeout and shutdown
// do not end it.
type Work func(ctx context.Context, job Job) (durable.Result, error)

// Step runs one step of the operation a [Work] function runs, at most
// once per operation across attempts (see [claim.Lease.Step]): a step an
// earlier attempt finished returns its recorded result without running,
// so River's next attempt after a crash or a takeover resumes where the
// work stopped. fn gets the step's downstream idempotency key. A step that
// turns the operation uncertain ([claim.ErrStepUncertain]) makes the
// attempt's outcome uncertain whatever the work returns. Outside a Work
// function it returns an error matching [claim.ErrConfig].
func Step(ctx context.Context, name string, fn func(ctx context.Context, key string) ([]byte, error), opts ...claim.StepOption) ([]byte, error) {
	return settle.Step(ctx, errStepOutsideWork, name, fn, opts...)
}

var errStepOutsideWork = fmt.Errorf("claimriver: Step outside a Runner's Work: %w", claim.ErrConfig)

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
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: append([]rivertype.JobState(nil), liveStates...)}}
}

// Runner enqueues and works the operations of one Claimer on River.
type Runner[TTx any] struct {
	c      *claim.Claimer[TTx]
	work   Work
	o      config
	lease  time.Duration // the Claimer's
	engine *settle.Engine
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
	return &Runner[TTx]{c: c, work: work, o: o, lease: c.Driver().Lease(), engine: &settle.Engine{
		Name: "claimriver",
		// Handoff 0: the attempt stays running until the outcome is
		// recorded or the lease ran out; River learns nothing before.
		Attempt: o.finishTimeout,
		// A nothing-happened run keeps the record for the job's retry.
		Release: func(ctx context.Context, l *claim.Lease) error { return c.Driver().Expire(ctx, l) },
	}}, nil
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
	err := r.c.Driver().InTx(ctx, func(ctx context.Context, tx TTx) error {
		o, takeover, err := r.c.Driver().ClaimTx(ctx, tx, req)
		if err != nil {
			return err
		}
		out = o
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
		res, err := client.InsertTx(ctx, tx, Args{
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

// Timeout implements river.Worker: River's job timeout for these jobs is
// the Claimer's lease. It no longer cuts the work, which runs on a context
// detached from River's (package doc, "Long work"); it only tells River's
// stuck-job rescuer when the job of a dead worker may be rescued. -1 (no
// timeout) would make the rescuer skip these jobs for ever.
func (w *worker[TTx]) Timeout(*river.Job[Args]) time.Duration { return w.r.lease }

// Work runs one attempt of the job under the operation's lease.
func (w *worker[TTx]) Work(ctx context.Context, job *river.Job[Args]) error {
	r, a := w.r, job.Args
	// The first worker to start takes the intent's claim by handover; any
	// other (River delivers a job again after a crash, a retry, a snooze)
	// finds it handed over and adopts the record once the lease it was
	// handed under expired. Every run holds a generation of its own.
	lease, rec, err := r.c.Driver().Resume(ctx, a.Tenant, a.OperationID, fence.Token{Generation: a.Generation, Owner: a.Owner})
	if errors.Is(err, durable.ErrFenced) {
		lease, rec, err = r.c.Driver().Resume(ctx, a.Tenant, a.OperationID, fence.Token{})
	}
	switch {
	case errors.Is(err, durable.ErrNotFound):
		// Swept after its retention, or never committed: nothing to run.
		return river.JobCancel(fmt.Errorf("claimriver: operation %s: %w", a.OperationID, err))
	case errors.Is(err, durable.ErrBusy):
		// An earlier run still holds a live lease (it is working, or it
		// died less than a lease ago): come back after it.
		return river.JobSnooze(max(rec.LeaseRemaining, time.Second) + time.Second)
	case err != nil:
		return err // River retries
	case lease == nil:
		return nil // finished, uncertain (the Reconciler's) or released
	}
	op := settle.NewOp(lease)
	var werr error
	// The engine runs the work on a context detached from River's (its
	// timeout, a shutdown or a remote cancel do not cut it; the lease
	// does), renews the lease meanwhile, and records the outcome, retrying
	// while the store is unreachable until the lease ends.
	rep := r.engine.Run(ctx, lease, op, func(wctx context.Context) settle.Settlement {
		res, err := r.work(wctx, Job{OperationID: a.OperationID, Operation: rec.Ref.Operation, Tenant: a.Tenant, Token: lease.Token(), Attempt: job.Attempt, Payload: a.Payload})
		werr = err
		rejected, isReject := claim.RejectedResult(err)
		switch {
		case err == nil:
			return settle.Settlement{Kind: settle.Complete, Result: res}
		case isReject:
			return settle.Settlement{Kind: settle.Fail, Result: rejected}
		case errors.Is(err, ErrNothingHappened):
			return settle.Settlement{Kind: settle.Release}
		}
		// The work started and failed: its effect may have happened.
		return settle.Settlement{Kind: settle.Uncertain}
	})
	return r.answer(a.OperationID, rep, werr)
}

// answer is what River is told of an attempt whose work ran.
func (r *Runner[TTx]) answer(opID string, rep settle.Report, werr error) error {
	switch rep.Verdict() {
	case settle.Lost:
		// Another run (a later attempt, the Reconciler, an operator) took
		// the operation over: its outcome is the operation's. The job is
		// done; that owner decides.
		return nil
	case settle.RecordedRelease:
		// The application said nothing happened: the lease was ended with
		// the record kept processing, and River's retry adopts it at once.
		return fmt.Errorf("claimriver: the attempt had no effect; River retries it: %w", werr)
	case settle.RecordedUncertain:
		slog.Default().Warn("claimriver: the work failed after it started; the operation is uncertain, for the Reconciler",
			"op", opID, "err", werr)
		return nil
	case settle.Recorded:
		return nil
	case settle.RanOut, settle.Pending, settle.ReleasePending:
		// The outcome could not be recorded before the lease ran out: the
		// record stays processing, and River's retry adopts it after the
		// lease, as after a crash (the work may run again: OperationID
		// downstream deduplicates it).
		return fmt.Errorf("claimriver: operation %s: %w", opID, rep.Err)
	case settle.Unrecorded:
	}
	return fmt.Errorf("claimriver: operation %s: recording the outcome: %w", opID, rep.Err)
}
