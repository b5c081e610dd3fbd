package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
)

// scenario is one named scenario: setup builds its world and returns the
// workload to run in it.
type scenario struct {
	name     string
	forces   string
	ownRedis bool
	// ownPostgres: it starts PostgreSQL clusters of its own (initdb, pg_ctl).
	ownPostgres bool
	// onServers: its own servers come from Config.Servers when set (see
	// env.ownRedis, env.ownPostgres), and it needs no binaries then.
	onServers bool
	// needs, when set, says what the scenario needs installed besides
	// PostgreSQL's binaries (patroni and etcd, pgbouncer): an error skips
	// it (and fails it under CI=true, see TestScenarios).
	needs func() error
	// repeats, for a scenario that cycles an infrastructure fault for the
	// whole run (issue 48), is its main fault: it must fire
	// RepeatedFaultsRequired times at the run's size.
	repeats string
	setup   func(ctx context.Context, e *env) (*workload, error)
}

// mode is how an operation runs.
type mode int

const (
	// doMode: Claimer.Do, the effect written in the claim's transaction.
	doMode mode = iota
	// flowMode: Claim, a call to the downstream (which writes the effect),
	// then a fenced Complete.
	flowMode
)

// workload is what the clients of a scenario do, with the scenario's
// hooks where it injects its faults. Every hook is optional.
type workload struct {
	// claimers: client c uses claimers[c % len(claimers)].
	claimers []*claim.Claimer[pgxTx]
	// verifier runs the verification pass after the faults healed.
	verifier   *claim.Claimer[pgxTx]
	downstream *fault.Downstream
	// http, when set, runs every client through this HTTP service (the
	// verification pass too, with the same fingerprints).
	http *service
	// entry, when set, runs every client through an entry point of the
	// library (scenarios_entry.go), the verification pass too.
	entry entryPoint

	modeOf     func(o *op) mode // default doMode
	rejectRate float64          // share of Do operations that are business rejections
	// bodyPad, when set, is how many bytes of padding an operation's Do
	// result body carries (its effect's result too): 0 for none.
	bodyPad func(o *op) int

	// startOp runs when an operation starts, before its clients.
	startOp func(ctx context.Context, o *op)
	// inTx runs inside Do's function before the effect; an error rolls
	// the transaction back (set a.rolledBack when that is certain).
	inTx func(ctx context.Context, a *attempt) error
	// afterEffect runs inside Do's function after the effect was written.
	afterEffect func(ctx context.Context, a *attempt) error
	// afterClaim runs in workflow mode after the claim, before the
	// downstream call.
	afterClaim func(ctx context.Context, a *attempt)
	// beforeComplete runs in workflow mode after the downstream call,
	// before Complete.
	beforeComplete func(ctx context.Context, a *attempt)
	// afterComplete runs in workflow mode once Complete succeeded and was
	// recorded, before the attempt returns.
	afterComplete func(ctx context.Context, a *attempt)
	// fingerprint overrides the fingerprint a client sends.
	fingerprint func(o *op, client int) string
	// dropAck loses a client's first answer of an executed operation.
	dropAck func(o *op, client int) bool
	// clientTimeout, when it returns more than zero, is how long the
	// client waits for an attempt that the server then finishes anyway.
	clientTimeout func(o *op, client, attempt int) time.Duration
	// noKeepAlive runs workflow attempts without KeepAlive.
	noKeepAlive bool
	// requestLease, when set and positive for o, is the lease of o's
	// workflow claims (claim.Request.Lease) instead of the Claimer's.
	requestLease func(o *op) time.Duration

	// timeout bounds one attempt; downstreamTimeout one downstream call.
	timeout, downstreamTimeout time.Duration

	// run replaces the default runner (all operations, all clients).
	run func(ctx context.Context, e *env, ops []*op) error
	// after runs once the verification pass is done and sampling stopped.
	after func(ctx context.Context, e *env, ops []*op) error
}

