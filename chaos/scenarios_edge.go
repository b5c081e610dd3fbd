package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/oncekey/oncekey/chaos/internal/check"
	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimclient"
	"github.com/oncekey/oncekey/claim/claimhttp"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// The edge scenarios force the windows of claimhttp's rule after a
// workflow handler started: once its effect may have happened, the
// middleware only completes, fails or marks uncertain. The handler's work
// outlives its client, its lease is renewed until it returns, refused
// renewals and finishing writes do not lose the outcome, a panic is
// uncertain, an oversized response is stored without its body. And one
// window of the reconciler: an uncertain operation resolved after its
// retention is replayed afterwards, not run again.
//
// Their downstream applies every call its fence accepts (fault's Raw
// mode): a second execution of an operation is a second row in the
// effects table, which the checker counts, and a second call at the
// downstream, which each scenario counts too (at most one per key).

// The fenced writes a faultyStore can refuse; each is also the prefix of
// the fault kind counted when a refusal fires ("renew-refused", ...).
const (
	refuseRenew     = "renew"
	refuseComplete  = "complete"
	refuseFail      = "fail"
	refuseUncertain = "mark-uncertain"
)

// faultyStore is a durable store that refuses chosen fenced writes of
// chosen operations during a window, with an error wrapping
// durable.ErrUnavailable and before writing anything: the store
// unreachable for those writes, everything else untouched.
type faultyStore struct {
	storeapi.Store[pgxTx]
	e *env

	mu      sync.Mutex
	windows map[string]map[string]time.Time // operation id -> method -> refused until
	first   map[string]time.Time            // operation id -> its first refusal
	landed  map[string]time.Time            // operation id -> first finishing write after a refusal
}

func newFaultyStore(e *env, st storeapi.Store[pgxTx]) *faultyStore {
	return &faultyStore{Store: st, e: e, windows: map[string]map[string]time.Time{},
		first: map[string]time.Time{}, landed: map[string]time.Time{}}
}

// InsertAtCommit is the store's: the edge's flows claim with leases, and
// the refusals apply to their fenced writes only.
func (s *faultyStore) InsertAtCommit(ctx context.Context, p storeapi.ClaimParams, tok fence.Token, fn func(ctx context.Context, tx pgxTx) (durable.State, durable.Result, error)) error {
	return insertAtCommit(ctx, s.Store, p, tok, fn)
}

// refuse refuses methods of ref's operation for d from now.
func (s *faultyStore) refuse(ref durable.Ref, d time.Duration, methods ...string) {
	id := ref.OperationID()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.windows[id] == nil {
		s.windows[id] = map[string]time.Time{}
	}
	for _, m := range methods {
		s.windows[id][m] = time.Now().Add(d)
	}
}

// refused returns the injected error when method of ref is refused now.
func (s *faultyStore) refused(ref durable.Ref, method string) error {
	id := ref.OperationID()
	now := time.Now()
	s.mu.Lock()
	until, ok := s.windows[id][method]
	hit := ok && now.Before(until)
	if _, seen := s.first[id]; hit && !seen {
		s.first[id] = now
	}
	s.mu.Unlock()
	if !hit {
		return nil
	}
	s.e.fault(method + "-refused")
	return fmt.Errorf("%w: chaos: %s refused (injected outage)", durable.ErrUnavailable, method)
}

// finished notes the first finishing write of ref that succeeded after a
// refusal.
func (s *faultyStore) finished(ref durable.Ref, err error) {
	if err != nil {
		return
	}
	id := ref.OperationID()
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, refused := s.first[id]; refused {
		if _, ok := s.landed[id]; !ok {
			s.landed[id] = time.Now()
		}
	}
}

// pending reports whether ref's operation is between a first refusal
// more than after ago and its finishing write.
func (s *faultyStore) pending(ref durable.Ref, after time.Duration) bool {
	id := ref.OperationID()
	s.mu.Lock()
	defer s.mu.Unlock()
	first, refused := s.first[id]
	_, landed := s.landed[id]
	return refused && !landed && time.Since(first) > after
}

// hit reports whether a refusal of ref's operation fired.
func (s *faultyStore) hit(ref durable.Ref) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.first[ref.OperationID()]
	return ok
}

func (s *faultyStore) Renew(ctx context.Context, ref durable.Ref, tok fence.Token, lease time.Duration) error {
	if err := s.refused(ref, refuseRenew); err != nil {
		return err
	}
	return s.Store.Renew(ctx, ref, tok, lease)
}

