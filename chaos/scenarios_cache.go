package chaos

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/chaos/internal/broken"
	"github.com/oncekey/oncekey/chaos/internal/check"
	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
)

// replay-cache: the replay cache in process (claim.WithReplayCache) on
// most clients, hammered with duplicates of hot keys so that every cached
// Claimer holds their results, through what may make a copy outlive its
// record or answer for a record that has none:
//
//   - records of a short retention expire while the caches are warm;
//     some are then swept, the others are left expired; every key is
//     retried, with its payload or a new one, and must run as a new
//     operation: the history puts the retries in a new epoch, so a replay
//     of the previous life is a violation (the checker's, and
//     noStaleLife's own);
//   - the scenario's Redis keys are deleted (its prefix, never anything
//     else) every lease all along: the cached clients keep answering, and
//     the others find the results in the database;
//   - workflows whose downstream times out after working are marked
//     uncertain: every client's retry must get uncertain (never a cached
//     replay) until they are resolved, some as `oncekey resolve` does
//     (Adopt, then Complete in a transaction), the others by a
//     Reconciler; every retry after that gets the resolution.
//
// The short-retention operations run on Claimers with that retention;
// their next lives are run first by Claimers with a long one (instances of
// the same service that never saw the key), and only then asked by the
// warm ones, so that a second life outlasts the verification pass (as in
// retention) and the warm caches are asked after the new life executed.
//
// Its negative control, expires-in-inflated, reports a live record's
// remaining life an hour longer than it is: the caches (and Redis's
// refilled copies) then keep the first life's result and replay it to the
// retries of the second.
func setupReplayCache(ctx context.Context, e *env) (*workload, error) {
	st, err := e.store(storeOpts{})
	if err != nil {
		return nil, err
	}
	x := &cacheWorld{e: e, st: st, roles: make([]string, e.cfg.Iterations), hits: map[*op]int{}, byKey: map[string]*op{}, marked: map[*op]bool{}}
	for i := range x.roles {
		x.roles[i] = e.cacheRole(i)
	}
	w := e.newWorkload()
	// Every attempt of a short-lived operation starts within window of its
	// first, and each attempt ends within w.timeout: the record, created
	// after the first started, lives past the last attempt by two leases.
	x.window = 4 * e.cfg.Lease
	x.retention = x.window + w.timeout + 2*e.cfg.Lease
	if w.claimers, err = x.claimers(ctx, x.retention); err != nil {
		return nil, err
	}
	if x.long, err = x.claimers(ctx, time.Hour); err != nil {
		return nil, err
	}
	if w.verifier, err = e.claimer(claimerOpts{store: st, redis: e.redisUser("", nil), retention: time.Hour}); err != nil {
		return nil, err
	}
	w.rejectRate = 0.1
	w.modeOf = func(o *op) mode {
		switch x.roles[o.i] {
		case roleUncertain:
			return flowMode
		case roleFlushed:
			return flowOdd(o)
		}
		return doMode
	}
	err = e.withDownstream(w, func(o *op, n int) (fault.Behavior, time.Duration) {
		if n == 0 && x.roles[o.i] == roleUncertain {
			return fault.TimeoutAfter, 0
		}
		return fault.Succeed, 0
	})
	if err != nil {
		return nil, err
	}
	x.short = w
	// The long-retention clients, a workload of their own on the same
	// downstream; the uncertain workflows' downstream call gives up within
	// half a lease (it never answers).
	lw := *w
	lw.claimers = x.long
	x.longW = &lw
	uw := lw
	uw.downstreamTimeout = e.cfg.Lease / 2
	x.uncertainW = &uw
	e.expectFaults("cache-hit-replay", "redis-flushed", "cache-hit-after-redis-flush", "records-expired-warm",
		"retried-after-expiry", "records-swept", "retried-after-sweep", "retried-same-payload", "retried-new-payload",
		"retried-while-uncertain", "uncertain-resolved-by-operator", "uncertain-resolved-by-reconciler", "replayed-after-resolve")
	w.run = x.run
	w.after = x.after
	return w, nil
}

