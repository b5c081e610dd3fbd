package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/oncekey/oncekey/chaos/internal/broken"
	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// The entry-point families force the windows of started work (the rule
// after start, docs/DESIGN.md 6.3) through the library's other entry
// points: gRPC (claimgrpc), the message consumers (claimnats, claimamqp)
// and River (claimriver). Every family runs the same business work
// (entry.work): the effect at a downstream under the operation identity
// and the token, then the window drawn for the operation. The windows are
// those of the entry points' conformance suite: the store refusing the
// finishing write for less than the lease and for longer, renewals
// refused, a panic after the effect, the caller gone, a duplicate during
// the work, work past the transport's own timer, and an uncertain outcome
// resolved, then replayed in the adapter's format.
//
// What the worker did comes from the store (recStore: grants and finishing
// writes, as the Claimer's callers see them), what a client got from the
// transport; effects from the downstreams. The raw one applies every call
// its fence accepts, so a second execution is a second effect; only the
// store outage longer than the lease calls a deduplicating one, since the
// design lets a takeover after such an outage run the work again, and only
// the downstream's deduplication on the operation identity absorbs it.

// entryRegistry lists the entry-point families.
func entryRegistry() []scenario {
	const windows = "store refusing the finish for less than the lease and for longer, renewals refused, a panic after the effect, the caller gone, a duplicate during the work, work past the transport's timer, an uncertain outcome resolved then replayed"
	return []scenario{
		{name: "grpc-windows", forces: "through claimgrpc, per operation one window: " + windows + " (the call's deadline)", setup: setupGRPCWindows},
		{name: "nats-windows", forces: "through claimnats on a JetStream consumer, per message one window: " + windows + " (AckWait)", setup: setupNATSWindows},
		{name: "river-windows", forces: "through claimriver on River workers, per job one window: " + windows + " (the job's timeout; the caller gone is the worker's StopAndCancel)", setup: setupRiverWindows},
		{name: "amqp-windows", forces: "through claimamqp on a RabbitMQ queue, per message one window: " + windows + " (the consumers' channels closed, the delivery requeued)", setup: setupAMQPWindows},
		{name: "kafka-windows", forces: "through claimkafka on a consumer group of an in-process Kafka (kfake), per record one window: " + windows + " (the members' clients closed: a rebalance during the work), and one offset commit in three lost", setup: setupKafkaWindows},
	}
}

// window is one of the windows an entry-point family forces.
type window string

const (
	winFinishShort window = "finish-outage-short"
	winFinishLong  window = "finish-outage-long"
	winRenewFail   window = "renewals-fail"
	winPanic       window = "panic-after-effect"
	winCallerGone  window = "caller-gone"
	winDuplicate   window = "duplicate-during-work"
	winTimer       window = "work-past-timer"
	winResolve     window = "resolve-then-replay"
)

// allWindows lists every window, in the order the first operations get
// them.
var allWindows = []window{winFinishShort, winFinishLong, winRenewFail, winPanic, winCallerGone, winDuplicate, winTimer, winResolve}

// revealing lists, for a broken settlement whose negative control should
// force one window only, that window: every operation then gets it, so a
// loaded machine on which some miss its timing (a downstream call too slow
// to reach the window) leaves the others to catch the broken mode. One
// attempt at the finish is revealed by the short finish outage alone; in
// the full rotation 24 operations gave it three chances, and under CI's
// load it once passed unnoticed.
var revealing = map[broken.Mode][]window{
	broken.OneAttempt: {winFinishShort},
}

// entryPoint makes one attempt of a client through an entry point.
type entryPoint interface {
	attempt(ctx context.Context, w *workload, o *op, c int) bool
}

// errEffectUnknown is the work's error when the downstream's answer was
// lost: its effect may have happened.
var errEffectUnknown = errors.New("chaos: the downstream's answer was lost; the effect may have happened")

// errChaosPanic is what the work panics with in the panic window.
var errChaosPanic = errors.New("chaos: the handler panics after its effect")

