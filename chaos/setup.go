package chaos

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// The workloads most scenarios start from, built in one call so that each
// scenario reads as what it forces.

// downstreamPlan decides, per operation and call number n, what the
// downstream does.
type downstreamPlan = func(o *op, n int) (fault.Behavior, time.Duration)

// newWorkload is an empty workload with the suite's bounds: an attempt
// within four leases and 2s, a downstream call within two leases.
func (e *env) newWorkload() *workload {
	return &workload{timeout: 4*e.cfg.Lease + 2*time.Second, downstreamTimeout: 2 * e.cfg.Lease}
}

// standardOn is [env.standard] on a new store with settings so, which it
// returns too.
func (e *env) standardOn(ctx context.Context, so storeOpts, newRedis func(client int) redis.Scripter, co claimerOpts) (*workload, storeapi.Store[pgxTx], error) {
	st, err := e.store(so)
	if err != nil {
		return nil, nil, err
	}
	w, err := e.standard(ctx, st, newRedis, co)
	if err != nil {
		return nil, nil, err
	}
	return w, st, nil
}

// plain is the usual workload on the user's Redis, every operation run
// with Do.
func (e *env) plain(ctx context.Context) (*workload, error) {
	w, _, err := e.standardOn(ctx, storeOpts{}, e.userRedis, claimerOpts{})
	return w, err
}

// plainWith is plain with the scenario's hooks set by hook.
func (e *env) plainWith(ctx context.Context, hook func(w *workload)) (*workload, error) {
	w, err := e.plain(ctx)
	if err != nil {
		return nil, err
	}
	hook(w)
	return w, nil
}

// flows is the usual workload on the user's Redis, every operation run as a
// workflow with the suite's downstream, planned by plan (nil: it always
// succeeds).
func (e *env) flows(ctx context.Context, plan downstreamPlan) (*workload, error) {
	st, err := e.store(storeOpts{})
	if err != nil {
		return nil, err
	}
	return e.flowsOn(ctx, st, plan)
}

// flowsOn is flows on the store st.
func (e *env) flowsOn(ctx context.Context, st storeapi.Store[pgxTx], plan downstreamPlan) (*workload, error) {
	w, err := e.standard(ctx, st, e.userRedis, claimerOpts{})
	if err != nil {
		return nil, err
	}
	w.modeOf = flowAll
	return w, e.withDownstream(w, plan)
}

// rawFlows is the usual workload on the user's Redis with Claimers
// configured by co, every operation run as a workflow with a downstream in
// Raw mode (see [env.rawDownstream]) planned by plan (nil: every call
// succeeds); the effects' bodies are flowBody's.
func (e *env) rawFlows(ctx context.Context, co claimerOpts, plan downstreamPlan) (*workload, error) {
	w, _, err := e.standardOn(ctx, storeOpts{}, e.userRedis, co)
	if err != nil {
		return nil, err
	}
	w.modeOf = flowAll
	w.downstream, err = e.rawDownstream(func(o *op, epoch int, id string) []byte { return flowBody(o.key, epoch, id) }, plan)
	return w, err
}

// mix runs w's even operations with Do and its odd ones as workflows with
// the suite's downstream, a tenth of the Do operations business rejections.
func (e *env) mix(w *workload) error {
	w.modeOf = flowOdd
	w.rejectRate = 0.1
	return e.withDownstream(w, nil)
}

// mixedOn is [env.mixed] on the store st, each client's Claimer configured
// by co.
func (e *env) mixedOn(ctx context.Context, st storeapi.Store[pgxTx], newRedis func(int) redis.Scripter, co claimerOpts) (*workload, error) {
	w, err := e.standard(ctx, st, newRedis, co)
	if err != nil {
		return nil, err
	}
	return w, e.mix(w)
}

