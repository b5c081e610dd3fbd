package claimriver

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

// liveStates are the states of a job River will still run: the job that
// continues its operation.
var liveStates = []rivertype.JobState{
	rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRetryable,
	rivertype.JobStateRunning, rivertype.JobStateScheduled,
}

// riverJobTimeoutDefault is River's Config.JobTimeout when it is 0
// (river.JobTimeoutDefault).
const riverJobTimeoutDefault = river.JobTimeoutDefault

// RescueStuckJobsAfter returns the river.Config.RescueStuckJobsAfter that
// brings back the job of a worker that died (killed, crashed, lost its
// host) soon after its lease ends: the Claimer's lease, or cfg.JobTimeout
// when that is longer (River refuses a RescueStuckJobsAfter below its
// JobTimeout; 0 stands for River's default of 1 minute, -1 for none).
// River's own default is 1 hour.
//
//	cfg := &river.Config{Workers: workers, Queues: queues /* ... */}
//	cfg.RescueStuckJobsAfter = runner.RescueStuckJobsAfter(cfg)
//
// River's rescuer looks every 30 seconds for jobs running longer than both
// RescueStuckJobsAfter and their own timeout (this Runner's jobs: the
// lease) and schedules their retry by the retry policy. So the job of a
// worker that died is retried at most RescueStuckJobsAfter after its attempt
// began, plus 30 seconds, plus the retry policy's delay; the retry adopts
// the operation once the dead worker's lease has expired (it snoozes until
// then). A live worker whose work runs longer is rescued as well: its retry
// finds the lease renewed and snoozes until the operation is finished, then
// ends. Nothing runs twice either way: the record decides, never River's
// job state.
//
// RescueStuckJobsAfter is the client's, for every job kind: a job of
// another kind is then rescued once both it and that kind's own timeout
// (Worker.Timeout, or JobTimeout) have passed.
func (r *Runner[TTx]) RescueStuckJobsAfter(cfg *river.Config) time.Duration {
	jt := riverJobTimeoutDefault
	if cfg != nil && cfg.JobTimeout != 0 {
		jt = cfg.JobTimeout
	}
	return max(r.lease, jt)
}

// SkipLiveJobs returns the claim.NewReconciler option that leaves to this
// Runner's River jobs the processing records of their operations: a
// processing record whose operation still has a live job (available,
// pending, retryable, running or scheduled) is skipped, since that job's
// next attempt adopts it after its lease. The Reconciler then has
// uncertain records, which a job never runs, and processing records whose
// job is gone (discarded after its last attempt, cancelled). client lists
// the jobs (River's JobList).
//
//	rec, err := claim.NewReconciler(c, resolve, runner.SkipLiveJobs(client))
func (r *Runner[TTx]) SkipLiveJobs(client *river.Client[TTx]) claim.ReconcilerOption {
	if client == nil {
		return claim.WithSkip(nil) // NewReconciler refuses it (ErrConfig)
	}
	return claim.WithSkip(func(ctx context.Context, rec durable.Record) (bool, error) {
		if rec.State != durable.Processing {
			return false, nil
		}
		res, err := client.JobList(ctx, river.NewJobListParams().Kinds(Kind).States(liveStates...).
			Where("args ->> 'operation_id' = @op", river.NamedArgs{"op": rec.Ref.OperationID()}).First(1))
		if err != nil {
			return false, fmt.Errorf("claimriver: list the operation's jobs: %w", err)
		}
		return len(res.Jobs) > 0, nil
	})
}