func (s *faultyStore) Complete(ctx context.Context, tx pgxTx, ref durable.Ref, tok fence.Token, res durable.Result) error {
	if tx != nil { // inside a transaction: not refused
		return s.Store.Complete(ctx, tx, ref, tok, res)
	}
	if err := s.refused(ref, refuseComplete); err != nil {
		return err
	}
	err := s.Store.Complete(ctx, nil, ref, tok, res)
	s.finished(ref, err)
	return err
}

func (s *faultyStore) Fail(ctx context.Context, tx pgxTx, ref durable.Ref, tok fence.Token, res durable.Result) error {
	if tx != nil { // inside a transaction: not refused
		return s.Store.Fail(ctx, tx, ref, tok, res)
	}
	if err := s.refused(ref, refuseFail); err != nil {
		return err
	}
	err := s.Store.Fail(ctx, nil, ref, tok, res)
	s.finished(ref, err)
	return err
}

func (s *faultyStore) MarkUncertain(ctx context.Context, ref durable.Ref, tok fence.Token) error {
	if err := s.refused(ref, refuseUncertain); err != nil {
		return err
	}
	err := s.Store.MarkUncertain(ctx, ref, tok)
	s.finished(ref, err)
	return err
}

// expectFaults registers fault kinds at zero: a kind that never fires
// then fails the scenario.
func (e *env) expectFaults(kinds ...string) {
	for _, k := range kinds {
		e.faultN(k, 0)
	}
}

// eachOp runs f for every operation, Parallel at a time.
func (e *env) eachOp(ctx context.Context, ops []*op, f func(o *op)) error {
	sem := make(chan struct{}, e.cfg.Parallel)
	var wg sync.WaitGroup
	for _, o := range ops {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f(o)
		}()
	}
	wg.Wait()
	return ctx.Err()
}

// rawDownstream starts a downstream in Raw mode (no deduplication: every
// call the fence accepted applies an effect) whose effects go to the effects
// table, each with the hash of bodyOf.
func (e *env) rawDownstream(bodyOf func(o *op, epoch int, id string) []byte, plan func(o *op, n int) (fault.Behavior, time.Duration)) (*fault.Downstream, error) {
	return e.newDownstream(true, bodyOf, plan)
}

// oneCallEach counts the calls that reached the downstream, per key, with
// no deduplication: every call the fence accepted applied an effect, so a
// second call is a second execution.
func (e *env) oneCallEach(d *fault.Downstream, ops []*op) { e.oneCallEachWhy(d, ops, nil) }

// oneCallEachWhy is oneCallEach with why(o) appended to each violation's
// detail when set.
func (e *env) oneCallEachWhy(d *fault.Downstream, ops []*op, why func(o *op) string) {
	calls := d.Calls()
	total := 0
	for _, o := range ops {
		n := calls[o.id]
		total += n
		if n > 1 {
			epoch, _, _ := o.get()
			detail := ""
			if why != nil {
				detail = why(o)
			}
			e.violation(check.AtMostOneEffect, history.OpName(o.key, epoch), "%d calls reached the downstream (raw, not deduplicated)%s", n, detail)
		}
	}
	e.counter(e.obs, "downstream-calls").Add(int64(total))
}

// leaseOf reads o's record with plain SQL: its generation, state, and
// whether its lease is live by the database's clock.
func (e *env) leaseOf(ctx context.Context, o *op) (gen uint64, state string, live bool, err error) {
	var g int64
	err = e.admin.QueryRow(ctx, `SELECT generation, state::text, COALESCE(lease_expires_at > clock_timestamp(), false)
		FROM `+e.schema+`.`+storeTable+` WHERE tenant_id = $1 AND operation = $2 AND key_hash = $3`,
		e.tenant, e.name, o.ref.KeyHash[:]).Scan(&g, &state, &live)
	return uint64(g), state, live, err
}