// The roles of replay-cache's operations.
const (
	// roleSwept: short retention, Do; expires warm, is swept, retried.
	roleSwept = "swept"
	// roleExpired: short retention, Do; expires warm, retried unswept
	// (the claim starts the next life on the expired row).
	roleExpired = "expired"
	// roleFlushed: long retention, Do or workflow; warm, Redis flushed,
	// asked again.
	roleFlushed = "flushed"
	// roleUncertain: long retention, workflow; uncertain, asked,
	// resolved, asked again.
	roleUncertain = "uncertain"
)

// cacheRole draws operation i's role; the first seven are fixed, so that a
// short run has each role and each kind of retry (see nextLife).
func (e *env) cacheRole(i int) string {
	if i < 7 {
		return [...]string{roleSwept, roleExpired, roleFlushed, roleUncertain, roleUncertain, roleSwept, roleExpired}[i]
	}
	switch r := e.sched.intn(20, "role", i); {
	case r < 6:
		return roleSwept
	case r < 12:
		return roleExpired
	case r < 15:
		return roleFlushed
	}
	return roleUncertain
}

// cacheBytes is each cached Claimer's budget: far above what a run keeps,
// so nothing is evicted and every entry lives until its deadline.
const cacheBytes = 64 << 20

// operatorClient is the client number of an operator's `oncekey resolve`
// in the history.
const operatorClient = 1001

// cacheWorld is replay-cache's world.
type cacheWorld struct {
	e  *env
	st storeapi.Store[pgxTx]
	// short runs the short-retention clients (0 .. Clients-1); longW the
	// long-retention ones (2*Clients ..), uncertainW them with a short
	// downstream timeout.
	short, longW, uncertainW *workload
	long                     []*claim.Claimer[pgxTx]
	retention, window        time.Duration
	roles                    []string

	flushes atomic.Int64 // flushes that deleted keys

	mu         sync.Mutex
	hits       map[*op]int    // process-cache replays, per operation
	byKey      map[string]*op // the operations, by the suite's key
	resolvedAt time.Duration  // when the uncertain operations were resolved
	marked     map[*op]bool   // uncertain operations whose record became uncertain
}