// entry is the world of one entry-point family.
type entry struct {
	e  *env
	w  *workload
	st *faultyStore
	rs *recStore
	// server is the adapter's Claimer, over rs.
	server *claim.Claimer[pgxTx]
	// raw applies every call (counted); dedup deduplicates by operation
	// identity (the long outage's window).
	raw, dedup *fault.Downstream
	rc         *reconciling
	wins       []window

	// encode is the result the adapter stores (and replays) for the
	// work's body.
	encode func(body []byte) durable.Result

	// Set by the family:
	//
	// callerGone ends the caller's side of o's request in progress (a
	// client that disconnects, a subscription that stops) and returns
	// how many it ended; by default it cancels what the family registered
	// in calls for the caller-gone window.
	callerGone func(o *op) int
	// duplicate sends a duplicate of o (same key, same payload) now.
	duplicate func(ctx context.Context, o *op)
	// timer is how long the work-past-timer window works: longer than
	// the transport's own timer, which the family counts as timerFault.
	timer      time.Duration
	timerFault string
	// timerStart, when set, runs as the timer window's work starts.
	timerStart func(o *op)
	// timerPast, when set, is the transport's timer the work outlives:
	// timerFault is counted when the work went on that long (the family
	// has no other sign of the timer, which the adapter keeps from firing).
	timerPast time.Duration

	// quiet is held shared by the producer of a solo window's operation
	// for its whole attempt, and exclusively by a fault that hands every
	// delivery in flight out again (the AMQP timer window), which would
	// otherwise be a second caller during the solo window.
	quiet sync.RWMutex

	working workingSet // operations whose work goes on after its effect
	calls   cutSet     // requests or deliveries the caller-gone window ends

	mu   sync.Mutex
	gens map[*op]uint64 // the generation the work first ran under
}

// workingSet counts, per operation, the works going on after their effect.
type workingSet struct {
	mu sync.Mutex
	m  map[*op]int
}

// enter counts one for o until the returned leave is called.
func (s *workingSet) enter(o *op) (leave func()) {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[*op]int{}
	}
	s.m[o]++
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.m[o]--
		s.mu.Unlock()
	}
}

// busy reports whether a work of o goes on after its effect.
func (s *workingSet) busy(o *op) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[o] > 0
}

// cutSet holds the cancel functions of an operation's requests in flight
// until it is cut, once.
type cutSet struct {
	mu   sync.Mutex
	cuts map[*op]map[*context.CancelFunc]bool
	gone map[*op]bool
}

// add registers cancel for o unless o was cut already; remove unregisters
// it.
func (s *cutSet) add(o *op, cancel context.CancelFunc) (remove func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone[o] {
		return func() {}
	}
	if s.cuts == nil {
		s.cuts, s.gone = map[*op]map[*context.CancelFunc]bool{}, map[*op]bool{}
	}
	if s.cuts[o] == nil {
		s.cuts[o] = map[*context.CancelFunc]bool{}
	}
	s.cuts[o][&cancel] = true
	return func() {
		s.mu.Lock()
		delete(s.cuts[o], &cancel)
		s.mu.Unlock()
	}
}

// cut cancels o's registered requests and returns how many.
func (s *cutSet) cut(o *op) int {
	s.mu.Lock()
	cuts := s.cuts[o]
	if s.gone == nil {
		s.gone = map[*op]bool{}
	}
	delete(s.cuts, o)
	s.gone[o] = true
	s.mu.Unlock()
	for cancel := range cuts {
		(*cancel)()
	}
	return len(cuts)
}