// mixedBehind starts a Redis server, or a proxy in front of one, with
// start, closes it with the scenario, and builds the mixed workload (see
// [env.mixed]) with every client reaching Redis through it by a client
// from newClient ([env.redisOwn] or [env.redisUser]).
func mixedBehind[S interface {
	Addr() string
	Close()
}](ctx context.Context, e *env, newClient func(addr string, tweak func(*redis.Options)) *redis.Client, start func() (S, error)) (*workload, S, error) {
	srv, err := start()
	if err != nil {
		return nil, srv, err
	}
	e.onClose(srv.Close)
	w, err := e.mixed(ctx, storeOpts{}, func(int) redis.Scripter { return newClient(srv.Addr(), nil) })
	return w, srv, err
}

// planDoFlow is a startOp hook for a mixed workload: it plans doKind with
// probability pDo on its Do operations (the even ones; always the first)
// and flowKind with probability pFlow on its workflows (the odd ones;
// always the first).
func (e *env) planDoFlow(doKind string, pDo float64, flowKind string, pFlow float64) func(context.Context, *op) {
	return func(_ context.Context, o *op) {
		if o.i%2 == 0 {
			e.planned(o, doKind, pDo, 0)
		} else {
			e.planned(o, flowKind, pFlow, 1)
		}
	}
}

// failuresFirst is a downstream plan that refuses before acting for the
// operation's first "failures" calls (see planFailures), then asks then
// (nil: it succeeds).
func failuresFirst(then downstreamPlan) downstreamPlan {
	return func(o *op, n int) (fault.Behavior, time.Duration) {
		switch {
		case n < o.getInt("failures"):
			return fault.FailBefore, 0
		case then != nil:
			return then(o, n)
		}
		return fault.Succeed, 0
	}
}

// planFailures plans how many of o's downstream calls fail first: three
// for the first operation, so a short run still sees them, else one drawn
// below n.
func (e *env) planFailures(o *op, n int) {
	k := 3
	if o.i > 0 {
		k = e.sched.intn(n, "failures", o.i)
	}
	o.setInt("failures", k)
}

// pauseBeforeComplete is a beforeComplete hook: an attempt whose operation
// has kind planned stops renewing its lease, records the fault name, and
// pauses well past its lease (see pauseFor). It reports whether it paused.
func (e *env) pauseBeforeComplete(a *attempt, kind, name string) bool {
	if !a.o.take(kind) {
		return false
	}
	a.stopKeepAlive()
	e.fault(name)
	fault.Pause(e.pauseFor(), nil)
	return true
}

// hold puts a fault in place with set, records it as name, and undoes it
// after d; a fault that could not be put in place is neither recorded nor
// waited for.
func (e *env) hold(ctx context.Context, name string, d time.Duration, set func() (undo func(), err error)) {
	undo, err := set()
	if err != nil {
		return
	}
	e.fault(name)
	sleep(ctx, d)
	undo()
}

// reconcilerClient is the client number of a Reconciler's calls in the
// history.
const reconcilerClient = 1000

// recordAdoption adds to the history a Reconciler's adoption of o's record
// under tok, in a pass that began at start, and returns o's epoch and
// fingerprint.
func (e *env) recordAdoption(o *op, tok fence.Token, start time.Duration) (epoch int, fp string) {
	epoch, fp, _ = o.get()
	e.rec.Add(history.Call{Key: o.key, Epoch: epoch, Client: reconcilerClient, Kind: history.Adopt, Token: tok,
		Fingerprint: fp, Start: start, End: e.rec.Now()})
	return epoch, fp
}

// recordReconciled adds to the history a Reconciler's Complete of o's
// record under tok with res. It is not observed: an open end.
func (e *env) recordReconciled(o *op, epoch int, fp string, tok fence.Token, res durable.Result) {
	now := e.rec.Now()
	e.rec.Add(history.Call{Key: o.key, Epoch: epoch, Client: reconcilerClient, Kind: history.Complete, Ambiguous: true,
		Token: tok, Fingerprint: fp, Body: history.Hash(res.Body), Status: res.StatusCode, Start: now, End: now})
}
