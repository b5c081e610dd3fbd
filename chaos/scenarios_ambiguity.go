package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/chaos/internal/check"
	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// registry lists every scenario in the order Run runs them: the ten
// ambiguity windows of DESIGN.md, then the infrastructure faults.
func registry() []scenario {
	return append([]scenario{
		{name: "concurrent", forces: "window 1: the same key from several clients at once (some with Redis, some without): one effect", setup: setupConcurrent},
		{name: "no-redis", forces: "every client without Redis, claiming first: duplicates, lost responses and reused keys meet at the database, where the Claimers' guesses move (the plain insert first while keys are new, a read first once duplicates dominate); nothing may change an outcome", setup: setupNoRedis},
		{name: "mismatch", forces: "window 2: the same key with a different payload: rejected, never run", setup: setupMismatch},
		{name: "lost-response", forces: "window 3: committed, the response lost, the client retries: replayed", setup: setupLostResponse},
		{name: "crash-before-commit", forces: "window 4: the worker crashes (or fails transiently) before the commit: the retry is safe", setup: setupCrash},
		{name: "client-timeout", forces: "window 5: the request outlives the client's timeout while the server completes it", setup: setupClientTimeout},
		{name: "stale-owner", forces: "window 6: the owner pauses past its lease right before its completion, another takes over, the stale completion is fenced", setup: setupStaleOwner},
		{name: "uncertain", forces: "window 7: the downstream times out after doing the work: marked uncertain, reconciled, not guessed", setup: setupUncertain},
		{name: "retention", forces: "window 8: keys retried after the retention window run as new operations; stuck records are reported, not deleted", setup: setupRetention},
		{name: "replay-cache", forces: "finished results kept in process (WithReplayCache) on most clients: records expire and are swept under warm caches, then retried with the same and a new payload as new operations (no earlier life replayed); Redis flushed all along; uncertain records asked (uncertain, never replayed), resolved by an operator and by a Reconciler, then replayed", setup: setupReplayCache},
		{name: "finished-bursts", forces: "issue 43: operations finished (some with results over the 64 KiB Redis caches), then bursts of concurrent retries with the scenario's Redis keys deleted before and during each burst: every retry replays, none is told in progress", setup: setupFinishedBursts},
		{name: "do-duplicates", forces: "issue 44: duplicates of a Do reach PostgreSQL while the first one's function holds its transaction, with Redis down (breakers open) or the key deleted from Redis inside that transaction: each waits on the key's lock and replays; the function never runs twice at once", setup: setupDoDuplicates},
		{name: "resource-changed", forces: "window 9: the stored success is replayed after the resource changed or was deleted", setup: setupResourceChanged},
		{name: "downstream-incident", forces: "window 10: load during a downstream incident: bounded, jittered retries, no amplification", setup: setupIncident},
		{name: "http-lost-response", forces: "window 3 over HTTP: the middleware commits, the connection drops before the response, the Transport retries: replayed", setup: setupHTTPLostResponse},
		{name: "http-incident", forces: "window 10 over HTTP: the downstream refuses before acting, the handler releases its key (ReleaseKey), Transports retry within their shared budget", setup: setupHTTPIncident},
		{name: "http-client-timeout", forces: "window 5 over HTTP, workflow mode: work longer than the lease outlives every client's timeout; the middleware keeps the lease alive, the retries wait and replay", setup: setupHTTPClientTimeout},
		{name: "http-client-disconnect", forces: "workflow handler: the clients disconnect right after the effect while the work goes on past the lease; their retries arrive during the work and must not run it again", setup: setupHTTPClientDisconnect},
		{name: "http-renewals-fail", forces: "workflow handler: the store refuses renewals for longer than the lease after the effect; nobody takes over, the fenced completion still succeeds", setup: setupHTTPRenewalsFail},
		{name: "http-panic-after-effect", forces: "workflow handler panics after its effect: marked uncertain, retries get 202, the Reconciler resolves it, nothing runs twice", setup: setupHTTPPanic},
		{name: "http-oversized-response", forces: "workflow handler writes more than MaxResponseBody after its effect: stored by status without body, the first answer and every replay alike", setup: setupHTTPOversized},
		{name: "http-finish-outage-short", forces: "the store refuses Complete and Fail for less than FinishTimeout as the workflow handler returns: retried, answered as usual", setup: setupHTTPFinishShort},
		{name: "http-finish-outage-long", forces: "the store refuses Complete and Fail past FinishTimeout but within the lease: 202, retries see it in progress, the background completion lands", setup: setupHTTPFinishLong},
		{name: "reconcile-after-retention", forces: "an uncertain operation past its retention stays uncertain, is reconciled, then replayed for a full retention, never run again", setup: setupReconcileAfterRetention},
		{name: "reconcile-unresolved", forces: "a dead worker's record the Reconciler cannot resolve yet becomes uncertain: retries after the Reconciler's lease get uncertain, never a second run; settled once the outcome is known", setup: setupReconcileUnresolved},
		{name: "redis-restart", forces: "Redis restarted empty mid-run, and by a workflow while it holds its key: generations repeat in Redis, duplicates get fresh Redis leases, the database arbitrates", ownRedis: true, onServers: true, setup: setupRedisRestart},
		{name: "redis-failover", forces: "Redis failed over to a replica that missed writes (replication paused, REPLICAOF NO ONE)", ownRedis: true, onServers: true, setup: setupFailover},
		{name: "split-brain", forces: "Redis split brain: primary SIGSTOPped, replica promoted, old primary resumed and still used by some clients; and held by a workflow whose confirmed lease reached the replica: it completes on its side, and a retry goes at once to the side that kept its lease, where it must replay", ownRedis: true, onServers: true, setup: setupSplitBrain},
		{name: "redis-down", forces: "Redis blackholed, its connections cut, its replies cut after N bytes: the breaker opens, the database alone decides", setup: setupRedisDown},
		{name: "redis-eviction", forces: "Redis under maxmemory with allkeys-lru evicting leases and cached results", ownRedis: true, setup: setupEviction},
		{name: "redis-delayed-reply", forces: "Redis replies delayed past the read timeout: go-redis re-sends the scripts, which run again", setup: setupDelayedReply},
		{name: "db-cut-before-commit", forces: "PostgreSQL backends terminated mid-transaction (pg_terminate_backend), before the commit", setup: setupDBKill},
		{name: "db-cut-after-commit", forces: "a COMMIT (or a fenced write) applied whose acknowledgement is lost", setup: setupCommitCut},
		{name: "paused-owner", forces: "an owner paused past its lease inside its transaction or before its completion while another takes over", setup: setupPausedOwner},
		{name: "async-river", forces: "async mode on River: workers paused past their lease (the job handed on, the paused completion fenced) and killed mid-job (the retry takes over), Redis restarted empty; one effect, the stored result replayed", ownRedis: true, setup: setupAsyncRiver},
		{name: "clock-skew", forces: "worker clocks hours off and jumping, Redis leases vanishing early (a Redis clock jump): nothing changes, no live lease is taken over", setup: setupClockSkew},
	}, append(append(entryRegistry(), pgRegistry()...), nemesisRegistry()...)...)
}