// claimers builds one Claimer per client with retention: even clients
// with a Redis client of their own, odd ones without (like instances whose
// Redis is not configured), all but the last with the replay cache, every
// other one writing Do's record at commit (as [env.standard]). With three
// clients: Redis and cache, cache alone, Redis alone.
func (x *cacheWorld) claimers(ctx context.Context, retention time.Duration) ([]*claim.Claimer[pgxTx], error) {
	e, n := x.e, x.e.cfg.Clients
	var out []*claim.Claimer[pgxTx]
	for k := 0; k < n; k++ {
		o := claimerOpts{store: x.st, retention: retention, atCommit: k%2 == 1 || e.cfg.negative == broken.CommitOverExisting}
		if k%2 == 0 {
			rc := e.redisUser("", nil)
			rc.AddHook(redisProbe{})
			warm(ctx, rc)
			o.redis = rc
		}
		if k != n-1 {
			o.replayCache = cacheBytes
		}
		c, err := e.claimer(o)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// shortClients and longClients are the client numbers of each set
// (workload.claimer picks client c's Claimer as c modulo Clients).
func (x *cacheWorld) shortClients() []int { return x.clients(0) }
func (x *cacheWorld) longClients() []int  { return x.clients(2 * x.e.cfg.Clients) }

func (x *cacheWorld) clients(from int) []int {
	cs := make([]int, x.e.cfg.Clients)
	for k := range cs {
		cs[k] = from + k
	}
	return cs
}

func (x *cacheWorld) run(ctx context.Context, e *env, ops []*op) error {
	var short, swept, expired, uncertain []*op
	for _, o := range ops {
		x.byKey[o.key] = o
		switch x.roles[o.i] {
		case roleSwept:
			swept = append(swept, o)
			short = append(short, o)
		case roleExpired:
			expired = append(expired, o)
			short = append(short, o)
		case roleUncertain:
			uncertain = append(uncertain, o)
		}
	}
	stop := x.flushEvery(ctx, e.cfg.Lease)
	defer stop()

	// Warm: every operation, its duplicates at once; the ones to be swept
	// first, so that their records are sweepable (two minutes after they
	// were created) the sooner.
	first := append([]*op(nil), swept...)
	for _, o := range ops {
		if x.roles[o.i] != roleSwept {
			first = append(first, o)
		}
	}
	err := e.eachOp(ctx, first, func(o *op) {
		switch x.roles[o.i] {
		case roleSwept, roleExpired:
			x.warmShort(ctx, o)
		case roleFlushed:
			x.warmFlushed(ctx, o)
		case roleUncertain:
			if x.intoUncertain(ctx, o) {
				x.mu.Lock()
				x.marked[o] = true
				x.mu.Unlock()
			}
		}
	})
	if err != nil {
		return err
	}

	// The short-lived records expire; the caches held their results.
	recs, err := x.awaitExpired(ctx, short)
	if err != nil {
		return err
	}
	x.mu.Lock()
	for _, o := range short {
		if _, ok := recs[o.key]; ok && x.hits[o] > 0 {
			e.fault("records-expired-warm")
		}
	}
	x.mu.Unlock()

	// Expired, not swept: the next life starts on the row.
	for _, o := range expired {
		x.nextLife(o)
		if _, ok := recs[o.key]; ok {
			e.fault("retried-after-expiry")
		} else {
			e.observe("retried-without-a-record")
		}
	}
	if err := e.eachOp(ctx, expired, func(o *op) { x.secondLife(ctx, o) }); err != nil {
		return err
	}

	// Uncertain: resolved, then asked again.
	if err := x.resolve(ctx, uncertain); err != nil {
		return err
	}

	// Swept: the next life is a new record. The negative control's bug
	// (an inflated ExpiresIn) is caught in the expired lives above; the
	// sweep, which waits until records are two minutes old, is left out of
	// it to keep CI short.
	if e.cfg.negative == broken.ExpiresInInflated {
		return nil
	}
	before, err := e.presentKeys(ctx, e.records())
	if err != nil {
		return err
	}
	if err := sweepWhenSweepable(ctx, e, x.st, &sweepResult{}); err != nil {
		return err
	}
	after, err := e.presentKeys(ctx, e.records())
	if err != nil {
		return err
	}
	for _, o := range swept {
		x.nextLife(o)
		switch {
		case before[o.key] && !after[o.key]:
			e.fault("records-swept")
			e.fault("retried-after-sweep")
		case before[o.key]:
			e.fault("retried-after-expiry")
		default:
			e.observe("retried-without-a-record")
		}
	}
	return e.eachOp(ctx, swept, func(o *op) { x.secondLife(ctx, o) })
}

// warmShort runs a short-lived operation: sometimes the client without
// cache alone first (the cached ones then learn the result from Redis or
// the database, not from their own commit), then every client at once,
// then twice more every client at once, one attempt each: the cached
// clients answer from their process. No attempt starts after the window.
func (x *cacheWorld) warmShort(ctx context.Context, o *op) {
	until := time.Now().Add(x.window)
	cs := x.shortClients()
	if o.i < 2 || x.e.sched.chance(0.25, "first-alone", o.i) {
		x.burst(ctx, x.short, o, cs[len(cs)-1:], maxAttempts, until, 0)
	}
	x.burst(ctx, x.short, o, cs, maxAttempts, until, 1)
	for r := 2; r <= 3; r++ {
		x.burst(ctx, x.short, o, cs, 1, until, r)
	}
}

// warmFlushed runs a long-lived operation: every client, then every
// client again; after the next flush of Redis, twice more: the cached
// clients answer from their process, the others from the database.
func (x *cacheWorld) warmFlushed(ctx context.Context, o *op) {
	until := time.Now().Add(30*x.e.cfg.Lease + 3*time.Second)
	cs := x.longClients()
	x.burst(ctx, x.longW, o, cs, maxAttempts, until, 1)
	x.burst(ctx, x.longW, o, cs, 1, until, 2)
	if !x.awaitFlush(ctx, 4*x.e.cfg.Lease) {
		return
	}
	_, h3 := x.burst(ctx, x.longW, o, cs, 1, until, 3)
	_, h4 := x.burst(ctx, x.longW, o, cs, 1, until, 4)
	x.e.faultN("cache-hit-after-redis-flush", int64(h3+h4))
}

// intoUncertain runs an uncertain workflow: a long-retention client claims
// it and calls the downstream, which applies the effect and never answers,
// so the client marks it uncertain (tried a few times, should the claim
// itself fail). Then every client retries, and each must get uncertain.
// It reports whether the record became uncertain.
func (x *cacheWorld) intoUncertain(ctx context.Context, o *op) bool {
	e, cs := x.e, x.longClients()
	lead := cs[o.i%len(cs)]
	state := ""
	for try := 0; try < 5 && ctx.Err() == nil; try++ {
		final := e.attempt(ctx, x.uncertainW, o, lead, try)
		var err error
		if _, state, _, err = e.leaseOf(ctx, o); final || (err == nil && state == string(durable.Uncertain)) {
			break
		}
		sleep(ctx, e.cfg.Lease)
	}
	if state != string(durable.Uncertain) {
		// Settled otherwise (the downstream's one timeout went to a
		// claim that failed): asked like any other operation.
		x.burst(ctx, x.longW, o, cs, maxAttempts, time.Now().Add(30*e.cfg.Lease+3*time.Second), 1)
		return false
	}
	for _, c := range cs {
		x.askUncertain(ctx, o, c)
	}
	return true
}

// askUncertain is one Claim of client c for o, whose record is uncertain
// and not resolved yet: the answer must be uncertain. A replay or an
// acquisition is a violation (an acquisition is marked uncertain again).
func (x *cacheWorld) askUncertain(ctx context.Context, o *op, c int) {
	e := x.e
	epoch, fp, _ := o.get()
	pctx, _ := withProbe(ctx)
	actx, cancel := context.WithTimeout(pctx, x.longW.timeout)
	defer cancel()
	call := history.Call{Key: o.key, Epoch: epoch, Client: c, Fingerprint: fp, Start: e.rec.Now()}
	out, err := x.longW.claimer(c).Claim(actx, claim.Request{Scope: o.scope, Fingerprint: fp})
	call.End = e.rec.Now()
	switch {
	case err == nil && out.Kind == claim.Uncertain:
		call.Kind, call.Note, call.Answer = history.NoEffect, "uncertain, before the resolution", history.Uncertain
		e.fault("retried-while-uncertain")
	case err == nil && out.Kind == claim.Replayed:
		call.Kind, call.Body, call.Status = history.Replay, history.Hash(out.Result.Body), out.Result.StatusCode
		from := "from the stores"
		if e.observeCached(actx, out, &call); call.Note != "" {
			from = call.Note
		}
		e.violation("uncertain-until-resolved", history.OpName(o.key, epoch), "client %d got a replay of an uncertain operation before its resolution (%s)", c, from)
	case err == nil && out.Kind == claim.Acquired:
		call.Kind, call.Token = history.Acquire, out.Lease.Token()
		e.violation("uncertain-until-resolved", history.OpName(o.key, epoch), "client %d took over an uncertain record before its resolution", c)
		_ = out.Lease.MarkUncertain(context.WithoutCancel(ctx))
	case err == nil:
		call.Kind, call.Note, call.Answer = history.NoEffect, out.Kind.String(), answerOf(out.Kind)
		e.observe(out.Kind.String())
	case errors.Is(err, claim.ErrMismatch):
		call.Kind, call.Note = history.Mismatch, "mismatch"
	case errors.Is(err, claim.ErrLeaseExpired):
		call.Kind, call.Note = history.NoEffect, err.Error()
	default:
		// The claim may have been granted without its caller learning
		// the token.
		call.Kind, call.Ambiguous, call.Note = history.Acquire, true, err.Error()
		e.observe("error")
	}
	e.rec.Add(call)
}

// resolve settles the uncertain operations (those marked), the even ones as an
// operator with `oncekey resolve` does, the others by a Reconciler's
// passes, each with the downstream's account; then every client asks
// each again and must get the resolution.
func (x *cacheWorld) resolve(ctx context.Context, ops []*op) error {
	e := x.e
	for _, o := range ops {
		if x.marked[o] && o.i%2 == 0 && x.resolveAsOperator(ctx, o) {
			e.fault("uncertain-resolved-by-operator")
		}
	}
	rc, err := e.newReconciling(x.short.verifier, x.short.downstream)
	if err != nil {
		return err
	}
	// Passes until none of these is uncertain any more (the table may
	// hold other scenarios' records the Reconciler cannot resolve).
	left := func() int {
		n := 0
		for _, o := range ops {
			if !x.marked[o] {
				continue
			}
			if _, state, _, err := e.leaseOf(ctx, o); err == nil && state == string(durable.Uncertain) {
				n++
			}
		}
		return n
	}
	for pass := 0; pass < len(ops)+10 && left() > 0; pass++ {
		rep := rc.pass(ctx)
		e.faultN("uncertain-resolved-by-reconciler", int64(rep.Resolved))
		if rep.Scanned == 0 {
			break
		}
	}
	x.mu.Lock()
	x.resolvedAt = e.rec.Now()
	x.mu.Unlock()
	until := time.Now().Add(30*e.cfg.Lease + 3*time.Second)
	return e.eachOp(ctx, ops, func(o *op) {
		x.burst(ctx, x.longW, o, x.longClients(), maxAttempts, until, 5)
		x.burst(ctx, x.longW, o, x.longClients(), 1, until, 6)
	})
}

// resolveAsOperator settles o's uncertain record as `oncekey resolve -as
// completed` does (cmd/oncekey/resolve.go): Adopt under a new generation,
// then Complete in a transaction, with the result the downstream's account
// gives. It reports whether the record was completed.
func (x *cacheWorld) resolveAsOperator(ctx context.Context, o *op) bool {
	e := x.e
	if rec, err := x.st.Get(ctx, o.ref); err != nil || rec.State != durable.Uncertain {
		return false
	}
	id, err := fault.LookupDownstream(ctx, e.httpc, x.short.downstream.URL(), o.id)
	if err != nil {
		e.observe("operator-lookup-failed")
		return false
	}
	epoch, fp, _ := o.get()
	start := e.rec.Now()
	tok, err := x.st.Adopt(ctx, o.ref, uuid.New(), 0, 10*e.cfg.Lease)
	adopt := history.Call{Key: o.key, Epoch: epoch, Client: operatorClient, Kind: history.Adopt, Token: tok, Fingerprint: fp,
		Start: start, End: e.rec.Now(), Note: "oncekey resolve: adopt"}
	switch {
	case errors.Is(err, durable.ErrBusy) || errors.Is(err, durable.ErrNotFound):
		e.observe("operator-adopt-refused")
		return false
	case err != nil:
		adopt.Ambiguous, adopt.Note = true, err.Error()
		e.rec.Add(adopt)
		return false
	}
	e.rec.Add(adopt)
	res := resultOf(200, flowBody(o.key, epoch, id))
	call := history.Call{Key: o.key, Epoch: epoch, Client: operatorClient, Token: tok, Fingerprint: fp,
		Body: history.Hash(res.Body), Status: res.StatusCode, Start: e.rec.Now(), Note: "oncekey resolve: complete"}
	err = x.st.InTx(ctx, func(ctx context.Context, tx pgxTx) error { return x.st.Complete(ctx, tx, o.ref, tok, res) })
	call.End = e.rec.Now()
	switch {
	case err == nil:
		call.Kind = history.Complete
	case errors.Is(err, durable.ErrFenced):
		call.Kind, call.Note = history.Fenced, err.Error()
	case errors.Is(err, durable.ErrUnavailable):
		call.Kind, call.Ambiguous, call.Note = history.Complete, true, err.Error()
	default:
		call.Kind, call.Note = history.NoEffect, err.Error()
	}
	e.rec.Add(call)
	return err == nil
}

// nextLife moves a short-lived operation to its next life (epoch), with
// its payload or a new one: the first two and some others keep theirs
// (their cached results would answer it), the sixth and seventh and some
// others get a new one.
func (x *cacheWorld) nextLife(o *op) {
	e := x.e
	same := o.i < 2 || (o.i >= 7 && e.sched.chance(0.5, "same-payload", o.i))
	if same {
		o.next(fingerprintOf(o.key, 1, "a"))
		e.fault("retried-same-payload")
		return
	}
	o.next(fingerprintOf(o.key, 2, "a new payload"))
	e.fault("retried-new-payload")
}

// secondLife runs a short-lived operation's next life: a long-retention
// client first, alone, until it gets an answer (the new life executed),
// then every client of both sets at once, twice; the warm caches of the
// short-retention clients held the previous life's result and must not
// answer with it.
func (x *cacheWorld) secondLife(ctx context.Context, o *op) {
	e := x.e
	until := time.Now().Add(30*e.cfg.Lease + 3*time.Second)
	lc := x.longClients()
	if finals, _ := x.burst(ctx, x.longW, o, lc[o.i%len(lc):o.i%len(lc)+1], maxAttempts, until, 10); finals == 0 {
		e.observe("next-life-unanswered")
		return
	}
	all := append(x.shortClients(), lc...)
	x.burst(ctx, x.short, o, all, maxAttempts, until, 11)
	x.burst(ctx, x.short, o, all, 1, until, 12)
}

// burst starts clients cs on o at the same moment, each making at most
// attempts attempts (none after until), and waits for them; it returns how
// many got a final answer, and how many of those came from the process
// caches. Clients from 2*Clients on run on the long-retention workload,
// the others on w, so a burst may mix both sets of clients.
func (x *cacheWorld) burst(ctx context.Context, w *workload, o *op, cs []int, attempts int, until time.Time, round int) (finals, hits int) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	var nf, nh atomic.Int64
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ww := w
			if c >= 2*x.e.cfg.Clients {
				ww = x.longW
			}
			final, local := x.ask(ctx, ww, o, c, attempts, until, round)
			if final {
				nf.Add(1)
			}
			if local {
				nh.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	return int(nf.Load()), int(nh.Load())
}

// ask is client c retrying o, with capped exponential backoff and full
// jitter, until it gets a final answer, or attempts ran out, or until
// passed (no attempt starts after it). It reports whether it got a final
// answer, and whether that came from the process cache.
func (x *cacheWorld) ask(ctx context.Context, w *workload, o *op, c, attempts int, until time.Time, round int) (final, local bool) {
	e := x.e
	epoch, _, _ := o.get()
	rnd := e.sched.rnd("cache-jitter", o.i, epoch, c, round)
	for n := 0; n < attempts && ctx.Err() == nil && time.Now().Before(until); n++ {
		pctx, p := withProbe(ctx)
		if e.attempt(pctx, w, o, c, n) {
			if !p.local.Load() {
				return true, false
			}
			e.fault("cache-hit-replay")
			x.mu.Lock()
			x.hits[o]++
			x.mu.Unlock()
			return true, true
		}
		if n+1 < attempts {
			sleep(ctx, e.backoff(n, rnd))
		}
	}
	if attempts > 1 {
		e.observe("client-gave-up")
	}
	return false, false
}

// awaitExpired waits, bounded, until the records of ops are past their
// retention by the database's clock, and returns them by key.
func (x *cacheWorld) awaitExpired(ctx context.Context, ops []*op) (map[string]history.Record, error) {
	e := x.e
	want := map[string]bool{}
	for _, o := range ops {
		want[o.key] = true
	}
	rs := e.records()
	deadline := time.Now().Add(x.retention + 10*time.Second)
	for {
		recs, err := rs.Read(ctx, e.admin)
		if err != nil {
			return nil, err
		}
		got, live := map[string]history.Record{}, 0
		for _, r := range recs {
			if want[r.Key] {
				got[r.Key] = r
				if !r.Expired {
					live++
				}
			}
		}
		if live == 0 {
			return got, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("chaos: replay-cache: %d records of the short retention (%v) still live %v after the warm phase", live, x.retention, x.retention+10*time.Second)
		}
		sleep(ctx, e.cfg.Lease/2)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// flushEvery deletes the scenario's Redis keys (its prefix, nothing else)
// every d until stop is called; each flush that deleted keys is a fault.
func (x *cacheWorld) flushEvery(ctx context.Context, d time.Duration) (stop func()) {
	e := x.e
	rc := e.redisUser("", nil)
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
			if n := flushPrefix(ctx, rc, e.prefix, 5*time.Second); n > 0 {
				e.fault("redis-flushed")
				x.flushes.Add(1)
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(quit) })
		<-done
	}
}

// flushPrefix deletes every key under prefix, within timeout, and returns
// how many it deleted.
func flushPrefix(ctx context.Context, rc *redis.Client, prefix string, timeout time.Duration) int64 {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	iter := rc.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	var n int64
	for len(keys) > 0 {
		k := min(len(keys), 500)
		d, _ := rc.Del(ctx, keys[:k]...).Result()
		n += d
		keys = keys[k:]
	}
	return n
}

// awaitFlush waits, at most d, for the next flush of Redis that deleted
// keys, and reports whether it came.
func (x *cacheWorld) awaitFlush(ctx context.Context, d time.Duration) bool {
	from := x.flushes.Load()
	until := time.Now().Add(d)
	for time.Now().Before(until) && ctx.Err() == nil {
		if x.flushes.Load() > from {
			return true
		}
		sleep(ctx, x.e.cfg.Lease/20)
	}
	return x.flushes.Load() > from
}

// after checks the scenario's own invariant (noStaleLife), counts the
// retries answered with a resolution, and leaves out of the durability
// check the keys whose next life no client saw (their latest acknowledged
// life expired by design).
func (x *cacheWorld) after(_ context.Context, e *env, _ []*op) error {
	calls := e.rec.Calls()
	x.noStaleLife(calls)
	x.mu.Lock()
	resolvedAt := x.resolvedAt
	x.mu.Unlock()
	seen := map[string]bool{}
	for _, c := range calls {
		o := x.byKey[c.Key]
		if o == nil {
			continue
		}
		switch x.roles[o.i] {
		case roleUncertain:
			if x.marked[o] && c.Kind == history.Replay && c.Start >= resolvedAt && c.Client != e.cfg.Clients {
				e.fault("replayed-after-resolve")
			}
		case roleSwept, roleExpired:
			if c.Epoch == 2 && check.IsAck(c) {
				seen[c.Key] = true
			}
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, o := range x.byKey {
		if r := x.roles[o.i]; (r == roleSwept || r == roleExpired) && !seen[k] {
			e.swept[k] = true
		}
	}
	return nil
}

// noStaleLife reports every replay, in a later life of a short-lived
// operation, of a result of an earlier life: a copy kept past its record.
func (x *cacheWorld) noStaleLife(calls []history.Call) {
	old := map[string]map[string]int{} // key -> body -> epoch
	for _, c := range calls {
		if c.Body != "" && (check.IsAck(c) || c.Kind == history.Execute || c.Kind == history.Complete) {
			if old[c.Key] == nil {
				old[c.Key] = map[string]int{}
			}
			if e, ok := old[c.Key][c.Body]; !ok || c.Epoch < e {
				old[c.Key][c.Body] = c.Epoch
			}
		}
	}
	for _, c := range calls {
		if c.Kind != history.Replay {
			continue
		}
		if e, ok := old[c.Key][c.Body]; ok && e < c.Epoch {
			from := "from the stores"
			if c.Note != "" {
				from = c.Note
			}
			x.e.violation("no-replay-of-an-expired-life", c.Op(), "client %d got life %d's result in life %d (%s)", c.Client, e, c.Epoch, from)
		}
	}
}

// cacheProbe follows one attempt: whether it sent a Redis command, and
// whether its answer came from the process cache (a replay the library
// says came from a cache, with no Redis command: the library says the
// durable store was not touched either).
type cacheProbe struct{ redis, local atomic.Bool }

type probeKey struct{}

func withProbe(ctx context.Context) (context.Context, *cacheProbe) {
	p := &cacheProbe{}
	return context.WithValue(ctx, probeKey{}, p), p
}

func probeOf(ctx context.Context) *cacheProbe {
	p, _ := ctx.Value(probeKey{}).(*cacheProbe)
	return p
}

// observeCached counts where a replay out came from, and notes it on call
// when it was the process cache.
func (e *env) observeCached(ctx context.Context, out claim.Outcome, call *history.Call) {
	if !out.FromCache {
		return
	}
	if p := probeOf(ctx); p != nil && !p.redis.Load() {
		p.local.Store(true)
		call.Note = "from the process cache"
		e.observe("replayed-from-process")
		return
	}
	e.observe("replayed-from-redis")
}

// redisProbe is a go-redis hook that marks the probe of a command's
// context: the attempt reached Redis.
type redisProbe struct{}

func (redisProbe) DialHook(next redis.DialHook) redis.DialHook { return next }

func (redisProbe) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if p := probeOf(ctx); p != nil {
			p.redis.Store(true)
		}
		return next(ctx, cmd)
	}
}

func (redisProbe) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if p := probeOf(ctx); p != nil {
			p.redis.Store(true)
		}
		return next(ctx, cmds)
	}
}
