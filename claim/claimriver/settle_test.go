package claimriver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/pgproxy"
	"github.com/oncekey/oncekey/testkit/settletest"
)

// enqueue claims key and inserts its job through cl.
func (e *env) enqueue(cl *river.Client[pgx.Tx], key string) claim.Outcome {
	e.t.Helper()
	out, err := e.runner.Enqueue(e.t.Context(), cl, claim.Request{Scope: durable.Scope{Tenant: "acme", Operation: "POST /deploys", Key: key}, Fingerprint: "v1:x"}, []byte(`{}`))
	if err != nil || out.Kind != claim.Acquired {
		e.t.Fatalf("Enqueue = %v, %v", out.Kind, err)
	}
	return out
}

// jobState returns the River state of the operation's job.
func (e *env) jobState(op string) string {
	e.t.Helper()
	var st string
	if err := e.schema.Pool.QueryRow(context.Background(), `SELECT state FROM `+e.schema.Name+`.river_job WHERE args->>'operation_id' = $1`, op).Scan(&st); err != nil {
		e.t.Fatal(err)
	}
	return st
}

// waitJob waits until the operation's job is in state want: River will not
// run it again.
func (e *env) waitJob(op, want string) {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st := e.jobState(op)
		if st == want {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("gave up waiting for the job to be %s: %s", want, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outageAtCompletion is issue 27 #1 on River: lease 2s; the work makes its
// downstream call, then PostgreSQL is unreachable for 300 ms (for the
// runner's Claimer: a proxy that closes every connection) as the outcome
// is written. It returns the downstream calls made by the time the
// operation completed and River finished the job, and the record.
func outageAtCompletion(t *testing.T) (calls int64, rec durable.Record, a claim.Outcome) {
	t.Helper()
	proxy, err := pgproxy.New("tcp", "127.0.0.1:5432")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	e := setupVia(t, 2*time.Second, proxy)
	var once sync.Once
	up := make(chan struct{})
	e.setWork(func(ctx context.Context, j Job) (durable.Result, error) {
		res, err := e.deploy(ctx, j)
		once.Do(func() {
			proxy.SetDown(true)
			time.AfterFunc(300*time.Millisecond, func() { proxy.SetDown(false); close(up) })
		})
		return res, err
	})
	cl := e.client(true)
	a = e.enqueue(cl, "outage")
	rec = e.waitState("acme", a.OperationID, durable.Completed)
	<-up
	e.waitJob(a.OperationID, "completed")
	return e.calls.Load(), rec, a
}

// The store unreachable for 300 ms as the outcome is written, within a 2s
// lease: the completion is retried while the lease lasts and lands; the
// work ran once, the operation completed under the first worker's lease
// (no takeover), and River completed the job. Before, the worker tried
// Complete once, returned the error, and River's retry took the operation
// over after the lease and called the downstream again (2 calls).
func TestAsync_StoreOutageAtCompletionIsRetriedNotRunAgain(t *testing.T) {
	t.Parallel()
	calls, rec, a := outageAtCompletion(t)
	if calls != 1 {
		t.Fatalf("%d downstream calls for one operation; want 1", calls)
	}
	if rec.Takeovers != 0 || rec.Token.Generation != a.Lease.Token().Generation+1 {
		t.Fatalf("completed under generation %d with %d takeovers; want the first worker's (%d), none",
			rec.Token.Generation, rec.Takeovers, a.Lease.Token().Generation+1)
	}
}

// The negative control: with the one-attempt settlement the worker had
// (settletest.OneAttempt), the same scenario runs the work twice. Not
// parallel: the broken mode is the process's.
func TestAsync_StoreOutageAtCompletionCatchesAOneAttemptSettlement(t *testing.T) {
	restore := settletest.Break(t, settletest.OneAttempt)
	t.Cleanup(restore) // after the River client stopped (cleanups run last first)
	calls, _, _ := outageAtCompletion(t)
	if calls < 2 {
		t.Fatalf("%d downstream calls with a one-attempt settlement; the scenario must catch it (want 2)", calls)
	}
}

// A work error after the work started marks the operation uncertain, for
// the Reconciler: River is told the job is done and runs no other attempt
// (before, River retried it and the next attempt ran the work again). A
// retry of the request does not run it either.
func TestAsync_WorkErrorIsUncertainAndNotRunAgain(t *testing.T) {
	t.Parallel()
	e := setup(t, 2*time.Second)
	e.setAnswer(durable.Result{}, errors.New("downstream timed out"))
	cl := e.client(true)
	out := e.enqueue(cl, "uncertain")
	rec := e.waitState("acme", out.OperationID, durable.Uncertain)
	e.waitJob(out.OperationID, "completed")
	if rec.Released {
		t.Fatal("the operation was released")
	}
	if n := e.calls.Load(); n != 1 {
		t.Fatalf("%d attempts ran the work; want 1", n)
	}
	again, err := e.runner.Enqueue(t.Context(), cl, claim.Request{Scope: durable.Scope{Tenant: "acme", Operation: "POST /deploys", Key: "uncertain"}, Fingerprint: "v1:x"}, nil)
	if err != nil || again.Kind != claim.Uncertain || e.jobs() != 1 {
		t.Fatalf("retry = %v, %v, %d jobs; want Uncertain and no new job", again.Kind, err, e.jobs())
	}
}

// An attempt whose error wraps ErrNothingHappened (the application says it
// had no effect) is retried by River, and the retry adopts the operation
// under a new generation and runs it again; a rejection is then stored as
// failed.
func TestAsync_NothingHappenedIsRetriedAndRejectIsFailed(t *testing.T) {
	t.Parallel()
	e := setup(t, 30*time.Second) // the retry adopts at once, not after the lease
	e.setWork(func(ctx context.Context, j Job) (durable.Result, error) {
		if e.calls.Add(1) == 1 {
			return durable.Result{}, fmt.Errorf("connect to the downstream: %w", ErrNothingHappened)
		}
		return durable.Result{}, claim.Reject(durable.Result{StatusCode: 409, Body: []byte(`{"error":"version exists"}`)})
	})
	cl := e.client(true)
	out := e.enqueue(cl, "nothing")
	rec := e.waitState("acme", out.OperationID, durable.Failed)
	if rec.Result.StatusCode != 409 || rec.Token.Generation <= out.Lease.Token().Generation+1 || rec.Takeovers != 1 {
		t.Fatalf("failed record: %d generation %d (the first attempt's %d), %d takeovers", rec.Result.StatusCode, rec.Token.Generation, out.Lease.Token().Generation+1, rec.Takeovers)
	}
	e.waitJob(out.OperationID, "completed")
	if n := e.calls.Load(); n != 2 {
		t.Fatalf("%d runs; want 2", n)
	}
}

// Work that panics after its effect: the engine records the operation
// uncertain and lets the panic go on, River recovers it (a failed attempt),
// and the retry finds the operation uncertain and runs nothing.
func TestAsync_PanicAfterTheEffectIsUncertain(t *testing.T) {
	t.Parallel()
	e := setup(t, 2*time.Second)
	e.setWork(func(ctx context.Context, j Job) (durable.Result, error) {
		if _, err := e.deploy(ctx, j); err != nil {
			return durable.Result{}, err
		}
		panic("after the effect")
	})
	cl := e.client(true)
	out := e.enqueue(cl, "panic")
	rec := e.waitState("acme", out.OperationID, durable.Uncertain)
	e.waitJob(out.OperationID, "completed")
	if rec.Released || e.calls.Load() != 1 || e.effects(out.OperationID) != 1 {
		t.Fatalf("released %v, %d calls, %d effects; want uncertain, 1, 1", rec.Released, e.calls.Load(), e.effects(out.OperationID))
	}
	var errs []byte
	if err := e.schema.Pool.QueryRow(t.Context(), `SELECT errors::text FROM `+e.schema.Name+`.river_job WHERE args->>'operation_id' = $1`, out.OperationID).Scan(&errs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(errs), "after the effect") {
		t.Fatalf("River did not record the panic: %s", errs)
	}
}

// Work longer than River's job timeout (1s here, 1 min by default) and
// than its lease (1s, renewed): River's timer does not cut it, the lease
// bounds it. It completes once, its context never ended. Before, River's
// timeout cancelled the work and its renewals, and every attempt was cut.
func TestAsync_LongWorkOutlivesRiversJobTimeout(t *testing.T) {
	t.Parallel()
	e := setup(t, time.Second)
	var cut atomic.Int32
	e.setWork(func(ctx context.Context, j Job) (durable.Result, error) {
		select {
		case <-ctx.Done():
			cut.Add(1)
			return durable.Result{}, context.Cause(ctx)
		case <-time.After(3 * time.Second):
		}
		return e.deploy(ctx, j)
	})
	cl := e.clientWith(true, func(cfg *river.Config) {
		cfg.JobTimeout = time.Second
		cfg.RescueStuckJobsAfter = e.runner.RescueStuckJobsAfter(cfg)
	})
	out := e.enqueue(cl, "long")
	rec := e.waitState("acme", out.OperationID, durable.Completed)
	e.waitJob(out.OperationID, "completed")
	if cut.Load() != 0 || e.calls.Load() != 1 || rec.Result.StatusCode != http.StatusCreated || rec.Takeovers != 0 {
		t.Fatalf("cut %d times, %d calls, status %d, %d takeovers; want 0, 1, 201, 0", cut.Load(), e.calls.Load(), rec.Result.StatusCode, rec.Takeovers)
	}
}

// The Reconciler given SkipLiveJobs leaves a processing record whose
// lease expired to the operation's live River job (whose next attempt
// adopts it), and takes it once the job is gone (discarded after its last
// attempt). Without the option it adopts the record while the job is
// live: two owners of one retry.
func TestAsync_ReconcilerLeavesLiveJobsToRiver(t *testing.T) {
	t.Parallel()
	e := setup(t, time.Second)
	cl := e.client(false)
	a := e.enqueued("owned")
	e.expire(a.OperationID)
	var asked atomic.Int32
	resolve := func(ctx context.Context, rec durable.Record) (claim.Resolution, error) {
		asked.Add(1)
		return claim.Unresolved(), nil
	}
	r, err := claim.NewReconciler(e.c, resolve, claim.WithStaleAfter(0), e.runner.SkipLiveJobs(cl))
	if err != nil {
		t.Fatal(err)
	}
	before := e.record("acme", a.OperationID)
	rep, err := r.RunOnce(t.Context())
	if err != nil || rep.Scanned != 1 || asked.Load() != 0 {
		t.Fatalf("pass with a live job: %+v, %v, resolver asked %d times; want 1 scanned, not asked", rep, err, asked.Load())
	}
	if after := e.record("acme", a.OperationID); after.Token != before.Token {
		t.Fatalf("the record was adopted while its job is live: %v -> %v", before.Token, after.Token)
	}
	// The job's last attempt died and River discarded it: the record is
	// the Reconciler's.
	if _, err := e.schema.Pool.Exec(t.Context(), `UPDATE `+e.schema.Name+`.river_job SET state = 'discarded', finalized_at = now()`); err != nil {
		t.Fatal(err)
	}
	if rep, err := r.RunOnce(t.Context()); err != nil || asked.Load() != 1 {
		t.Fatalf("pass once the job is gone: %+v, %v, asked %d; want the resolver asked", rep, err, asked.Load())
	}
	if _, err := claim.NewReconciler(e.c, resolve, e.runner.SkipLiveJobs(nil)); !errors.Is(err, claim.ErrConfig) {
		t.Fatalf("SkipLiveJobs(nil): %v; want ErrConfig", err)
	}
}

// River's rescuer, set from the lease, also rescues a job whose worker is
// alive and working longer than that: the rescued retry finds the lease
// renewed and snoozes, the live worker completes the operation, and the
// retry then ends the job without running anything. One call; no takeover.
// The working client never leads (so no rescuer of its own); a second
// client started once the job ran past RescueStuckJobsAfter leads and
// rescues it at once.
func TestAsync_RescueOfALiveWorkerRunsNothingTwice(t *testing.T) {
	t.Parallel()
	e := setup(t, time.Second)
	started := make(chan struct{})
	var once sync.Once
	e.setWork(func(ctx context.Context, j Job) (durable.Result, error) {
		once.Do(func() { close(started) })
		select {
		case <-ctx.Done():
			return durable.Result{}, context.Cause(ctx)
		case <-time.After(8 * time.Second):
		}
		return e.deploy(ctx, j)
	})
	tune := func(cfg *river.Config) {
		cfg.JobTimeout = time.Second
		cfg.RescueStuckJobsAfter = e.runner.RescueStuckJobsAfter(cfg)
	}
	cl := e.clientWith(true, func(cfg *river.Config) { tune(cfg); cfg.LeaderElectionDisabled = true })
	out := e.enqueue(cl, "rescued-alive")
	<-started
	time.Sleep(2 * time.Second) // past RescueStuckJobsAfter (1s) and the jobs' timeout (the lease, 1s)
	e.clientWith(true, tune)
	rec := e.waitState("acme", out.OperationID, durable.Completed)
	e.waitJob(out.OperationID, "completed")
	var errs []byte
	if err := e.schema.Pool.QueryRow(t.Context(), `SELECT errors::text FROM `+e.schema.Name+`.river_job WHERE args->>'operation_id' = $1`, out.OperationID).Scan(&errs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(errs), "Stuck job rescued") {
		t.Fatalf("River never rescued the live job (errors %s): the test did not reach its window", errs)
	}
	if e.calls.Load() != 1 || rec.Takeovers != 0 {
		t.Fatalf("%d calls, %d takeovers; want 1, 0", e.calls.Load(), rec.Takeovers)
	}
}