// newEntry builds the world of a family forcing wins, whose adapter stores
// the work's body as encode says.
func (e *env) newEntry(ctx context.Context, wins []window, encode func(body []byte) durable.Result) (*entry, error) {
	if only, ok := revealing[e.cfg.negative]; ok {
		wins = only
	}
	x := &entry{e: e, wins: wins, encode: encode, gens: map[*op]uint64{}}
	x.callerGone = x.calls.cut
	base, err := e.store(storeOpts{seam: func(s storeapi.Store[pgxTx]) storeapi.Store[pgxTx] {
		x.st = newFaultyStore(e, s)
		return x.st
	}})
	if err != nil {
		return nil, err
	}
	x.rs = &recStore{Store: base, e: e, client: asyncWorkerClient, claims: true}
	// The work's downstream call gets two leases, and at least 2s: a
	// call that times out is an uncertain outcome whose window is never
	// reached, and CI's load made 600ms too short for a loopback call
	// often enough that a 20-operation run lost its one panic window.
	w := &workload{modeOf: flowAll, timeout: 4*e.cfg.Lease + 2*time.Second, downstreamTimeout: max(2*e.cfg.Lease, 2*time.Second)}
	if w.verifier, err = e.claimer(claimerOpts{store: base, redis: e.redisUser("", nil)}); err != nil {
		return nil, err
	}
	// The adapter's leases are watched: a takeover of a live one is a
	// violation, and a second effect is explained by the takeovers of
	// leases that had run out.
	floors := newLeaseFloors()
	if x.server, err = e.claimer(claimerOpts{store: e.watchLeases(x.rs, floors), redis: e.redisUser("", nil)}); err != nil {
		return nil, err
	}
	w.claimers = []*claim.Claimer[pgxTx]{x.server}
	e.onClose(x.fenceHeld)
	x.w = w
	// An effect's result is the body the adapter stores.
	body := func(o *op, epoch int, id string) []byte { return encode(flowBody(o.key, epoch, id)).Body }
	x.raw, err = e.rawDownstream(body, func(o *op, n int) (fault.Behavior, time.Duration) {
		if n == 0 && x.window(o) == winResolve {
			return fault.TimeoutAfter, 0
		}
		return fault.Succeed, 0
	})
	if err != nil {
		return nil, err
	}
	if x.dedup, err = e.newDownstream(false, body, nil); err != nil {
		return nil, err
	}
	w.downstream = x.raw
	kinds := map[window][]string{
		winFinishShort: {"finish-outage-short"},
		winFinishLong:  {"finish-outage-long", "taken-over-after-outage"},
		winRenewFail:   {"lease-expired-unrenewed"},
		winPanic:       {"handler-panic", "reconciled-after-panic"},
		winCallerGone:  {"caller-gone", "lease-renewed-past-its-length"},
		winDuplicate:   {"duplicate-during-work"},
		winResolve:     {"downstream-timeout-after-effect", "resolved-by-reconciler"},
	}
	for _, win := range wins {
		e.expectFaults(kinds[win]...)
	}
	w.startOp = func(_ context.Context, o *op) {
		i := o.i
		if i >= len(wins) {
			i = e.sched.intn(len(wins), "window", o.i)
		}
		o.setInt("window", i+1)
		o.plan(string(wins[i]), true)
	}
	w.after = func(ctx context.Context, e *env, ops []*op) error {
		x.rc.halt()
		e.oneCallEachWhy(x.raw, ops, func(o *op) string { return floors.explain(o.ref.KeyHash, e.cfg.Lease) })
		return x.settled(ctx, ops)
	}
	return x, nil
}

// start finishes the setup once the family set its hooks: the reconciler
// that resolves uncertain operations from the raw downstream's account,
// stored as the adapter replays it, through a Claimer that is not
// recorded (the resolve function records its adoption and completion).
func (x *entry) start() error {
	e := x.e
	if x.timer > 0 && slices.Contains(x.wins, winTimer) {
		e.expectFaults(x.timerFault)
	}
	var err error
	// Processing records are adopted only when stale for a long time:
	// the windows' own leases run out (renewals refused, a long outage)
	// and must be decided by the workers, not by the reconciler.
	x.rc, err = e.newReconcilingAs(x.w.verifier, x.downstream, x.encode, time.Hour)
	return err
}

// fenceHeld takes over, at the end, every record of the scenario still
// held: a lease renewed forever (a settlement broken not to stop its
// renewals) is then fenced, and its KeepAlive ends before the library's
// pool closes. It runs before the pool closes (closers run in reverse).
func (x *entry) fenceHeld() {
	e := x.e
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tag, err := e.admin.Exec(ctx, `UPDATE `+e.schema+`.`+storeTable+` SET generation = generation + 1, owner_token = gen_random_uuid()
		WHERE tenant_id = $1 AND operation = $2 AND state = 'processing' AND owner_token IS NOT NULL`, e.tenant, e.name)
	if err == nil && tag.RowsAffected() > 0 {
		sleep(ctx, e.cfg.Lease) // a renewal is due every third of it
	}
}

// downstream returns the downstream o's work calls.
func (x *entry) downstream(o *op) *fault.Downstream {
	if x.window(o) == winFinishLong {
		return x.dedup
	}
	return x.raw
}

// window returns the window drawn for o.
func (x *entry) window(o *op) window {
	i := o.getInt("window")
	if i == 0 {
		return ""
	}
	return x.wins[i-1]
}