// op is one logical operation (one idempotency key).
type op struct {
	i     int
	key   string // the suite's name: "<scenario>/<i>"
	scope durable.Scope
	ref   durable.Ref
	id    string // the library's operation identity

	mu       sync.Mutex
	epoch    int
	fp       string
	reject   bool
	noVerify bool
	flags    map[string]bool // planned faults for this operation
	taken    map[string]bool // planned faults that fired
	ints     map[string]int  // planned numbers
}

// setInt plans a number for o.
func (o *op) setInt(k string, v int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ints[k] = v
}

// getInt returns a planned number.
func (o *op) getInt(k string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ints[k]
}

// next moves o to a new epoch (a retry after the retention window) with
// fingerprint fp.
func (o *op) next(fp string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.epoch++
	o.fp = fp
}

func (o *op) skipVerify() {
	o.mu.Lock()
	o.noVerify = true
	o.mu.Unlock()
}

func (o *op) get() (epoch int, fp string, reject bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.epoch, o.fp, o.reject
}

// plan marks fault kind as planned for o.
func (o *op) plan(kind string, yes bool) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if yes {
		o.flags[kind] = true
	}
	return yes
}

// planned reports whether fault kind was planned for o.
func (o *op) planned(kind string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.flags[kind]
}

// take reports, once, that a planned fault of kind should fire now.
func (o *op) take(kind string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.flags[kind] || o.taken[kind] {
		return false
	}
	o.taken[kind] = true
	return true
}

// fired reports whether take(kind) reported true.
func (o *op) fired(kind string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.taken[kind]
}

// stopKeepAlive stops renewing the lease, as a worker about to be paused
// (the whole process stops, renewals included).
func (a *attempt) stopKeepAlive() {
	if a.stop != nil {
		_ = a.stop()
	}
	a.paused = true
}

// attempt is one client attempt in progress, handed to the hooks.
type attempt struct {
	e      *env
	o      *op
	client int
	n      int
	epoch  int
	tok    fence.Token
	tx     pgxTx
	lease  *claim.Lease
	stop   func() error // stops KeepAlive (workflow)
	// paused: KeepAlive was stopped by a hook (a worker about to pause):
	// the rest of the attempt runs on the attempt's own context.
	paused bool
	// rolledBack: the attempt knows its transaction cannot commit.
	rolledBack bool
	note       string
}

func (e *env) newOps(n int, w *workload) []*op {
	ops := make([]*op, n)
	for i := range ops {
		o := &op{i: i, key: fmt.Sprintf("%s/%d", e.name, i), epoch: 1, flags: map[string]bool{}, taken: map[string]bool{}, ints: map[string]int{}}
		o.scope = durable.Scope{Tenant: e.tenant, Operation: e.name, Key: fmt.Sprintf("k-%s-%d", e.id, i)}
		o.ref = o.scope.Ref(nil)
		o.id = o.ref.OperationID()
		o.fp = fingerprintOf(o.key, 1, "a")
		if w.rejectRate > 0 && (w.modeOf == nil || w.modeOf(o) == doMode) {
			o.reject = e.sched.chance(w.rejectRate, "reject", i)
		}
		e.keyspace[o.ref.KeyHash] = o.key
		e.ops[o.id] = o
		e.byKey[o.scope.Key] = o
		ops[i] = o
	}
	return ops
}

func fingerprintOf(key string, epoch int, variant string) string {
	return "v1:" + history.Hash(fmt.Appendf(nil, "%s|%d|%s", key, epoch, variant))
}

func (w *workload) mode(o *op) mode {
	if w.modeOf == nil {
		return doMode
	}
	return w.modeOf(o)
}

func (w *workload) claimer(client int) *claim.Claimer[pgxTx] {
	return w.claimers[client%len(w.claimers)]
}

// Attempt and client limits.
const (
	maxAttempts       = 40
	verifyAttempts    = 14
	maxCompleteTrials = 3
)

func (e *env) runAll(ctx context.Context, w *workload, ops []*op) error {
	if w.run != nil {
		return w.run(ctx, e, ops)
	}
	return e.runOps(ctx, w, ops)
}

// runOps runs ops, Parallel at a time, each with every client at once.
func (e *env) runOps(ctx context.Context, w *workload, ops []*op) error {
	return e.eachOp(ctx, ops, func(o *op) { e.runOp(ctx, w, o, e.cfg.Clients) })
}

