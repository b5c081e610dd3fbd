package chaos

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

// reconcile-unresolved (issue 27 #9): every operation's worker applies its
// downstream effect and dies before completing (it stops renewing and
// stays away past its lease). Reconciler passes adopt each stale record
// while the application cannot tell the outcome yet (Unresolved): the
// record must become uncertain. Once the Reconciler's lease ran out, every
// other client retries: each must get uncertain, never a takeover that
// calls the downstream a second time. The application then learns the
// outcomes from the downstream, the next passes complete the records, and
// every retry replays.
func setupReconcileUnresolved(ctx context.Context, e *env) (*workload, error) {
	w, err := e.rawFlows(ctx, claimerOpts{}, nil)
	if err != nil {
		return nil, err
	}
	d := w.downstream

	// The resolver: Unresolved until the application can tell
	// (known), then the downstream's account. Each adoption and
	// completion goes into the history.
	var known atomic.Bool
	r, err := e.newReconcilingBy(w.verifier, func(passStart *time.Duration) func(context.Context, durable.Record) (claim.Resolution, error) {
		return func(ctx context.Context, rec durable.Record) (claim.Resolution, error) {
			o := e.ops[rec.Ref.OperationID()]
			if o == nil {
				return claim.Unresolved(), nil
			}
			epoch, fp := e.recordAdoption(o, rec.Token, *passStart)
			if !known.Load() {
				e.fault("reconciled-unresolved")
				return claim.Unresolved(), nil
			}
			id, err := fault.LookupDownstream(ctx, e.httpc, d.URL(), rec.Ref.OperationID())
			if err != nil {
				return claim.Unresolved(), err // every worker's effect applied: a 404 is an error here
			}
			res := resultOf(200, flowBody(o.key, epoch, id))
			e.recordReconciled(o, epoch, fp, rec.Token, res)
			return claim.Resolved(durable.Completed, res), nil
		}
	}, 0)
	if err != nil {
		return nil, err
	}
	e.expectFaults("worker-died-after-effect", "reconciled-unresolved", "retried-after-the-reconcilers-lease", "reconciled-once-known")

	// The worker dies after its effect: no renewals, no completion until
	// a Reconciler pass adopted its record; its late Complete is fenced.
	w.beforeComplete = func(ctx context.Context, a *attempt) {
		if a.client == 0 && a.o.take("die") {
			a.stopKeepAlive()
			e.fault("worker-died-after-effect")
			e.awaitTakeover(ctx, a.o, a.tok, 8*e.cfg.Lease)
		}
	}
	w.run = func(ctx context.Context, e *env, ops []*op) error {
		r.loop(ctx)
		err := e.eachOp(ctx, ops, func(o *op) {
			o.plan("die", true)
			e.attempt(ctx, w, o, 0, 0)
		})
		r.halt()
		if err != nil {
			return err
		}
		// Every Reconciler lease runs out: the record is free of any
		// live lease, as after a Reconciler that died.
		err = e.eachOp(ctx, ops, func(o *op) {
			until := time.Now().Add(4*e.cfg.Lease + 5*time.Second)
			for time.Now().Before(until) && ctx.Err() == nil {
				if _, _, live, err := e.leaseOf(ctx, o); err == nil && !live {
					break
				}
				sleep(ctx, e.cfg.Lease/10)
			}
			// Every other client: uncertain, never run again.
			for c := 1; c < e.cfg.Clients; c++ {
				e.fault("retried-after-the-reconcilers-lease")
				e.attempt(ctx, w, o, c, 1)
			}
		})
		if err != nil {
			return err
		}
		// The application can tell now: the passes settle every record.
		known.Store(true)
		for pass := 0; pass < len(ops)+10; pass++ {
			rep := r.pass(ctx)
			e.faultN("reconciled-once-known", int64(rep.Resolved))
			if rep.Scanned == 0 {
				break
			}
		}
		// Every client again: each replays, nothing runs again.
		return e.runOps(ctx, w, ops)
	}
	w.after = func(_ context.Context, e *env, ops []*op) error {
		e.oneCallEach(d, ops)
		return nil
	}
	return w, nil
}