// arrived notes a request or delivery of o reaching the adapter; one that
// arrives while o's work goes on after its effect is a duplicate during
// the work.
func (x *entry) arrived(o *op) {
	if x.working.busy(o) && x.window(o) == winDuplicate {
		x.e.fault("duplicate-during-work")
	}
}

// work is the business work of every family, run by the adapter under
// the lease of tok for operation opID: the effect at the downstream, then
// o's window, the first time it runs. It returns the body to answer,
// errEffectUnknown when the downstream's answer was lost, or the
// downstream's refusal (nothing happened). It panics in the panic window.
func (x *entry) work(ctx context.Context, o *op, opID string, tok fence.Token) ([]byte, error) {
	e, lease := x.e, x.e.cfg.Lease
	epoch, _, _ := o.get()
	win := x.window(o)
	d := x.downstream(o)
	x.mu.Lock()
	if _, ok := x.gens[o]; !ok {
		x.gens[o] = tok.Generation
	}
	x.mu.Unlock()
	if err := ctx.Err(); err != nil {
		// The work's context ended before the effect was attempted (the
		// lease ran out or was lost first, as a loaded start-up of the
		// run can make it): nothing happened, as an application that
		// looks at its context before its effect knows. The family
		// answers so (a release), and a retry runs the work anew. Were it
		// called uncertain, the downstream, with no call to show, could
		// never tell the reconciler otherwise.
		e.observe("work-ended-before-effect")
		return nil, fmt.Errorf("chaos: the work's context ended before the downstream call: %w", context.Cause(ctx))
	}
	dctx, cancel := context.WithTimeout(ctx, x.w.downstreamTimeout)
	id, err := fault.CallDownstream(dctx, e.httpc, d.URL(), opID, tok)
	cancel()
	var de *fault.DownstreamError
	switch {
	case errors.As(err, &de):
		return nil, err
	case err != nil:
		if win == winResolve && o.take(string(win)) {
			e.fault("downstream-timeout-after-effect")
		}
		return nil, fmt.Errorf("%w: %w", errEffectUnknown, err)
	}
	defer x.working.enter(o)()
	if !o.take(string(win)) {
		return flowBody(o.key, epoch, id), nil
	}
	// Work after the effect that does not look at its context: it goes on
	// whatever the caller or the transport does.
	switch win {
	case winFinishShort:
		x.st.refuse(o.ref, lease/2, refuseComplete, refuseFail, refuseUncertain)
	case winFinishLong:
		x.st.refuse(o.ref, lease*3/2, refuseRenew, refuseComplete, refuseFail, refuseUncertain)
	case winRenewFail:
		e.workThroughRenewOutage(ctx, x.st, o, tok)
	case winPanic:
		e.fault("handler-panic")
		panic(errChaosPanic)
	case winCallerGone:
		start := time.Now()
		e.faultN("caller-gone", int64(x.callerGone(o)))
		time.Sleep(2 * lease)
		renewedPast(ctx, e, o, tok, start, lease)
	case winDuplicate:
		x.duplicate(context.WithoutCancel(ctx), o)
		time.Sleep(lease * 3 / 2)
	case winTimer:
		if x.timerStart != nil {
			x.timerStart(o)
		}
		start := time.Now()
		time.Sleep(x.timer)
		if x.timerPast > 0 && time.Since(start) > x.timerPast {
			e.fault(x.timerFault)
		}
	}
	return flowBody(o.key, epoch, id), nil
}

// workThroughRenewOutage is work after the effect while the store refuses
// every renewal for longer than the lease (and no one else asks): the
// lease is read until it is seen expired while the renewals are still
// refused; then they are accepted again and KeepAlive renews it back to
// life, since no one took it over. The refusal lasts until the expiry is
// seen (at most four leases), not for a fixed time: a loaded machine that
// oversleeps a fixed window would never see the expiry it is there for.
func (e *env) workThroughRenewOutage(ctx context.Context, st *faultyStore, o *op, tok fence.Token) {
	lease := e.cfg.Lease
	start := time.Now()
	st.refuse(o.ref, 4*lease, refuseRenew)
	time.Sleep(lease * 105 / 100)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for {
		if gen, state, live, err := e.leaseOf(rctx, o); err == nil && gen == tok.Generation && state == "processing" && !live {
			e.fault("lease-expired-unrenewed")
			break
		}
		if time.Since(start) > 4*lease-lease/5 {
			break
		}
		time.Sleep(lease / 50)
	}
	st.refuse(o.ref, 0, refuseRenew) // renewals accepted again
	time.Sleep(lease*3/2 - time.Since(start))
	if errors.Is(context.Cause(ctx), claim.ErrLeaseExpired) {
		e.observe("work-context-ended-lease-expired")
	}
}