// runOp starts every client of o at the same moment and waits for them.
func (e *env) runOp(ctx context.Context, w *workload, o *op, clients int) {
	if w.startOp != nil {
		w.startOp(ctx, o)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			e.client(ctx, w, o, c, maxAttempts)
		}()
	}
	close(start)
	wg.Wait()
}

// client retries o until it gets a final answer (a result or a mismatch),
// with capped exponential backoff and full jitter, within a budget.
func (e *env) client(ctx context.Context, w *workload, o *op, c, attempts int) bool {
	epoch, _, _ := o.get()
	rnd := e.sched.rnd("jitter", o.i, epoch, c)
	deadline := time.Now().Add(30*e.cfg.Lease + 3*time.Second)
	for n := 0; n < attempts && ctx.Err() == nil && time.Now().Before(deadline); n++ {
		if e.attempt(ctx, w, o, c, n) {
			return true
		}
		sleep(ctx, e.backoff(n, rnd))
	}
	e.observe("client-gave-up")
	return false
}

// backoff is capped exponential backoff with full jitter: uniform in
// [0, min(lease, lease/10 * 2^n)].
func (e *env) backoff(n int, rnd *rand.Rand) time.Duration {
	base := max(e.cfg.Lease/10, time.Millisecond)
	ceil := base << min(n, 10)
	if ceil > e.cfg.Lease || ceil <= 0 {
		ceil = e.cfg.Lease
	}
	return time.Duration(rnd.Int64N(int64(ceil) + 1))
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// attempt makes one attempt of client c and reports whether it got a final
// answer.
func (e *env) attempt(ctx context.Context, w *workload, o *op, c, n int) bool {
	if w.http != nil {
		return w.http.attempt(ctx, w, o, c)
	}
	if w.entry != nil {
		return w.entry.attempt(ctx, w, o, c)
	}
	if w.mode(o) == flowMode {
		return e.flowAttempt(ctx, w, o, c, n)
	}
	if w.clientTimeout != nil {
		if d := w.clientTimeout(o, c, n); d > 0 {
			return e.detachedDo(ctx, w, o, c, n, d)
		}
	}
	return e.doAttempt(ctx, w, o, c, n)
}

// detachedDo runs the attempt on the server side to its end while the
// client waits only d: a request that outlives its client's timeout.
func (e *env) detachedDo(ctx context.Context, w *workload, o *op, c, n int, d time.Duration) bool {
	done := make(chan bool, 1)
	e.bgs.Add(1) // waited for before the verification pass
	go func() {
		defer e.bgs.Done()
		done <- e.doAttempt(context.WithoutCancel(ctx), w, o, c, n)
	}()
	start := e.rec.Now()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case final := <-done:
		return final
	case <-t.C:
		e.fault("client-timeout")
		epoch, fp, _ := o.get()
		e.rec.Add(history.Call{Key: o.key, Epoch: epoch, Client: c, Kind: history.NoEffect, Fingerprint: fp,
			Start: start, End: e.rec.Now(), Note: "client timed out; the server goes on"})
		return false
	}
}

var errInjected = errors.New("chaos: injected transient failure")

func resultOf(status int, body []byte) durable.Result {
	return durable.Result{StatusCode: status, Headers: map[string][]string{"Content-Type": {"application/json"}}, Body: body, Version: 1}
}

func doBody(key string, epoch int, tok fence.Token, rejected bool) []byte {
	return fmt.Appendf(nil, `{"key":%q,"epoch":%d,"generation":%d,"owner":%q,"rejected":%v}`, key, epoch, tok.Generation, tok.Owner, rejected)
}

func flowBody(key string, epoch int, effect string) []byte {
	return fmt.Appendf(nil, `{"key":%q,"epoch":%d,"effect":%q}`, key, epoch, effect)
}