// userRedis gives every client a client of its own for the user's Redis.
func (e *env) userRedis(int) redis.Scripter { return e.redisUser("", nil) }

func flowOdd(o *op) mode {
	if o.i%2 == 1 {
		return flowMode
	}
	return doMode
}

func flowAll(*op) mode { return flowMode }

// planned draws a per-operation fault: always for the operations in
// always (so a short run still fires it), else with probability p.
func (e *env) planned(o *op, kind string, p float64, always ...int) bool {
	for _, i := range always {
		if o.i == i {
			return o.plan(kind, e.sched.chance(1, kind, o.i))
		}
	}
	return o.plan(kind, e.sched.chance(p, kind, o.i))
}

func setupConcurrent(ctx context.Context, e *env) (*workload, error) {
	px, err := fault.NewProxy(e.redisOpt.Addr)
	if err != nil {
		return nil, err
	}
	e.onClose(px.Close)
	// Odd clients run without Redis, like an instance whose Redis is not
	// configured: their duplicates meet the others at the row lock. The
	// others reach Redis through a proxy that sometimes adds latency,
	// widening the window between the Redis claim and the durable one.
	w, _, err := e.standardOn(ctx, storeOpts{}, func(c int) redis.Scripter {
		if c%2 == 1 {
			return nil
		}
		return e.redisUser(px.Addr(), nil)
	}, claimerOpts{})
	if err != nil {
		return nil, err
	}
	w.rejectRate = 0.15
	w.startOp = func(ctx context.Context, o *op) {
		e.fault("concurrent-burst")
		if e.planned(o, "latency", 0.05, 1) {
			e.bg(func() {
				e.hold(ctx, "redis-latency", e.cfg.Lease, func() (func(), error) { return px.Latency(e.cfg.Lease/10, e.cfg.Lease/20) })
			})
		}
	}
	return w, nil
}