// edge is the world of one HTTP edge scenario: the service in workflow
// mode with the edge handler, on a faultyStore, and a Raw downstream.
type edge struct {
	e  *env
	w  *workload
	s  *service
	st *faultyStore
	d  *fault.Downstream
	// floors are the server's leases, watched.
	floors *leaseFloors

	// afterEffect runs in the handler after the downstream applied the
	// effect, with the body the handler will answer; when it returns true
	// it answered itself (or never returns: a panic).
	afterEffect func(ctx context.Context, o *op, tok fence.Token, w http.ResponseWriter, sr *serverRec, body []byte) bool
	// bodyOf is the body an operation replays; by default its flowBody.
	bodyOf func(o *op, epoch int, id string) []byte
	// duringWork, when set, is the fault kind counted for every request
	// of an operation that reaches the server while a handler of the
	// operation is working after its effect.
	duringWork string
	// onArrive runs for every request that reaches the server.
	onArrive func(o *op)

	mu      sync.Mutex
	working workingSet
	gens    map[*op]uint64 // the first generation a handler ran under
	tries   map[*op]map[int]int
	cuts    map[*op]map[int]context.CancelCauseFunc
}

// errClientGone is the cause of a request a client abandoned.
var errClientGone = errors.New("chaos: the client disconnected")

// newEdge builds an edge world; mw are further options of its middleware.
func (e *env) newEdge(ctx context.Context, mw ...claimhttp.Option) (*edge, error) {
	var st *faultyStore
	w, base, err := e.standardOn(ctx, storeOpts{seam: func(s storeapi.Store[pgxTx]) storeapi.Store[pgxTx] {
		st = newFaultyStore(e, s)
		return st
	}}, e.userRedis, claimerOpts{})
	if err != nil {
		return nil, err
	}
	w.modeOf = flowAll
	// Duplicates wait for the first request, as in the other HTTP
	// scenarios.
	// The server's leases are watched, as the entry-point families': a
	// takeover of a live one is a violation, and a second effect is
	// explained by the takeovers of leases that had run out.
	floors := newLeaseFloors()
	server, err := e.claimer(claimerOpts{store: e.watchLeases(base, floors), redis: e.redisUser("", nil), policy: claim.WithWait(2 * e.cfg.Lease)})
	if err != nil {
		return nil, err
	}
	x := &edge{e: e, w: w, st: st, floors: floors, gens: map[*op]uint64{},
		tries: map[*op]map[int]int{}, cuts: map[*op]map[int]context.CancelCauseFunc{}}
	x.d, err = e.rawDownstream(func(o *op, epoch int, id string) []byte {
		if x.bodyOf != nil {
			return x.bodyOf(o, epoch, id)
		}
		return flowBody(o.key, epoch, id)
	}, nil)
	if err != nil {
		return nil, err
	}
	w.downstream = x.d
	x.s, err = e.newService(ctx, server, true, x.d, func(s *service) []claimhttp.Option {
		s.handler = http.HandlerFunc(x.handle)
		s.onRequest = x.arrived
		return mw
	})
	if err != nil {
		return nil, err
	}
	w.http = x.s
	w.after = func(context.Context, *env, []*op) error { return nil }
	return x, nil
}

// then adds f to what runs after the verification pass; the raw count of
// downstream calls always runs first.
func (x *edge) then(f func(ctx context.Context, ops []*op) error) {
	x.w.after = func(ctx context.Context, e *env, ops []*op) error {
		e.oneCallEachWhy(x.d, ops, func(o *op) string { return x.floors.explain(o.ref.KeyHash, e.cfg.Lease) })
		return f(ctx, ops)
	}
}

func (x *edge) arrived(o *op) {
	if x.working.busy(o) && x.duringWork != "" {
		x.e.fault(x.duringWork)
	}
	if x.onArrive != nil {
		x.onArrive(o)
	}
}

// try returns how many requests client c made for o before this one.
func (x *edge) try(o *op, c int) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.tries[o] == nil {
		x.tries[o] = map[int]int{}
	}
	n := x.tries[o][c]
	x.tries[o][c] = n + 1
	return n
}

// cutFirst makes the first request of every client of a planned operation
// cancellable by disconnect.
func (x *edge) cutFirst(kind string) {
	x.s.requestCtx = func(ctx context.Context, o *op, c int) (context.Context, context.CancelFunc) {
		if !o.planned(kind) || x.try(o, c) > 0 {
			return ctx, func() {}
		}
		cctx, cancel := context.WithCancelCause(ctx)
		x.mu.Lock()
		if x.cuts[o] == nil {
			x.cuts[o] = map[int]context.CancelCauseFunc{}
		}
		x.cuts[o][c] = cancel
		x.mu.Unlock()
		return cctx, func() {
			x.mu.Lock()
			delete(x.cuts[o], c)
			x.mu.Unlock()
			cancel(nil)
		}
	}
}