// pad returns body, a JSON object, with w.bodyPad(o) bytes of padding in a
// "pad" member; body itself when there is none.
func (w *workload) pad(o *op, body []byte) []byte {
	n := 0
	if w.bodyPad != nil {
		n = w.bodyPad(o)
	}
	if n <= 0 || len(body) == 0 || body[len(body)-1] != '}' {
		return body
	}
	out := make([]byte, 0, len(body)+n+10)
	out = append(out, body[:len(body)-1]...)
	out = append(out, `,"pad":"`...)
	for range n {
		out = append(out, 'x')
	}
	return append(out, `"}`...)
}

// doAttempt is one Claimer.Do.
func (e *env) doAttempt(ctx context.Context, w *workload, o *op, c, n int) bool {
	epoch, fp, reject := o.get()
	if w.fingerprint != nil {
		fp = w.fingerprint(o, c)
	}
	actx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	a := &attempt{e: e, o: o, client: c, n: n, epoch: epoch}
	var (
		ran     bool
		ranBody string
		ranCode int
		out     claim.Outcome
		err     error
	)
	cl := w.claimer(c)
	locked := e.locked(cl)
	var runs []history.Run // fn's runs in this call, recorded with it
	call := history.Call{Key: o.key, Epoch: epoch, Client: c, Fingerprint: fp, Start: e.rec.Now()}
	func() {
		defer func() {
			if v := recover(); v != nil {
				if v != errCrash {
					panic(v)
				}
				err = errCrash
			}
		}()
		out, err = cl.Do(actx, claim.Request{Scope: o.scope, Fingerprint: fp}, func(ctx context.Context, tx pgxTx, op claim.Op) (durable.Result, error) {
			// The run as the process sees it, for the checker's
			// one-fn-run-at-a-time: its start once the transaction holds
			// what it takes before fn, its end before the COMMIT (on a
			// panic too), whether it returned a result, and the effect it
			// wrote.
			run := history.Run{Key: o.key, Epoch: epoch, Client: c, Locked: locked, Start: e.rec.Now()}
			defer func() {
				run.End = e.rec.Now()
				runs = append(runs, run)
			}()
			a.tok, a.tx = op.Token, tx
			if w.inTx != nil {
				if err := w.inTx(ctx, a); err != nil {
					return durable.Result{}, err
				}
			}
			if reject {
				body := w.pad(o, doBody(o.key, epoch, op.Token, true))
				ran, ranBody, ranCode = true, history.Hash(body), 402
				run.Returned = true
				return durable.Result{}, claim.Reject(resultOf(402, body))
			}
			body := w.pad(o, doBody(o.key, epoch, op.Token, false))
			id, err := e.tables.InsertEffect(ctx, tx, e.name, history.Effect{Key: o.key, Epoch: epoch, Owner: op.Token.Owner,
				Generation: op.Token.Generation, Body: history.Hash(body), Via: "do"})
			if err != nil {
				return durable.Result{}, err
			}
			run.Effect = id
			ran, ranBody, ranCode = true, history.Hash(body), 201
			if w.afterEffect != nil {
				if err := w.afterEffect(ctx, a); err != nil {
					return durable.Result{}, err
				}
			}
			run.Returned = true
			return resultOf(201, body), nil
		})
	}()
	call.End = e.rec.Now()
	final := false
	switch {
	case err == nil && out.Kind == claim.Executed:
		call.Kind, call.Token, call.Body, call.Status = history.Execute, a.tok, history.Hash(out.Result.Body), out.Result.StatusCode
		final = true
		if w.dropAck != nil && w.dropAck(o, c) {
			e.fault("response-dropped")
			call.Note = "response dropped before the client"
			final = false
		}
	case err == nil && out.Kind == claim.Replayed:
		call.Kind, call.Body, call.Status = history.Replay, history.Hash(out.Result.Body), out.Result.StatusCode
		final = true
		e.observe("replayed")
		e.observeCached(actx, out, &call)
	case err == nil:
		call.Kind, call.Note, call.Answer = history.NoEffect, out.Kind.String(), answerOf(out.Kind)
		e.observe(out.Kind.String())
	case errors.Is(err, claim.ErrMismatch):
		call.Kind, call.Note = history.Mismatch, "mismatch"
		final = true
		e.observe("mismatch")
	case ran && !a.rolledBack && errors.Is(err, durable.ErrUnavailable):
		// The function ran; whether its transaction committed is unknown.
		call.Kind, call.Ambiguous, call.Token, call.Body, call.Status = history.Execute, true, a.tok, ranBody, ranCode
		call.Note = err.Error()
		e.observe("ambiguous")
	case ran && !errors.Is(err, errCrash):
		// Any other error after the function ran is the library's word
		// that nothing committed (the function's own error, a fenced
		// write, a COMMIT the database refused): only ErrUnavailable
		// leaves the outcome open. Taken at its word, so a library (or
		// store) that calls a lost acknowledgement a failure is caught.
		call.Kind, call.Note = history.NoEffect, "not committed, says the library: "+err.Error()
		e.observe("not-committed")
	case errors.Is(err, claim.ErrLeaseExpired):
		// The claim round trip used up the start margin: fn did not run.
		call.Kind, call.Note = history.NoEffect, err.Error()
		e.observe("lease-expired-before-start")
	default:
		call.Kind, call.Note = history.NoEffect, err.Error()
		e.observe("error")
	}
	if a.note != "" {
		call.Note = a.note + "; " + call.Note
	}
	id := e.rec.Add(call)
	for _, r := range runs {
		r.Call = id
		e.rec.AddRun(r)
	}
	return final
}

