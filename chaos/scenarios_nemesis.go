package chaos

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/oncekey/oncekey/chaos/internal/broken"
	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/testkit/pgproxy"
)

// The combined nemesis (issue 48): one scenario whose operations meet
// faults drawn at random from every family of its servers, overlapping,
// for the whole run, and whose history the checker judges as a whole.

// nemesisFaults are the nemesis's fault families, each a kind counted in
// the result (every one must fire).
var nemesisFaults = []string{
	"redis-restarted-empty", "redis-flushed", "redis-frozen", "redis-failover",
	"postgres-failover", "postgres-crash", "postgres-partition", "postgres-latency", "postgres-reply-lost",
	"paused-past-lease", "redis-lease-vanished",
}

// perOp are the families that strike one operation's holder (the others
// strike a server); each is planned on three operations at least: a
// holder may be gone (or its server down) before its fault can strike.
var nemesisPerOp = map[string]bool{
	"postgres-partition": true, "postgres-latency": true, "postgres-reply-lost": true,
	"paused-past-lease": true, "redis-lease-vanished": true,
}

func nemesisRegistry() []scenario {
	return []scenario{
		{name: "nemesis", forces: "every fault family of its servers at once, drawn from the seed for the whole run and overlapping, under a mixed Do and workflow load: Redis (a primary and its replica) restarted empty, flushed, frozen (SIGSTOP) and failed over; PostgreSQL (a synchronous pair) failed over and back, crashed, and one client's connections partitioned, slowed past the lease or their COMMIT's reply lost; holders paused past their lease; worker clocks hours off, Redis leases vanishing", ownRedis: true, ownPostgres: true, onServers: true, setup: setupNemesis},
	}
}

// nemesis is the nemesis's world.
type nemesis struct {
	e      *env
	pg     *pgPair
	up     *fault.Proxy    // every connection to PostgreSQL, to its primary
	cutter *pgproxy.Cutter // the clients' connections, before up
	pxs    []*fault.Proxy  // client c's connections, before the cutter
	busy   []sync.Mutex    // one fault at a time on each of pxs
	rpair  *fault.Pair
	rpxs   []*fault.Proxy // client c's Redis connections, to the primary
	// pgMu and redisMu serialize the faults of one server pair (a crash
	// during a failover would be a fault of the suite); faults of
	// different families overlap.
	pgMu, redisMu sync.Mutex
}