// solo reports whether o's window needs its first caller alone: with
// renewals refused, a duplicate could rightly take the expired lease over.
func (x *entry) solo(o *op) bool { return x.window(o) == winRenewFail }

// allCompleted reports whether every one of ops has a completed record.
func (x *entry) allCompleted(ctx context.Context, ops []*op) bool {
	for _, o := range ops {
		if _, state, _, err := x.e.leaseOf(ctx, o); err != nil || state != "completed" {
			return false
		}
	}
	return true
}

// runClients is the families' runner for request/response transports:
// every client of an operation at once, the solo windows' first client
// alone until it has its answer; the reconciler runs meanwhile.
func (x *entry) runClients(ctx context.Context, e *env, ops []*op) error {
	x.rc.loop(ctx)
	return e.eachOp(ctx, ops, func(o *op) {
		x.w.startOp(ctx, o)
		if x.solo(o) {
			e.client(ctx, x.w, o, 0, maxAttempts)
		}
		e.runOp(ctx, x.w, o, e.cfg.Clients)
	})
}

// settled checks, after the verification pass, that every operation was
// settled (no key held forever, nothing left uncertain once the
// reconciler could resolve it), and counts the windows that fired.
func (x *entry) settled(ctx context.Context, ops []*op) error {
	e := x.e
	// The last uncertain records are resolved now, a batch a pass. A
	// record the reconciler adopted in its last background pass and could
	// not resolve then (its downstream call was still in flight) is hidden
	// from Pending by the reconciler's own lease until that lease runs
	// out, so the passes go on, every half lease, until every operation is
	// completed or several leases have passed: what is still unsettled
	// then is a violation below. (Five immediate passes left such a record
	// uncertain with a live lease about once in six 20-operation runs.)
	deadline := time.Now().Add(8*e.cfg.Lease + 2*time.Second)
	for {
		x.rc.pass(ctx)
		if x.allCompleted(ctx, ops) || !time.Now().Before(deadline) {
			break
		}
		sleep(ctx, e.cfg.Lease/2)
	}
	for _, o := range ops {
		gen, state, live, err := e.leaseOf(ctx, o)
		if err != nil {
			e.violation("operation-settled", o.key+"#1", "no record: %v", err)
			continue
		}
		if state == "uncertain" && x.raw.Calls()[o.id]+x.dedup.Calls()[o.id] == 0 {
			// The work ended before its downstream call reached the
			// downstream (its lease's context ended first, under load):
			// the adapter rightly recorded the outcome unknown, and the
			// downstream, which has no call to show, cannot tell the
			// reconciler otherwise. It stays uncertain for an operator;
			// nothing ran twice.
			e.observe("uncertain-before-effect")
			continue
		}
		if state != "completed" {
			e.violation("operation-settled", o.key+"#1", "the record is %s (lease live: %v) after every caller gave up (window %s, reached %v, downstream calls %d)",
				state, live, x.window(o), o.fired(string(x.window(o))), x.downstream(o).Calls()[o.id])
			continue
		}
		x.mu.Lock()
		first := x.gens[o]
		x.mu.Unlock()
		if !o.fired(string(x.window(o))) {
			// The work never got past its effect's call (the downstream
			// did not answer in time, under load): uncertain, reconciled.
			e.observe("window-not-reached")
			e.observe("window-not-reached:" + string(x.window(o)))
			continue
		}
		switch x.window(o) {
		case winFinishShort:
			if x.st.hit(o.ref) {
				e.fault("finish-outage-short")
			}
		case winFinishLong:
			if x.st.hit(o.ref) {
				e.fault("finish-outage-long")
			}
			if gen > first {
				e.fault("taken-over-after-outage")
			}
		case winRenewFail:
			if gen != first {
				e.violation("completed-after-failed-renewals", o.key+"#1",
					"completed under generation %d; the work ran under %d and no one else asked", gen, first)
			}
		case winPanic:
			e.fault("reconciled-after-panic")
		case winResolve:
			e.fault("resolved-by-reconciler")
		}
	}
	return nil
}
