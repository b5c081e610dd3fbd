package chaos

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/riverqueue/river"

	"github.com/oncekey/oncekey/claim/claimriver"
	"github.com/oncekey/oncekey/durable"
)

// river-windows: the entry-point windows through claimriver. Clients
// enqueue each operation (the claim and its job in one transaction) and
// enqueue again until its stored result replays; River workers run the
// family's work. The caller-gone window stops the River client running the
// job with StopAndCancel (the job's context ends; the work must not); the
// duplicate window enqueues again during the work; the transport's timer
// is the job's timeout (the lease, claimriver's worker timeout), shorter
// than the work. A panic is River's to recover; the operation is uncertain
// and its job's retry runs nothing.

// riverEntry is the River family's entry point.
type riverEntry struct {
	x      *entry
	runner *claimriver.Runner[pgxTx]
	rw     *riverWorkers

	mu      sync.Mutex
	clients map[*op]*river.Client[pgxTx] // the worker process that last ran o's work
}

func setupRiverWindows(ctx context.Context, e *env) (*workload, error) {
	x, err := e.newEntry(ctx, allWindows, func(body []byte) durable.Result { return resultOf(200, body) })
	if err != nil {
		return nil, err
	}
	// Enqueue records its own grants (enqueueOnce), the workers' come from
	// the store's handovers and adoptions.
	x.rs.claims = false
	lease := e.cfg.Lease
	rw, err := e.newRiverWorkers(ctx)
	if err != nil {
		return nil, err
	}
	r := &riverEntry{x: x, rw: rw, clients: map[*op]*river.Client[pgxTx]{}}
	x.callerGone = r.stopWorker
	x.duplicate = func(ctx context.Context, o *op) {
		e.bgs.Add(1) // waited for before the verification pass
		go func() { defer e.bgs.Done(); r.attempt(ctx, x.w, o, e.cfg.Clients) }()
	}
	x.timer, x.timerFault = 2*lease, "job-running-past-its-timeout"
	x.timerStart = func(o *op) {
		e.bgs.Add(1)
		go func() { defer e.bgs.Done(); r.pastTimeout(ctx, o) }()
	}
	e.expectFaults(x.timerFault)
	if err := x.start(); err != nil {
		return nil, err
	}
	r.runner, err = claimriver.New(x.server, func(ctx context.Context, job claimriver.Job) (durable.Result, error) {
		o := e.ops[job.OperationID]
		if o == nil {
			return durable.Result{}, errors.New("chaos: a job for an unknown operation")
		}
		if cl, err := river.ClientFromContextSafely[pgxTx](ctx); err == nil {
			r.mu.Lock()
			r.clients[o] = cl
			r.mu.Unlock()
		}
		body, err := x.work(ctx, o, job.OperationID, job.Token)
		switch {
		case errors.Is(err, errEffectUnknown):
			return durable.Result{}, err // uncertain
		case err != nil:
			return durable.Result{}, errors.Join(claimriver.ErrNothingHappened, err)
		}
		return x.encode(body), nil
	}, claimriver.WithMaxAttempts(25), claimriver.WithFinishTimeout(lease), claimriver.WithQueue(rw.queue()))
	if err != nil {
		return nil, err
	}
	rw.tune = func(cfg *river.Config) { cfg.RescueStuckJobsAfter = r.runner.RescueStuckJobsAfter(cfg) }
	if err := rw.startAll(ctx, r.runner, 2); err != nil {
		return nil, err
	}
	x.w.entry = r
	x.w.run = x.runClients
	return x.w, nil
}

// attempt is one Enqueue of client c.
func (r *riverEntry) attempt(ctx context.Context, _ *workload, o *op, c int) bool {
	r.x.arrived(o)
	return r.x.e.enqueueOnce(ctx, r.runner, r.rw.insert, o, c)
}

// stopWorker stops the River client that runs o's job, as a shutdown
// does: StopAndCancel ends the job's context and waits for the work, which
// goes on; a replacement starts.
func (r *riverEntry) stopWorker(o *op) int {
	e := r.x.e
	r.mu.Lock()
	cl := r.clients[o]
	r.mu.Unlock()
	if cl == nil {
		return 0
	}
	e.bgs.Add(1) // waited for before the verification pass
	go func() { defer e.bgs.Done(); r.rw.kill(context.Background(), cl) }()
	return 1
}

// pastTimeout counts the timer window's fault once o's job is still
// running in River's table a whole job timeout (the lease) after its
// attempt began: River's timer ran out during the work.
func (r *riverEntry) pastTimeout(ctx context.Context, o *op) {
	e := r.x.e
	// From a lease on, poll until the job is seen running past the lease
	// (the fault) or is no longer running: one look at a fixed moment
	// missed it on a loaded machine, whose sleep overshot the work.
	sleep(ctx, e.cfg.Lease)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	for rctx.Err() == nil {
		var running, past bool
		err := e.admin.QueryRow(rctx, `SELECT count(*) > 0, COALESCE(bool_or(now() - attempted_at > $2 * interval '1 microsecond'), false)
			FROM `+e.schema+`.river_job WHERE args->>'operation_id' = $1 AND state = 'running'`,
			o.id, e.cfg.Lease.Microseconds()).Scan(&running, &past)
		switch {
		case err != nil || !running:
			return
		case past:
			e.fault(r.x.timerFault)
			return
		}
		sleep(rctx, e.cfg.Lease/10)
	}
}