// setupNoRedis runs every client without Redis, so each durable claim is
// one Redis did not grant and the Claimers' guesses decide its statements
// (claim/newguess.go): the clients that claim first (the even ones) see one
// new key for two found records per burst, and read first within a few
// operations. Dropped acknowledgements add replays; a reused key with
// another payload must be rejected from the read as from the claim.
func setupNoRedis(ctx context.Context, e *env) (*workload, error) {
	w, _, err := e.standardOn(ctx, storeOpts{}, func(int) redis.Scripter { return nil }, claimerOpts{})
	if err != nil {
		return nil, err
	}
	w.startOp = func(_ context.Context, o *op) {
		e.fault("concurrent-burst")
		if !e.planned(o, "drop", 0.4, 0) {
			e.planned(o, "mismatch", 0.3, 1)
		}
	}
	w.dropAck = func(o *op, _ int) bool { return o.take("drop") }
	w.fingerprint = e.otherPayload(2)
	return w, nil
}

func setupMismatch(ctx context.Context, e *env) (*workload, error) {
	return e.plainWith(ctx, func(w *workload) {
		w.startOp = func(_ context.Context, o *op) { e.planned(o, "mismatch", 0.6, 0) }
		w.fingerprint = e.otherPayload(1)
	})
}

// otherPayload is a workload's fingerprint function under which client
// sends another payload for the operations planned "mismatch" (the
// "different-payload" fault, counted once per operation) and every other
// call the operation's own.
func (e *env) otherPayload(client int) func(o *op, c int) string {
	return func(o *op, c int) string {
		epoch, fp, _ := o.get()
		if c == client && o.planned("mismatch") {
			if o.take("mismatch") {
				e.fault("different-payload")
			}
			return fingerprintOf(o.key, epoch, "other payload")
		}
		return fp
	}
}

func setupLostResponse(ctx context.Context, e *env) (*workload, error) {
	return e.plainWith(ctx, func(w *workload) {
		w.startOp = func(_ context.Context, o *op) { e.planned(o, "drop", 0.7, 0) }
		w.dropAck = func(o *op, _ int) bool { return o.take("drop") }
	})
}

func setupCrash(ctx context.Context, e *env) (*workload, error) {
	return e.plainWith(ctx, func(w *workload) {
		w.startOp = func(_ context.Context, o *op) {
			if !e.planned(o, "crash", 0.5, 0) {
				e.planned(o, "transient", 0.4, 1)
			}
		}
		w.afterEffect = func(_ context.Context, a *attempt) error {
			switch {
			case a.o.take("crash"):
				// The process dies with the effect written but not committed:
				// the transaction is rolled back for certain.
				e.fault("crash-before-commit")
				a.rolledBack = true
				panic(errCrash)
			case a.o.take("transient"):
				e.fault("transient-error")
				a.rolledBack = true
				return errInjected
			}
			return nil
		}
	})
}