// disconnect cancels the requests of o registered by cutFirst that are
// still in flight, and returns how many.
func (x *edge) disconnect(o *op) int {
	x.mu.Lock()
	cuts := x.cuts[o]
	x.cuts[o] = nil
	x.mu.Unlock()
	for _, cancel := range cuts {
		cancel(errClientGone)
	}
	return len(cuts)
}

// timeoutFirst gives the first request of every client of a planned
// operation a timeout of d, counting kind when it fires.
func (x *edge) timeoutFirst(planned, kind string, d time.Duration) {
	x.s.requestCtx = func(ctx context.Context, o *op, c int) (context.Context, context.CancelFunc) {
		if !o.planned(planned) || x.try(o, c) > 0 {
			return ctx, func() {}
		}
		tctx, cancel := context.WithTimeout(ctx, d)
		stop := context.AfterFunc(tctx, func() {
			if errors.Is(tctx.Err(), context.DeadlineExceeded) {
				x.e.fault(kind)
			}
		})
		return tctx, func() { stop(); cancel() }
	}
}

// answer writes the handler's response and tells the outer wrapper.
func answer(w http.ResponseWriter, sr *serverRec, status int, body []byte) {
	sr.ran, sr.status, sr.body = true, status, body
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// handle is the edge scenarios' business handler: the effect at the
// downstream under the operation identity and the token, then the
// scenario's hook.
func (x *edge) handle(w http.ResponseWriter, r *http.Request) {
	s, e := x.s, x.e
	ctx := r.Context()
	o, sr, ok := s.request(w, r)
	if !ok {
		return
	}
	s.recordClaimed(o, sr)
	tok := sr.tok
	epoch, _, _ := o.get()
	x.mu.Lock()
	if _, ok := x.gens[o]; !ok {
		x.gens[o] = tok.Generation
	}
	x.mu.Unlock()
	// The workflow handler calls the downstream under its renewed lease:
	// give the call two leases, and at least 2s, so a loaded machine does
	// not turn a slow answer into an uncertain outcome these scenarios do
	// not plan (half a lease made http-finish-outage-long end uncertain
	// once in CI, 600ms http-finish-outage-short).
	dctx, cancel := context.WithTimeout(ctx, max(s.dTime, 2*e.cfg.Lease, 2*time.Second))
	id, err := fault.CallDownstream(dctx, e.httpc, x.d.URL(), claimhttp.OperationID(ctx), tok)
	cancel()
	var de *fault.DownstreamError
	switch {
	case errors.As(err, &de):
		// Refused before any effect: the application's word that nothing
		// happened.
		_ = claimhttp.ReleaseKey(ctx)
		answer(w, sr, http.StatusServiceUnavailable, []byte(`{"error":"downstream unavailable"}`))
		return
	case err != nil:
		_ = claimhttp.MarkUncertain(ctx)
		answer(w, sr, http.StatusAccepted, []byte(`{"uncertain":true}`))
		return
	}
	defer x.working.enter(o)()
	body := flowBody(o.key, epoch, id)
	if x.afterEffect != nil && x.afterEffect(ctx, o, tok, w, sr, body) {
		return
	}
	answer(w, sr, http.StatusOK, body)
}

// soloFirst runs the operations planned for kind with client 0 alone until
// it has its answer, then with every client; the others with every client
// at once.
func (x *edge) soloFirst(kind string) {
	x.w.run = func(ctx context.Context, e *env, ops []*op) error {
		return e.eachOp(ctx, ops, func(o *op) {
			if x.w.startOp != nil {
				x.w.startOp(ctx, o) // plans o (runOp plans it again, the same way)
			}
			if o.planned(kind) {
				e.client(ctx, x.w, o, 0, maxAttempts)
			}
			e.runOp(ctx, x.w, o, e.cfg.Clients)
		})
	}
}

// http-renewals-fail: the store refuses every renewal for a bit longer than
// the lease while the handler works after its effect; no one else asks
// meanwhile. The lease runs out unrenewed (KeepAlive ends the work's
// context, and renews again once the store accepts), yet no one took the
// key over, so the fenced completion succeeds and is published: the
// operation is completed under the generation it ran under, with one
// effect.
func setupHTTPRenewalsFail(ctx context.Context, e *env) (*workload, error) {
	x, err := e.newEdge(ctx)
	if err != nil {
		return nil, err
	}
	e.expectFaults("renew-refused", "lease-expired-unrenewed")
	x.w.startOp = func(_ context.Context, o *op) { e.planned(o, "renew-outage", 0.5, 0) }
	x.afterEffect = func(ctx context.Context, o *op, tok fence.Token, _ http.ResponseWriter, _ *serverRec, _ []byte) bool {
		if o.take("renew-outage") {
			e.workThroughRenewOutage(ctx, x.st, o, tok)
		}
		return false
	}
	x.soloFirst("renew-outage")
	x.then(func(ctx context.Context, ops []*op) error {
		for _, o := range ops {
			if !o.fired("renew-outage") {
				continue // its downstream call failed first (a loaded machine): nothing to check
			}
			gen, state, _, err := e.leaseOf(ctx, o)
			if err != nil {
				return err
			}
			x.mu.Lock()
			first := x.gens[o]
			x.mu.Unlock()
			if state != "completed" || gen != first {
				e.violation("completed-after-failed-renewals", o.key+"#1",
					"the record is %s under generation %d; the handler ran under %d and no one else asked", state, gen, first)
			}
		}
		return nil
	})
	return x.w, nil
}

// http-client-disconnect: every client of the operation disconnects right
// after the handler's effect while the work goes on for twice the lease;
// their retries reach the server while the first handler still works, and
// must wait and then replay its result instead of running it again.
func setupHTTPClientDisconnect(ctx context.Context, e *env) (*workload, error) {
	x, err := e.newEdge(ctx)
	if err != nil {
		return nil, err
	}
	lease := e.cfg.Lease
	e.expectFaults("client-disconnected", "retry-during-work", "lease-renewed-past-its-length")
	x.duringWork = "retry-during-work"
	x.w.startOp = func(_ context.Context, o *op) { e.planned(o, "disconnect", 0.5, 0) }
	x.cutFirst("disconnect")
	x.afterEffect = func(ctx context.Context, o *op, tok fence.Token, _ http.ResponseWriter, _ *serverRec, _ []byte) bool {
		if !o.take("disconnect") {
			return false
		}
		start := time.Now()
		e.faultN("client-disconnected", int64(x.disconnect(o)))
		// Work after the effect that does not look at its context: it
		// goes on whatever the client does, and the lease must last.
		time.Sleep(2 * lease)
		renewedPast(ctx, e, o, tok, start, lease)
		return false
	}
	x.then(func(context.Context, []*op) error { return nil })
	return x.w, nil
}

// renewedPast counts a lease still live under tok after the work outlived
// the lease's length: the middleware renewed it.
func renewedPast(ctx context.Context, e *env, o *op, tok fence.Token, start time.Time, lease time.Duration) {
	if time.Since(start) <= lease {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if gen, state, live, err := e.leaseOf(rctx, o); err == nil && gen == tok.Generation && state == "processing" && live {
		e.fault("lease-renewed-past-its-length")
	}
}

// http-client-timeout: window 5 through HTTP, with work longer than the
// lease: every client's first request times out while the handler works
// for two and a half leases after its effect; the middleware keeps the
// lease alive, the clients retry, nothing runs twice, and the retries
// replay the result once it is stored.
func setupHTTPClientTimeout(ctx context.Context, e *env) (*workload, error) {
	x, err := e.newEdge(ctx)
	if err != nil {
		return nil, err
	}
	lease := e.cfg.Lease
	e.expectFaults("client-timeout", "retry-during-work", "lease-renewed-past-its-length")
	x.duringWork = "retry-during-work"
	x.w.startOp = func(_ context.Context, o *op) { e.planned(o, "slow", 0.5, 0) }
	x.timeoutFirst("slow", "client-timeout", lease/2)
	x.afterEffect = func(ctx context.Context, o *op, tok fence.Token, _ http.ResponseWriter, _ *serverRec, _ []byte) bool {
		if !o.take("slow") {
			return false
		}
		start := time.Now()
		time.Sleep(lease * 5 / 2) // work that does not look at its context
		renewedPast(ctx, e, o, tok, start, lease)
		return false
	}
	x.then(func(context.Context, []*op) error { return nil })
	return x.w, nil
}

// reconciling runs a Reconciler over the scenario's records, recording
// what it adopts and completes, from the downstream's own account.
type reconciling struct {
	e         *env
	rc        *claim.Reconciler[pgxTx]
	passStart time.Duration // written and read by the goroutine running passes
	stop      chan struct{}
	done      chan struct{}
	once      sync.Once
	started   bool
}

func (e *env) newReconciling(c *claim.Claimer[pgxTx], d *fault.Downstream) (*reconciling, error) {
	return e.newReconcilingAs(c, func(*op) *fault.Downstream { return d }, nil, 2*e.cfg.Lease) // it adopts for the claimer's lease, e.cfg.Lease
}

// newReconcilingAs is newReconciling asking each operation's downstream
// (pick), storing encode(body) (nil: the HTTP shape, resultOf), and
// adopting processing records only once stale for stale.
func (e *env) newReconcilingAs(c *claim.Claimer[pgxTx], pick func(o *op) *fault.Downstream, encode func([]byte) durable.Result, stale time.Duration) (*reconciling, error) {
	return e.newReconcilingBy(c, func(passStart *time.Duration) func(context.Context, durable.Record) (claim.Resolution, error) {
		return e.resolveByDownstreamOf(pick, passStart, encode)
	}, stale)
}

// newReconcilingBy is a reconciling whose Reconciler resolves with
// resolve(passStart), passStart being when the current pass began, and
// adopts processing records only once stale for stale.
func (e *env) newReconcilingBy(c *claim.Claimer[pgxTx], resolve func(passStart *time.Duration) func(context.Context, durable.Record) (claim.Resolution, error), stale time.Duration) (*reconciling, error) {
	r := &reconciling{e: e, stop: make(chan struct{}), done: make(chan struct{})}
	rc, err := claim.NewReconciler(c, resolve(&r.passStart), claim.WithStaleAfter(stale))
	if err != nil {
		return nil, err
	}
	r.rc = rc
	return r, nil
}

// pass runs one reconciliation pass.
func (r *reconciling) pass(ctx context.Context) claim.Report {
	r.passStart = r.e.rec.Now()
	rep, _ := r.rc.RunOnce(ctx)
	r.e.counter(r.e.obs, "reconciler-completed").Add(int64(rep.Resolved))
	return rep
}

// loop runs passes in the background every half lease until halt.
func (r *reconciling) loop(ctx context.Context) {
	r.started = true
	go func() {
		defer close(r.done)
		for {
			r.pass(ctx)
			select {
			case <-r.stop:
				return
			case <-time.After(r.e.cfg.Lease / 2):
			}
		}
	}()
	r.e.onClose(r.halt)
}

func (r *reconciling) halt() {
	r.once.Do(func() { close(r.stop) })
	if r.started {
		<-r.done
	}
}

// http-panic-after-effect: the handler panics after its effect. The
// middleware marks the record uncertain and lets the panic go on (the
// connection drops); retries get 202 uncertain, never a second run, until
// the Reconciler resolves the operation from the downstream's account;
// then they replay.
func setupHTTPPanic(ctx context.Context, e *env) (*workload, error) {
	x, err := e.newEdge(ctx)
	if err != nil {
		return nil, err
	}
	e.expectFaults("handler-panic", "reconciled-after-panic")
	x.w.startOp = func(_ context.Context, o *op) { e.planned(o, "panic", 0.5, 0) }
	x.afterEffect = func(_ context.Context, o *op, _ fence.Token, _ http.ResponseWriter, _ *serverRec, _ []byte) bool {
		if o.take("panic") {
			e.fault("handler-panic")
			// net/http recovers it and closes the connection without
			// logging a stack; the middleware treats any panic alike.
			panic(http.ErrAbortHandler)
		}
		return false
	}
	rc, err := e.newReconciling(x.w.verifier, x.d)
	if err != nil {
		return nil, err
	}
	x.w.run = func(ctx context.Context, e *env, ops []*op) error {
		rc.loop(ctx)
		return e.runOps(ctx, x.w, ops)
	}
	// The reconciler keeps running through the verification pass.
	x.then(func(ctx context.Context, ops []*op) error {
		rc.halt()
		for _, o := range ops {
			if !o.planned("panic") {
				continue
			}
			if _, state, _, err := e.leaseOf(ctx, o); err != nil {
				return err
			} else if state == "completed" {
				e.fault("reconciled-after-panic")
			}
		}
		return nil
	})
	return x.w, nil
}

// http-oversized-response: the handler writes more than MaxResponseBody
// after its effect. The middleware stores the result by its status
// without the body (Idempotent-Body-Omitted), the first client gets
// exactly that, and every retry replays it; one effect.
func setupHTTPOversized(ctx context.Context, e *env) (*workload, error) {
	const stored, limit = 1 << 10, 4 << 10
	x, err := e.newEdge(ctx, claimhttp.WithMaxStoredBody(stored), claimhttp.WithMaxResponseBody(limit))
	if err != nil {
		return nil, err
	}
	e.expectFaults("response-over-limit")
	x.w.startOp = func(_ context.Context, o *op) { e.planned(o, "oversized", 0.5, 0) }
	x.bodyOf = func(o *op, epoch int, id string) []byte {
		if o.planned("oversized") {
			return []byte{} // what is stored, and replayed
		}
		return flowBody(o.key, epoch, id)
	}
	x.afterEffect = func(_ context.Context, o *op, _ fence.Token, w http.ResponseWriter, sr *serverRec, body []byte) bool {
		if !o.planned("oversized") {
			return false
		}
		// Stored by its status, without its body.
		sr.ran, sr.status, sr.body = true, http.StatusOK, []byte{}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		big := append(bytes.Clone(body), bytes.Repeat([]byte(" "), 2*limit)...)
		if _, err := w.Write(big); errors.Is(err, claimhttp.ErrResponseTooLarge) && o.take("oversized") {
			e.fault("response-over-limit")
		}
		return true
	}
	x.then(func(ctx context.Context, ops []*op) error {
		for _, o := range ops {
			if !o.fired("oversized") {
				continue // its downstream call failed first (a loaded machine): nothing to check
			}
			rec, err := x.st.Get(ctx, o.ref)
			if err != nil {
				return err
			}
			if rec.Result == nil || rec.Result.StatusCode != http.StatusOK || len(rec.Result.Body) != 0 ||
				rec.Result.Headers[claimclient.HeaderBodyOmitted] == nil {
				e.violation("oversized-stored-without-body", o.key+"#1", "the record is %s with result %+v", rec.State, rec.Result)
			}
		}
		return nil
	})
	return x.w, nil
}

// http-finish-outage-short: the store refuses Complete and Fail for a
// lease right as the handler returns, well within FinishTimeout (three
// leases, and at least 3s: under CI's load the retried completion once
// took longer than 900ms after a 300ms outage): the middleware retries the
// fenced completion while renewing the lease, and answers as usual.
func setupHTTPFinishShort(ctx context.Context, e *env) (*workload, error) {
	lease := e.cfg.Lease
	x, err := e.newEdge(ctx, claimhttp.WithFinishTimeout(max(3*lease, 3*time.Second)))
	if err != nil {
		return nil, err
	}
	e.expectFaults("complete-refused")
	x.w.startOp = func(_ context.Context, o *op) { e.planned(o, "finish-outage", 0.5, 0) }
	x.afterEffect = func(_ context.Context, o *op, _ fence.Token, _ http.ResponseWriter, _ *serverRec, _ []byte) bool {
		if o.take("finish-outage") {
			x.st.refuse(o.ref, lease, refuseComplete, refuseFail)
		}
		return false
	}
	x.then(func(context.Context, []*op) error {
		// Only the requests whose own handler ran: a duplicate that waited
		// behind one is answered 202 in progress, rightly.
		if n := e.observed()["http-202-pending"]; n > 0 {
			e.violation("answered-within-finish-timeout", "", "%d requests were answered 202 pending though every outage was shorter than FinishTimeout", n)
		}
		return nil
	})
	return x.w, nil
}

// http-finish-outage-long: the store refuses Complete and Fail for longer
// than FinishTimeout but shorter than the lease. The client gets 202 in
// progress; its retries find the operation in progress while the
// middleware, renewing the lease, goes on in the background; the
// completion lands, the retries replay it, one effect.
func setupHTTPFinishLong(ctx context.Context, e *env) (*workload, error) {
	lease := e.cfg.Lease
	finish := lease / 3
	x, err := e.newEdge(ctx, claimhttp.WithFinishTimeout(finish))
	if err != nil {
		return nil, err
	}
	e.expectFaults("complete-refused", "answered-202-pending", "request-while-pending")
	x.w.startOp = func(_ context.Context, o *op) { e.planned(o, "finish-outage", 0.5, 0) }
	x.afterEffect = func(_ context.Context, o *op, _ fence.Token, _ http.ResponseWriter, _ *serverRec, _ []byte) bool {
		if o.take("finish-outage") {
			x.st.refuse(o.ref, lease*5/6, refuseComplete, refuseFail)
		}
		return false
	}
	x.onArrive = func(o *op) {
		if x.st.pending(o.ref, finish) {
			e.fault("request-while-pending")
		}
	}
	x.then(func(ctx context.Context, ops []*op) error {
		e.faultN("answered-202-pending", e.observed()["http-202-pending"])
		for _, o := range ops {
			if _, state, _, err := e.leaseOf(ctx, o); err != nil {
				return err
			} else if state != "completed" {
				e.violation("completed-in-background", o.key+"#1", "the record is %s", state)
			}
		}
		return nil
	})
	return x.w, nil
}

// reconcile-after-retention: every operation's downstream call applies its
// effect and never answers, so the worker marks it uncertain. The record
// stays uncertain past its retention; the clients' retries then still get
// uncertain, not a new execution. The Reconciler resolves it after its
// retention: the finish gives the record a full retention from then, so
// every retry afterwards replays, nothing runs again.
func setupReconcileAfterRetention(ctx context.Context, e *env) (*workload, error) {
	// The retention (a record's, set when it is claimed) must outlast
	// what follows the Reconciler's finish: every client's replay, then
	// the verification pass. Those grow with the operations, so it does
	// too (six leases at 20 operations; about 42 s at 1000). A completed
	// record past its retention rightly starts a new operation, which
	// the checker would count as a second effect.
	retention := 6*e.cfg.Lease + time.Duration(e.cfg.Iterations)*40*time.Millisecond
	w, err := e.rawFlows(ctx, claimerOpts{retention: retention}, func(_ *op, n int) (fault.Behavior, time.Duration) {
		if n == 0 {
			return fault.TimeoutAfter, 0
		}
		return fault.Succeed, 0
	})
	if err != nil {
		return nil, err
	}
	w.downstreamTimeout = e.cfg.Lease / 2
	d := w.downstream
	rc, err := e.newReconciling(w.verifier, d)
	if err != nil {
		return nil, err
	}
	e.expectFaults("downstream-timeout-after-work", "uncertain-past-retention", "retried-past-retention", "reconciled-after-retention")
	w.run = func(ctx context.Context, e *env, ops []*op) error {
		// Each operation: client 0 runs it into the timeout (marked
		// uncertain), then every other client asks once.
		err := e.eachOp(ctx, ops, func(o *op) {
			for c := 0; c < e.cfg.Clients; c++ {
				e.attempt(ctx, w, o, c, 0)
			}
		})
		if err != nil {
			return err
		}
		e.faultN("downstream-timeout-after-work", int64(d.Stats().Timeouts))
		// Wait until every uncertain record is past its retention.
		rs := e.records()
		wait := time.Now().Add(retention + 10*time.Second)
		var recs []history.Record
		for {
			if recs, err = rs.Read(ctx, e.admin); err != nil {
				return err
			}
			waiting := 0
			for _, r := range recs {
				if r.State == "uncertain" && !r.Expired {
					waiting++
				}
			}
			if waiting == 0 || time.Now().After(wait) {
				break
			}
			sleep(ctx, e.cfg.Lease/2)
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
		for _, r := range recs {
			if r.State == "uncertain" && r.Expired {
				e.fault("uncertain-past-retention")
			}
		}
		// Past retention, an uncertain record is still not a new
		// operation: every client asks again and must get uncertain.
		err = e.eachOp(ctx, ops, func(o *op) {
			for c := 0; c < e.cfg.Clients; c++ {
				e.fault("retried-past-retention")
				e.attempt(ctx, w, o, c, 1)
			}
		})
		if err != nil {
			return err
		}
		// The Reconciler resolves them now, after their retention, a
		// batch a pass, until a pass finds nothing.
		for pass := 0; pass < len(ops)+10; pass++ {
			rep := rc.pass(ctx)
			e.faultN("reconciled-after-retention", int64(rep.Resolved))
			if rep.Scanned == 0 {
				break
			}
		}
		// The finish gave each a full retention from then.
		if recs, err = rs.Read(ctx, e.admin); err != nil {
			return err
		}
		for _, r := range recs {
			if r.State != "completed" || r.Expired {
				e.violation("retention-from-finish", r.Key+"#1", "after the reconciler's finish the record is %s, expired %v", r.State, r.Expired)
			}
		}
		// Every client again: each must replay, nothing runs again.
		return e.runOps(ctx, w, ops)
	}
	w.after = func(_ context.Context, e *env, ops []*op) error {
		e.oneCallEach(d, ops)
		return nil
	}
	return w, nil
}