// flowAttempt is one Claim, downstream call and Complete.
func (e *env) flowAttempt(ctx context.Context, w *workload, o *op, c, n int) bool {
	epoch, fp, _ := o.get()
	if w.fingerprint != nil {
		fp = w.fingerprint(o, c)
	}
	actx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	call := history.Call{Key: o.key, Epoch: epoch, Client: c, Fingerprint: fp, Start: e.rec.Now()}
	r := claim.Request{Scope: o.scope, Fingerprint: fp}
	if w.requestLease != nil {
		r.Lease = w.requestLease(o)
	}
	out, err := w.claimer(c).Claim(actx, r)
	call.End = e.rec.Now()
	switch {
	case err == nil && out.Kind == claim.Acquired:
		call.Kind, call.Token = history.Acquire, out.Lease.Token()
	case err == nil && out.Kind == claim.Replayed:
		call.Kind, call.Body, call.Status = history.Replay, history.Hash(out.Result.Body), out.Result.StatusCode
		e.observeCached(actx, out, &call)
		e.rec.Add(call)
		e.observe("replayed")
		return true
	case err == nil:
		call.Kind, call.Note, call.Answer = history.NoEffect, out.Kind.String(), answerOf(out.Kind)
		e.rec.Add(call)
		e.observe(out.Kind.String())
		return false
	case errors.Is(err, claim.ErrMismatch):
		call.Kind, call.Note = history.Mismatch, "mismatch"
		e.rec.Add(call)
		e.observe("mismatch")
		return true
	case errors.Is(err, claim.ErrLeaseExpired):
		// The claim round trip used up the start margin: the key was
		// released, nothing ran.
		call.Kind, call.Note = history.NoEffect, err.Error()
		e.rec.Add(call)
		e.observe("lease-expired-before-start")
		return false
	default:
		// The claim may have been granted to this caller without its
		// learning the token.
		call.Kind, call.Ambiguous, call.Note = history.Acquire, true, err.Error()
		e.rec.Add(call)
		e.observe("error")
		return false
	}
	e.rec.Add(call)
	l := out.Lease
	a := &attempt{e: e, o: o, client: c, n: n, epoch: epoch, tok: l.Token(), lease: l}
	work := actx
	a.stop = func() error { return nil }
	if !w.noKeepAlive {
		var stop func() error
		work, stop = l.KeepAlive(actx)
		var once sync.Once
		var reason error
		a.stop = func() error { once.Do(func() { reason = stop() }); return reason }
	}
	defer a.stop()
	if w.afterClaim != nil {
		w.afterClaim(work, a)
	}
	if a.paused {
		work = actx
	}
	dctx, dcancel := context.WithTimeout(work, w.downstreamTimeout)
	id, derr := fault.CallDownstream(dctx, e.httpc, w.downstream.URL(), l.OperationID(), l.Token())
	dcancel()
	if derr != nil {
		_ = a.stop()
		bctx := context.WithoutCancel(actx)
		var de *fault.DownstreamError
		switch {
		case errors.As(derr, &de) && de.Status == 409:
			e.observe("downstream-stale")
			e.recordNote(o, epoch, c, fp, "the downstream fenced a stale token")
		case errors.As(derr, &de) && de.Status == http.StatusServiceUnavailable:
			// Refused before any effect: give the key back.
			rerr := l.Release(bctx)
			e.recordNote(o, epoch, c, fp, fmt.Sprintf("downstream %d; released (%v)", de.Status, rerr))
			e.observe("released")
		default:
			// No answer, or a failure of the downstream's own write (500:
			// its store failed, perhaps after committing, as when it lives
			// on the PostgreSQL that pg-crash kills): the effect may have
			// happened. Never guess.
			uerr := l.MarkUncertain(bctx)
			e.recordNote(o, epoch, c, fp, fmt.Sprintf("downstream failed or timed out (%v); marked uncertain (%v)", derr, uerr))
			if uerr == nil {
				e.observe("marked-uncertain")
			}
		}
		return false
	}
	body := flowBody(o.key, epoch, id)
	if w.beforeComplete != nil {
		w.beforeComplete(work, a)
	}
	_ = a.stop()
	cctx := context.WithoutCancel(actx)
	for trial := 0; trial < maxCompleteTrials; trial++ {
		cc := history.Call{Key: o.key, Epoch: epoch, Client: c, Fingerprint: fp, Token: l.Token(), Body: history.Hash(body), Status: 200, Start: e.rec.Now()}
		tctx, tcancel := context.WithTimeout(cctx, w.timeout)
		err := l.Complete(tctx, resultOf(200, body))
		tcancel()
		cc.End = e.rec.Now()
		switch {
		case err == nil:
			cc.Kind = history.Complete
			e.rec.Add(cc)
			if w.afterComplete != nil {
				w.afterComplete(cctx, a)
			}
			return true
		case errors.Is(err, claim.ErrFenced):
			cc.Kind, cc.Note = history.Fenced, err.Error()
			e.rec.Add(cc)
			e.observe("fenced-completion")
			return false
		default:
			cc.Kind, cc.Ambiguous, cc.Note = history.Complete, true, err.Error()
			e.rec.Add(cc)
			e.observe("ambiguous")
		}
	}
	return false
}