func setupClientTimeout(ctx context.Context, e *env) (*workload, error) {
	return e.plainWith(ctx, func(w *workload) {
		w.startOp = func(_ context.Context, o *op) { e.planned(o, "slow", 0.6, 0) }
		w.inTx = func(_ context.Context, a *attempt) error {
			if a.o.take("slow") {
				// Slow, but well inside the lease: the server finishes.
				time.Sleep(e.cfg.Lease / 2)
			}
			return nil
		}
		w.clientTimeout = func(o *op, _, n int) time.Duration {
			if n == 0 && o.planned("slow") {
				return e.cfg.Lease / 6
			}
			return 0
		}
	})
}

// pauseFor is how long a paused worker stops: well past its lease.
func (e *env) pauseFor() time.Duration { return e.cfg.Lease*5/2 + 50*time.Millisecond }

func setupStaleOwner(ctx context.Context, e *env) (*workload, error) {
	st, err := e.store(storeOpts{})
	if err != nil {
		return nil, err
	}
	// The takeovers must come after the paused owner's lease ran out.
	w, err := e.flowsOn(ctx, e.watchLeases(st, newLeaseFloors()), nil)
	if err != nil {
		return nil, err
	}
	e.expectFaults("paused-past-lease", "taken-over-during-pause")
	w.startOp = func(_ context.Context, o *op) { e.planned(o, "pause", 0.6, 0) }
	// The owner passed every check of its own (the claim, the downstream
	// call under its token) and pauses right before the durable write:
	// the completion it then sends, after another owner took over, is the
	// one the fence must reject.
	w.beforeComplete = func(ctx context.Context, a *attempt) {
		if e.pauseBeforeComplete(a, "pause", "paused-past-lease") && e.awaitTakeover(ctx, a.o, a.tok, 8*e.cfg.Lease) {
			e.fault("taken-over-during-pause")
		}
	}
	return w, nil
}

// awaitTakeover waits, at most d, until o's record is held under a
// generation above tok's (another owner took it over), and reports
// whether it saw that.
func (e *env) awaitTakeover(ctx context.Context, o *op, tok fence.Token, d time.Duration) bool {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d+5*time.Second)
	defer cancel()
	until := time.Now().Add(d)
	for {
		if gen, _, _, err := e.leaseOf(rctx, o); err == nil && gen > tok.Generation {
			return true
		}
		if time.Now().After(until) {
			return false
		}
		sleep(rctx, e.cfg.Lease/10)
	}
}

func setupUncertain(ctx context.Context, e *env) (*workload, error) {
	w, err := e.flows(ctx, func(o *op, n int) (fault.Behavior, time.Duration) {
		switch {
		case n == 0 && o.planned("timeout"):
			return fault.TimeoutAfter, 0
		case n == 0 && o.planned("fail"):
			return fault.FailBefore, 0
		}
		return fault.Succeed, 0
	})
	if err != nil {
		return nil, err
	}
	w.downstreamTimeout = e.cfg.Lease / 2
	w.startOp = func(_ context.Context, o *op) {
		if !e.planned(o, "timeout", 0.5, 0) {
			e.planned(o, "fail", 0.3, 1)
		}
	}
	d := w.downstream
	rc, err := e.newReconciling(w.verifier, d)
	if err != nil {
		return nil, err
	}
	w.run = func(ctx context.Context, e *env, ops []*op) error {
		rc.loop(ctx)
		return e.runOps(ctx, w, ops)
	}
	// The reconciler keeps running through the verification pass.
	w.after = func(context.Context, *env, []*op) error {
		rc.halt()
		s := d.Stats()
		e.faultN("downstream-timeout-after-work", int64(s.Timeouts))
		e.faultN("downstream-failure", int64(s.Failures))
		return nil
	}
	return w, nil
}