func setupNemesis(ctx context.Context, e *env) (*workload, error) {
	n := &nemesis{e: e}
	// PostgreSQL: a synchronous pair, every connection through up, which
	// follows the primary; the clients' through the cutter and a proxy of
	// their own.
	primary, err := e.ownPostgres(ctx, "synchronous_commit=on", "max_connections=200", "wal_level=replica", "synchronous_standby_names=*")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	e.onClose(primary.Close)
	standby, err := e.servers().PostgresStandby(ctx, primary)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	e.onClose(standby.Close)
	a, aok := asPostgresNode(primary)
	b, bok := asPostgresNode(standby)
	if !aok || !bok {
		return nil, fmt.Errorf("%w: the nemesis fails PostgreSQL over and back, and these servers' PostgreSQL cannot rejoin an old primary as a standby (%T, %T)", ErrServersUnsupported, primary, standby)
	}
	n.pg = &pgPair{nodes: [2]PostgresNode{a, b}, sync: true}
	if n.up, err = fault.NewProxy(primary.Addr()); err != nil {
		return nil, err
	}
	e.onClose(n.up.Close)
	if err := e.onCluster(ctx, "postgres://postgres@"+n.up.Addr()+"/postgres?sslmode=disable&connect_timeout=2"); err != nil {
		return nil, err
	}
	if err := e.seesStandby(ctx, true); err != nil {
		return nil, err
	}
	if n.cutter, err = pgproxy.New("tcp", n.up.Addr()); err != nil {
		return nil, fmt.Errorf("%w: %w", fault.ErrProxy, err)
	}
	e.onClose(n.cutter.Close)
	// Redis: a primary and its replica, each client through a proxy of its
	// own that follows the primary.
	if n.rpair, err = e.ownPair(ctx); err != nil {
		return nil, err
	}
	e.onClose(n.rpair.Close)

	w := e.newWorkload()
	var clocks []*fault.SkewedClock
	for c := 0; c < e.cfg.Clients; c++ {
		px, err := fault.NewProxy(n.cutter.Addr())
		if err != nil {
			return nil, err
		}
		e.onClose(px.Close)
		n.pxs = append(n.pxs, px)
		pool, err := e.newPool(ctx, px.Addr())
		if err != nil {
			return nil, err
		}
		st, err := e.store(storeOpts{}, pool)
		if err != nil {
			return nil, err
		}
		rpx, err := fault.NewProxy(n.rpair.Primary().Addr())
		if err != nil {
			return nil, err
		}
		e.onClose(rpx.Close)
		n.rpxs = append(n.rpxs, rpx)
		rc := e.redisOwn(rpx.Addr(), nil)
		warm(ctx, rc)
		// Each worker's breaker reads a clock hours off, jumping.
		hours := time.Duration(1+e.sched.intn(48, "skew-hours", c)) * time.Hour
		if e.sched.chance(0.5, "skew-behind", c) {
			hours = -hours
		}
		clock := fault.NewSkewedClock(hours, 30*time.Minute, uint64(e.cfg.Seed)+uint64(c))
		clocks = append(clocks, clock)
		cl, err := e.claimer(claimerOpts{store: st, redis: rc, clock: clock.Now,
			atCommit: (c%2 == 1 && e.cfg.negative != broken.DoSkipsLock) || e.cfg.negative == broken.CommitOverExisting})
		if err != nil {
			return nil, err
		}
		w.claimers = append(w.claimers, cl)
	}
	n.busy = make([]sync.Mutex, len(n.pxs))
	vst, err := e.store(storeOpts{})
	if err != nil {
		return nil, err
	}
	if w.verifier, err = e.claimer(claimerOpts{store: vst, redis: e.redisUser("", nil),
		atCommit: e.cfg.negative == broken.CommitOverExisting}); err != nil {
		return nil, err
	}
	if err := e.mix(w); err != nil {
		return nil, err
	}
	e.expectFaults(nemesisFaults...)

	// The plan: every family forced early (the per-operation ones thrice),
	// in an order drawn from the seed, then one family drawn at random on
	// about a third of the operations.
	var forced []string
	for _, f := range nemesisFaults {
		forced = append(forced, f)
		if nemesisPerOp[f] {
			forced = append(forced, f, f)
		}
	}
	rnd := e.sched.rnd("nemesis-order")
	rnd.Shuffle(len(forced), func(i, j int) { forced[i], forced[j] = forced[j], forced[i] })
	// Two forced families per operation from operation 1 on, so that a
	// run of 20 operations forces every one.
	w.startOp = func(ctx context.Context, o *op) {
		var kinds []string
		switch {
		case o.i >= 1 && 2*(o.i-1) < len(forced):
			kinds = slices.Clone(forced[2*(o.i-1) : min(2*o.i, len(forced))])
			e.sched.record(fmt.Sprintf("nemesis%d=%v", o.i, kinds))
		case 2*(o.i-1) >= len(forced) && e.sched.chance(0.35, "nemesis", o.i):
			kinds = []string{nemesisFaults[e.sched.intn(len(nemesisFaults), "nemesis-kind", o.i)]}
		}
		// A Redis clock jump, and a lost reply, on a quarter of the
		// operations besides each: a lease can vanish only while Redis
		// holds one, and an armed cut may meet a COMMIT that never gets
		// its reply from a server that went down.
		if e.sched.chance(0.25, "vanish", o.i) {
			kinds = append(kinds, "redis-lease-vanished")
		}
		if e.sched.chance(0.25, "reply-lost", o.i) {
			kinds = append(kinds, "postgres-reply-lost")
		}
		for _, kind := range kinds {
			if nemesisPerOp[kind] {
				o.plan(kind, true)
				continue
			}
			e.bgs.Add(1) // waited for before the verification pass
			go func() {
				defer e.bgs.Done()
				n.server(ctx, kind)
			}()
		}
	}
	w.inTx = func(ctx context.Context, a *attempt) error { n.vanish(ctx, a); return nil }
	w.afterClaim = func(ctx context.Context, a *attempt) { n.vanish(ctx, a) }
	w.afterEffect = func(ctx context.Context, a *attempt) error {
		n.vanish(ctx, a)
		n.network(a)
		if a.o.take("postgres-reply-lost") {
			// The holder's COMMIT, the next through the cutter, applies and
			// its reply is lost (another client's may take the cut first).
			n.cutter.Arm(pgproxy.CutCommit)
		}
		if a.o.take("paused-past-lease") {
			// A Do holder paused in its transaction, past its lease.
			defer e.span("paused-past-lease")()
			e.fault("paused-past-lease")
			fault.Pause(e.pauseFor(), nil)
		}
		return nil
	}
	w.beforeComplete = func(ctx context.Context, a *attempt) {
		n.vanish(ctx, a)
		n.network(a)
		if a.o.take("postgres-reply-lost") {
			// The holder's fenced finish, or the next statement through the
			// cutter, applies and its reply is lost.
			n.cutter.Arm(pgproxy.CutStatement)
		}
		if a.o.planned("paused-past-lease") && !a.o.fired("paused-past-lease") {
			end := e.span("paused-past-lease")
			// As in stale-owner: the completion it then sends, once another
			// client took over, is the one the fence must reject.
			if e.pauseBeforeComplete(a, "paused-past-lease", "paused-past-lease") && e.awaitTakeover(ctx, a.o, a.tok, 8*e.cfg.Lease) {
				e.observe("taken-over-during-pause")
			}
			end()
		}
	}
	w.after = func(context.Context, *env, []*op) error {
		var reads int64
		for _, c := range clocks {
			reads += c.Reads()
		}
		e.faultN("skewed-clock-reads", reads)
		e.faultN("postgres-reply-lost", n.cutter.Cuts())
		return nil
	}
	return w, nil
}