// answerOf is what a claim answered k told its caller about the
// operation, for the history: in progress or uncertain, or nothing.
func answerOf(k claim.Kind) history.Answer {
	switch k {
	case claim.InProgress:
		return history.InProgress
	case claim.Uncertain:
		return history.Uncertain
	}
	return ""
}

func (e *env) recordNote(o *op, epoch, c int, fp, note string) {
	now := e.rec.Now()
	e.rec.Add(history.Call{Key: o.key, Epoch: epoch, Client: c, Kind: history.NoEffect, Fingerprint: fp, Start: now, End: now, Note: note})
}

// verify retries every operation once more through a clean Claimer, after
// the faults healed: an acknowledged result must replay, byte for byte.
func (e *env) verify(ctx context.Context, w *workload, ops []*op) {
	clean := &workload{claimers: []*claim.Claimer[pgxTx]{w.verifier}, downstream: w.downstream, modeOf: w.modeOf,
		bodyPad: w.bodyPad, timeout: w.timeout, downstreamTimeout: w.downstreamTimeout, http: w.http, entry: w.entry}
	sem := make(chan struct{}, e.cfg.Parallel)
	var wg sync.WaitGroup
	var verified atomic.Int64
	for _, o := range ops {
		o.mu.Lock()
		skip := o.noVerify
		o.mu.Unlock()
		if skip {
			continue
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if e.client(ctx, clean, o, e.cfg.Clients, verifyAttempts) {
				verified.Add(1)
			}
		}()
	}
	wg.Wait()
	e.counter(e.obs, "verified").Add(verified.Load())
}