// sweepResult is what sweepWhenSweepable deleted.
type sweepResult struct{ n int }

// sweepWhenSweepable waits, bounded, until every finished record past its
// retention is sweepable (Sweep keeps a finished record until the database
// clock is two minutes past its generation, which starts near the clock,
// so that generations never repeat after a deletion), sweeps, and reports
// every sweepable finished record that survived.
func sweepWhenSweepable(ctx context.Context, e *env, st storeapi.Store[pgxTx], res *sweepResult) error {
	rs := e.records()
	wait := time.Now().Add(sweepWaitBound)
	for {
		recs, err := rs.Read(ctx, e.admin)
		if err != nil {
			return err
		}
		pending := 0
		for _, r := range recs {
			if r.Expired && !r.Sweepable && (r.State == "completed" || r.State == "failed") {
				pending++
			}
		}
		if pending == 0 || time.Now().After(wait) {
			break
		}
		sleep(ctx, time.Second)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	recs, err := rs.Read(ctx, e.admin)
	if err != nil {
		return err
	}
	n, err := sweepAll(ctx, st)
	res.n += n
	if err != nil {
		return err
	}
	present, err := e.presentKeys(ctx, rs)
	if err != nil {
		return err
	}
	for _, r := range recs {
		if r.Sweepable && (r.State == "completed" || r.State == "failed") && present[r.Key] {
			e.violation("sweep-removes-expired", r.Key, "a finished record past its retention survived the sweep")
		}
	}
	return nil
}

// sweepAll sweeps st, a hundred records a call, until a call deletes none,
// and returns how many records it deleted (until the error, on one).
func sweepAll(ctx context.Context, st storeapi.Store[pgxTx]) (int, error) {
	total := 0
	for {
		n, err := st.Sweep(ctx, 100)
		if err != nil {
			return total, err
		}
		total += n
		if n == 0 {
			return total, nil
		}
	}
}

// presentKeys reads the scenario's records from rs and returns their keys.
func (e *env) presentKeys(ctx context.Context, rs history.Records) (map[string]bool, error) {
	recs, err := rs.Read(ctx, e.admin)
	if err != nil {
		return nil, err
	}
	present := map[string]bool{}
	for _, r := range recs {
		present[r.Key] = true
	}
	return present, nil
}

// sweepWaitBound bounds how long the retention scenario waits for its
// finished records to become sweepable (two minutes past their
// generation by the database clock; see durable's package documentation).
const sweepWaitBound = 150 * time.Second

func setupRetention(ctx context.Context, e *env) (*workload, error) {
	retention := 4 * e.cfg.Lease
	w, st, err := e.standardOn(ctx, storeOpts{}, e.userRedis, claimerOpts{retention: retention})
	if err != nil {
		return nil, err
	}
	w.rejectRate = 0.1
	roles := map[*op]string{}
	sweptEarly := &sweepResult{}
	w.run = func(ctx context.Context, e *env, ops []*op) error {
		var retried, swept, stuck []*op
		for _, o := range ops {
			role := "retry"
			switch {
			case o.i == 1:
				role = "swept"
			case o.i == 2:
				role = "stuck"
			case o.i > 2:
				switch r := e.sched.intn(10, "role", o.i); {
				case r >= 8:
					role = "stuck"
				case r >= 5:
					role = "swept"
				}
			}
			roles[o] = role
			switch role {
			case "retry":
				retried = append(retried, o)
			case "swept":
				swept = append(swept, o)
			default:
				stuck = append(stuck, o)
			}
		}
		// Stuck: a worker claims and dies; its record stays processing
		// past its retention.
		for _, o := range stuck {
			o.skipVerify()
			_, fp, _ := o.get()
			var out claim.Outcome
			var call history.Call
			var err error
			for try := 0; ; try++ {
				start := e.rec.Now()
				out, err = w.claimers[0].Claim(ctx, claim.Request{Scope: o.scope, Fingerprint: fp})
				call = history.Call{Key: o.key, Epoch: 1, Fingerprint: fp, Start: start, End: e.rec.Now()}
				if !errors.Is(err, claim.ErrLeaseExpired) || try == 4 {
					break
				}
				// The claim's round trip used up the start margin on a
				// loaded machine: the key was released, nothing ran. As
				// the workload does, record it and claim again.
				call.Kind, call.Note = history.NoEffect, err.Error()
				e.rec.Add(call)
				e.observe("lease-expired-before-start")
			}
			if err != nil || out.Kind != claim.Acquired {
				return fmt.Errorf("chaos: retention: stuck claim: %v %v", out.Kind, err)
			}
			call.Kind, call.Token, call.Note = history.Acquire, out.Lease.Token(), "abandoned"
			e.rec.Add(call)
			e.fault("stuck-record")
		}
		first := append(append([]*op(nil), retried...), swept...)
		if err := e.runOps(ctx, w, first); err != nil {
			return err
		}
		sleep(ctx, retention+e.cfg.Lease)
		if err := sweepWhenSweepable(ctx, e, st, sweptEarly); err != nil {
			return err
		}
		for _, o := range retried {
			fp := fingerprintOf(o.key, 1, "a")
			if e.sched.chance(0.5, "new-payload", o.i) {
				fp = fingerprintOf(o.key, 2, "a new payload")
			}
			o.next(fp)
			e.fault("retried-after-retention")
		}
		for _, o := range swept {
			o.skipVerify()
		}
		// The second lives complete under a retention that outlasts the
		// run: the verification pass retries every operation once more
		// after the whole phase, and a record whose short retention ran out
		// in between would rightly run again as a third life (at 1000
		// operations the phase outlasts 4 leases). Expiry is what phase one
		// tests; phase two tests that the retry ran as a new operation.
		long, err := e.standard(ctx, st, e.userRedis, claimerOpts{retention: time.Hour})
		if err != nil {
			return err
		}
		w.claimers, w.verifier = long.claimers, long.verifier
		return e.runOps(ctx, w, retried)
	}
	w.after = func(ctx context.Context, e *env, ops []*op) error {
		rs := e.records()
		recs, err := rs.Read(ctx, e.admin)
		if err != nil {
			return err
		}
		var found []string
		finished := map[string]bool{}
		for _, r := range recs {
			if r.Expired && (r.State == "uncertain" || (r.State == "processing" && r.Owner != uuid.Nil)) {
				found = append(found, r.Key)
			}
			if r.Sweepable && (r.State == "completed" || r.State == "failed") {
				finished[r.Key] = true
			}
		}
		stats, err := st.Stats(ctx)
		if err != nil {
			return err
		}
		total, err := sweepAll(ctx, st)
		if err != nil {
			return err
		}
		e.faultN("swept-records", int64(total+sweptEarly.n))
		present, err := e.presentKeys(ctx, rs)
		if err != nil {
			return err
		}
		var left []string
		for _, k := range found {
			if present[k] {
				left = append(left, k)
			}
		}
		e.mu.Lock()
		e.stuck = &check.Stuck{Found: found, Reported: stats.ExpiredStuck, Left: left}
		for o, role := range roles {
			if role == "swept" {
				e.swept[o.key] = true
			}
		}
		e.mu.Unlock()
		for k := range finished {
			if present[k] {
				e.violation("sweep-removes-expired", k, "a finished record past its retention survived the sweep")
			}
		}
		return nil
	}
	return w, nil
}

func setupResourceChanged(ctx context.Context, e *env) (*workload, error) {
	return e.plainWith(ctx, func(w *workload) {
		w.run = func(ctx context.Context, e *env, ops []*op) error {
			if err := e.runOps(ctx, w, ops); err != nil {
				return err
			}
			for _, o := range ops {
				var q string
				switch {
				case o.i == 0 || (o.i > 1 && e.sched.chance(0.3, "delete", o.i)):
					q = `DELETE FROM ` + e.tables.Resources() + ` WHERE scenario = $1 AND key = $2`
					e.fault("resource-deleted")
				case o.i == 1 || e.sched.chance(0.5, "change", o.i):
					q = `UPDATE ` + e.tables.Resources() + ` SET data = 'changed after the fact' WHERE scenario = $1 AND key = $2`
					e.fault("resource-changed")
				default:
					continue
				}
				if _, err := e.admin.Exec(ctx, q, e.name, o.key); err != nil {
					return err
				}
			}
			// Every client asks again: each must get the stored result back.
			return e.runOps(ctx, w, ops)
		}
	})
}

func setupIncident(ctx context.Context, e *env) (*workload, error) {
	w, err := e.flows(ctx, failuresFirst(func(o *op, _ int) (fault.Behavior, time.Duration) {
		if o.planned("slow") {
			return fault.Slow, e.cfg.Lease / 4
		}
		return fault.Succeed, 0
	}))
	if err != nil {
		return nil, err
	}
	w.startOp = func(_ context.Context, o *op) {
		e.planFailures(o, 4)
		e.planned(o, "slow", 0.3, 1)
	}
	w.run = func(ctx context.Context, e *env, ops []*op) error {
		err := e.runOps(ctx, w, ops)
		s := w.downstream.Stats()
		e.faultN("downstream-503", int64(s.Failures))
		e.faultN("downstream-slow", int64(s.Slow))
		calls := w.downstream.Calls()
		total := 0
		for _, o := range ops {
			n, k := calls[o.id], o.getInt("failures")
			total += n
			// One call per failure (each released the key) and one that
			// succeeded: the clients' duplicates never reach the
			// downstream. One more is allowed for a lease lost to a
			// starved machine.
			if n > k+2 {
				e.violation("no-amplification", o.key, "the downstream got %d calls for %d planned failures", n, k)
			}
		}
		e.counter(e.obs, "downstream-calls").Add(int64(total))
		return err
	}
	return w, nil
}

// resolveByDownstreamOf is a reconciler's resolve function that asks the
// downstream (for each operation, the one pick returns) what became of an
// operation: applied → completed with the downstream's answer, stored as
// encode(body) (nil: the HTTP shape, resultOf), unknown there (404) → left
// for a later pass. Each adoption and completion goes into the history;
// *passStart is when the current pass began.
func (e *env) resolveByDownstreamOf(pick func(o *op) *fault.Downstream, passStart *time.Duration, encode func([]byte) durable.Result) func(context.Context, durable.Record) (claim.Resolution, error) {
	if encode == nil {
		encode = func(body []byte) durable.Result { return resultOf(200, body) }
	}
	return func(ctx context.Context, p durable.Record) (claim.Resolution, error) {
		o := e.ops[p.Ref.OperationID()]
		if o == nil {
			return claim.Unresolved(), nil
		}
		epoch, fp := e.recordAdoption(o, p.Token, *passStart)
		id, err := fault.LookupDownstream(ctx, e.httpc, pick(o).URL(), p.Ref.OperationID())
		var de *fault.DownstreamError
		if errors.As(err, &de) && de.Status == 404 {
			e.observe("reconciled-unknown")
			return claim.Unresolved(), nil
		}
		if err != nil {
			return claim.Unresolved(), err
		}
		res := encode(flowBody(o.key, epoch, id))
		e.recordReconciled(o, epoch, fp, p.Token, res)
		return claim.Resolved(durable.Completed, res), nil
	}
}