// server runs a fault of kind on one of the servers, one at a time per
// server pair.
func (n *nemesis) server(ctx context.Context, kind string) {
	e := n.e
	bctx := context.WithoutCancel(ctx)
	switch kind {
	case "postgres-failover", "postgres-crash":
		n.pgMu.Lock()
		defer n.pgMu.Unlock()
		if kind == "postgres-failover" {
			if e.pgFailoverOnce(ctx, n.pg, func() {}, func(p PostgresNode) error { return n.up.SetUpstream(p.Addr()) }) {
				e.fault("postgres-failover")
			}
			return
		}
		time.Sleep(e.cfg.Lease / 2)
		defer e.span(kind)()
		p := n.pg.primary()
		if err := p.Crash(); err != nil {
			e.violation("setup", "", "crash: %v", err)
			return
		}
		rctx, cancel := context.WithTimeout(bctx, 90*time.Second)
		defer cancel()
		if err := p.Start(rctx); err != nil {
			e.violation("setup", "", "restart after crash: %v", err)
			return
		}
		e.fault(kind)
		// Healed once the standby streams again, synchronous: the commits
		// the primary recovered were never replicated, yet they are
		// visible (a retry replays them, acknowledged); a failover to a
		// standby that has not received them loses them. (Without this
		// wait the nemesis found exactly that: see chaos/README.md,
		// Hazards.)
		if err := p.WaitStandby(rctx, true); err != nil {
			e.violation("setup", "", "%v", err)
		}
	default:
		n.redisMu.Lock()
		defer n.redisMu.Unlock()
		defer e.span(kind)()
		switch kind {
		case "redis-restarted-empty":
			if err := n.rpair.Primary().Restart(); err != nil {
				e.violation("setup", "", "redis restart: %v", err)
				return
			}
		case "redis-flushed":
			c := fault.AdminClient(n.rpair.Primary().Addr())
			err := c.FlushAll(bctx).Err()
			c.Close()
			if err != nil {
				return
			}
		case "redis-frozen":
			p := n.rpair.Primary()
			if err := p.Pause(); err != nil {
				e.violation("setup", "", "redis freeze: %v", err)
				return
			}
			sleep(bctx, 2*e.cfg.Lease)
			if err := p.Resume(); err != nil {
				e.violation("setup", "", "redis thaw: %v", err)
				return
			}
		case "redis-failover":
			if err := n.rpair.PauseReplication(); err != nil {
				return
			}
			sleep(bctx, e.cfg.Lease/2) // writes accepted now never reach the replica
			np, lost, err := n.rpair.Failover(bctx)
			if err != nil {
				e.violation("setup", "", "redis failover: %v", err)
				return
			}
			for _, px := range n.rpxs {
				if err := px.SetUpstream(np.Addr()); err != nil {
					e.violation("setup", "", "redis failover: %v", err)
					return
				}
			}
			e.counter(e.obs, "replication-bytes-lost").Add(lost)
		}
		e.fault(kind)
	}
}

// network partitions the holder's connections to PostgreSQL, or slows
// them, for two leases, when its operation has one of them planned: the
// holder's lease runs out while the other clients still reach the
// database (inside a Do transaction before its COMMIT, or between a
// workflow's effect and its finish).
func (n *nemesis) network(a *attempt) {
	e := n.e
	kind := ""
	switch {
	case a.o.take("postgres-partition"):
		kind = "postgres-partition"
	case a.o.take("postgres-latency"):
		kind = "postgres-latency"
	default:
		return
	}
	i := a.client % len(n.pxs)
	n.busy[i].Lock()
	var undo func()
	var err error
	if kind == "postgres-latency" {
		undo, err = n.pxs[i].Latency(2*e.cfg.Lease, 0)
	} else {
		undo, err = n.pxs[i].Blackhole()
	}
	if err != nil {
		n.busy[i].Unlock()
		return
	}
	e.fault(kind)
	end := e.span(kind)
	a.note = kind + " for 2 leases, on this client's connections only"
	time.AfterFunc(2*e.cfg.Lease, func() {
		undo()
		end()
		n.busy[i].Unlock()
	})
}

// vanish deletes the holder's Redis lease (PEXPIRE 1: what a Redis
// clock jump does to it) when its operation has it planned and a lease
// exists.
func (n *nemesis) vanish(ctx context.Context, a *attempt) {
	if !a.o.planned("redis-lease-vanished") || a.o.fired("redis-lease-vanished") {
		return
	}
	c := fault.AdminClient(n.rpair.Primary().Addr())
	defer c.Close()
	if ok, _ := fault.VanishLease(ctx, c, n.e.prefix, a.o.ref); ok && a.o.take("redis-lease-vanished") {
		n.e.fault("redis-lease-vanished")
	}
}
