package chaos

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/lua"
	"github.com/oncekey/oncekey/testkit/pgproxy"
	"github.com/oncekey/oncekey/testkit/redisproc"
)

// mixed builds a workload whose even operations run with Do and odd ones
// as workflows with the downstream.
func (e *env) mixed(ctx context.Context, st storeOpts, newRedis func(int) redis.Scripter) (*workload, error) {
	return e.mixedWith(ctx, st, newRedis, claimerOpts{})
}

// mixedWith is mixed with each client's Claimer configured by co.
func (e *env) mixedWith(ctx context.Context, st storeOpts, newRedis func(int) redis.Scripter, co claimerOpts) (*workload, error) {
	s, err := e.store(st)
	if err != nil {
		return nil, err
	}
	return e.mixedOn(ctx, s, newRedis, co)
}

func setupRedisRestart(ctx context.Context, e *env) (*workload, error) {
	w, srv, err := mixedBehind(ctx, e, e.redisOwn, func() (RedisServer, error) { return e.ownRedis(ctx) })
	if err != nil {
		return nil, err
	}
	w.startOp = func(_ context.Context, o *op) {
		if e.planned(o, "restart", 0.1, 2) {
			e.bg(func() {
				if err := srv.Restart(); err == nil {
					e.fault("redis-restarted-empty")
				}
			})
		}
		if o.i%2 == 1 { // workflows, whose attempts hold their lease with KeepAlive
			e.planned(o, "restart-held", 0.05, 3)
		}
	}
	// The window a restart at a random moment rarely hits: Redis loses a
	// key while its holder works. The holder, its effect made, restarts
	// it, then works on before completing, its lease renewed by the
	// database's clock, while the op's other clients retry: each now gets
	// a fresh Redis lease, and only the database's record keeps it from
	// running the operation again. It works until one of them is granted
	// the key, or for two of a breaker's cool-downs, which the restart's
	// refused calls may have opened, and two leases more: long enough for
	// the retries to reach the empty Redis. The restart comes after the
	// effect: a holder that learns from KeepAlive that its lease was taken
	// makes none, so a restart before it can end with one effect even
	// against a store that lets the retry in.
	w.beforeComplete = func(ctx context.Context, a *attempt) {
		if !a.o.take("restart-held") {
			return
		}
		if err := srv.Restart(); err != nil {
			return
		}
		e.fault("redis-restarted-empty-while-held")
		restarted := e.rec.Now()
		until := time.Now().Add(2 * (fastpath.DefaultBreakerCoolDown + e.cfg.Lease))
		for time.Now().Before(until) && ctx.Err() == nil && !grantedSince(e.rec, a, restarted) {
			sleep(ctx, e.cfg.Lease/6)
		}
	}
	return w, nil
}

// grantedSince reports whether another client of a's op recorded a claim
// granted to it (or possibly granted) since t.
func grantedSince(rec *history.Recorder, a *attempt, t time.Duration) bool {
	for _, c := range rec.Calls() {
		if c.Key == a.o.key && c.Client != a.client && c.Kind == history.Acquire && c.Start >= t {
			return true
		}
	}
	return false
}

// ownPair starts the scenario's own Redis primary and replica (see
// [Servers]); the replica replicates through a fault proxy of the suite.
func (e *env) ownPair(ctx context.Context) (*fault.Pair, error) {
	if err := e.servers().ReachLoopback(); err != nil {
		return nil, err
	}
	return fault.StartPairOn(ctx, func(ctx context.Context) (fault.Node, error) { return e.ownRedis(ctx) })
}

func setupFailover(ctx context.Context, e *env) (*workload, error) {
	pair, err := e.ownPair(ctx)
	if err != nil {
		return nil, err
	}
	e.onClose(pair.Close)
	w, px, err := mixedBehind(ctx, e, e.redisOwn, func() (*fault.Proxy, error) { return fault.NewProxy(pair.Primary().Addr()) })
	if err != nil {
		return nil, err
	}
	w.startOp = func(ctx context.Context, o *op) {
		if !e.planned(o, "failover", 0.08, 2) {
			return
		}
		e.bg(func() {
			if err := pair.PauseReplication(); err != nil {
				return
			}
			// Writes accepted now never reach the replica.
			sleep(ctx, e.cfg.Lease/2)
			np, lost, err := pair.Failover(context.WithoutCancel(ctx))
			if err != nil {
				e.violation("setup", "", "failover: %v", err)
				return
			}
			if err := px.SetUpstream(np.Addr()); err != nil {
				e.violation("setup", "", "failover: %v", err)
				return
			}
			e.fault("failover-lost-writes")
			e.counter(e.obs, "replication-bytes-lost").Add(lost)
		})
	}
	return w, nil
}

func setupSplitBrain(ctx context.Context, e *env) (*workload, error) {
	pair, err := e.ownPair(ctx)
	if err != nil {
		return nil, err
	}
	e.onClose(pair.Close)
	var pxs []*fault.Proxy
	for i := 0; i < 2; i++ {
		px, err := fault.NewProxy(pair.Primary().Addr())
		if err != nil {
			return nil, err
		}
		e.onClose(px.Close)
		pxs = append(pxs, px)
	}
	// Client 0 follows the promotion; the others keep reaching the old
	// primary until the split heals.
	w, err := e.mixed(ctx, storeOpts{}, func(c int) redis.Scripter { return e.redisOwn(pxs[min(c, 1)].Addr(), nil) })
	if err != nil {
		return nil, err
	}
	// One split at a time: a split runs from its start to its heal under
	// splits.
	var splits sync.Mutex
	// heldDone counts the holders split from their retries (below).
	var heldDone atomic.Int32
	const heldWanted = 2
	split := func(ctx context.Context) (heal func(), err error) {
		splits.Lock()
		np, healPair, err := pair.SplitBrain(ctx)
		if err == nil {
			err = pxs[0].SetUpstream(np.Addr())
		}
		if err != nil {
			splits.Unlock()
			return nil, err
		}
		e.fault("split-brain")
		return func() {
			defer splits.Unlock()
			if err := healPair(ctx); err != nil {
				e.violation("setup", "", "split brain heal: %v", err)
				return
			}
			if err := pxs[1].SetUpstream(pair.Primary().Addr()); err != nil {
				e.violation("setup", "", "split brain heal: %v", err)
			}
		}, nil
	}
	w.startOp = func(ctx context.Context, o *op) {
		if o.i%2 == 1 { // workflows
			// Every workflow from op 3 on is a candidate until two holders
			// were split from their retries (a holder that claimed without
			// Redis, its breaker open after a split, cannot be).
			if o.i >= 3 && heldDone.Load() < heldWanted {
				o.plan("split-held", true)
			}
		}
		if !e.planned(o, "split", 0.08, 8) {
			return
		}
		e.bg(func() {
			bctx := context.WithoutCancel(ctx)
			heal, err := split(bctx)
			if err != nil {
				e.violation("setup", "", "split brain: %v", err)
				return
			}
			sleep(ctx, 2*e.cfg.Lease)
			heal()
		})
	}
	// The window a split at a random moment rarely hits (issue 43): the
	// holder's lease, confirmed and replicated, stays on one side while
	// its completion lands on the other, and a retry reaches the side
	// with the lease right after the completion. It must replay: a
	// confirmed lease answers "in progress" by Redis alone only under the
	// TrustLease opt-in (the negative control trust-lease).
	// Its lease is ten of the scenario's, so that the side the holder left
	// still holds it when the retry comes: the split, the work and the
	// completion take a few of the scenario's leases on a busy machine.
	w.requestLease = func(o *op) time.Duration {
		if o.planned("split-held") {
			return 10 * e.cfg.Lease
		}
		return 0
	}
	heals := map[*op]func(){}
	var healsMu sync.Mutex
	w.afterClaim = func(ctx context.Context, a *attempt) {
		if !a.o.planned("split-held") || a.o.fired("split-held") {
			return
		}
		k := fastpath.KeysFor(e.prefix, a.o.ref)
		// held reports whether the node at addr holds this attempt's lease
		// confirmed, waiting for at most a lease of the scenario's while
		// the lease may still come (its confirmation is sent beside the
		// work; a replica receives it later); another holder's key, or
		// none on the primary, ends the wait at once.
		held := func(addr string, primary bool) bool {
			c := fault.AdminClient(addr)
			defer c.Close()
			for deadline := time.Now().Add(e.cfg.Lease); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
				st, err := fastpath.ReadStored(ctx, c, k)
				switch {
				case err != nil:
				case st.Kind == fastpath.StoredLease && st.Owner == a.tok.Owner.String():
					if !st.Tentative && st.Generation == a.tok.Generation {
						return true
					}
				case st.Kind != fastpath.StoredNone || primary:
					return false
				}
			}
			return false
		}
		splits.Lock() // no split in progress: the pair has one primary
		primary, replica := pair.Primary().Addr(), pair.Replica().Addr()
		splits.Unlock()
		// The holder's lease confirmed on the primary and replicated. A
		// holder that claimed without Redis (its breaker open) leaves the
		// fault to the operation's next holder.
		if !held(primary, true) || !held(replica, false) || !a.o.take("split-held") {
			e.observe("split-held-not-this-attempt")
			return
		}
		healNow, err := split(context.WithoutCancel(ctx))
		if err != nil {
			e.violation("setup", "", "split brain: %v", err)
			return
		}
		// Healed after the retry, or after ten leases if the holder never
		// completes (fenced, or its completion refused).
		heal := sync.OnceFunc(healNow)
		e.bg(func() { sleep(context.WithoutCancel(ctx), 10*e.cfg.Lease); heal() })
		// The retry goes to the side the holder does not complete on.
		other := 1
		if a.client >= 1 {
			other = 0
		}
		a.o.setInt("split-held-retry", other+1)
		healsMu.Lock()
		heals[a.o] = heal
		healsMu.Unlock()
		heldDone.Add(1)
		e.fault("split-held-by-a-holder")
	}
	w.afterComplete = func(ctx context.Context, a *attempt) {
		other := a.o.getInt("split-held-retry") - 1
		healsMu.Lock()
		heal := heals[a.o]
		delete(heals, a.o)
		healsMu.Unlock()
		if heal == nil {
			return
		}
		defer heal()
		if other >= 0 {
			e.attempt(ctx, w, a.o, other, 0)
			e.fault("retried-on-the-side-without-the-completion")
		}
	}
	return w, nil
}

func setupRedisDown(ctx context.Context, e *env) (*workload, error) {
	w, px, err := mixedBehind(ctx, e, e.redisUser, func() (*fault.Proxy, error) { return fault.NewProxy(e.redisOpt.Addr) })
	if err != nil {
		return nil, err
	}
	kinds := []string{"blackhole", "cut-all", "cut-after-bytes"}
	w.startOp = func(ctx context.Context, o *op) {
		var kind string
		switch {
		case o.i >= 1 && o.i <= 3:
			kind = kinds[o.i-1]
			e.sched.chance(1, "outage", o.i)
		case e.sched.chance(0.1, "outage", o.i):
			kind = kinds[e.sched.intn(len(kinds), "outage-kind", o.i)]
		default:
			return
		}
		n := int64(1 + e.sched.intn(64, "cut-bytes", o.i))
		e.bg(func() {
			switch kind {
			case "blackhole":
				e.hold(ctx, "redis-blackholed", 2*e.cfg.Lease, px.Blackhole)
			case "cut-all":
				if px.CutAll() == nil {
					e.fault("redis-connections-cut")
				}
			case "cut-after-bytes":
				e.hold(ctx, "redis-replies-cut-after-bytes", e.cfg.Lease, func() (func(), error) { return px.CutAfter(n) })
			}
		})
	}
	return w, nil
}

func setupEviction(ctx context.Context, e *env) (*workload, error) {
	w, srv, err := mixedBehind(ctx, e, e.redisOwn, func() (*redisproc.Server, error) {
		return redisproc.New(redisproc.Options{Args: []string{"--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru"}})
	})
	if err != nil {
		return nil, err
	}
	admin := fault.AdminClient(srv.Addr())
	e.onClose(func() { admin.Close() })
	before, err := fault.EvictedKeys(ctx, admin)
	if err != nil {
		return nil, err
	}
	w.run = func(ctx context.Context, e *env, ops []*op) error {
		// Fill until the server evicts before the first operation, so every
		// run works against a full server however short it is: a few rounds
		// on a quick run once left 3 MB unreached and nothing evicted.
		round := 0
		for ; ; round++ {
			n, err := fault.EvictedKeys(ctx, admin)
			if err != nil {
				return err
			}
			if n > before {
				break
			}
			if round == 64 {
				return fmt.Errorf("chaos: redis-eviction: %d fill rounds evicted nothing", round)
			}
			if _, err := fault.Fill(ctx, admin, fmt.Sprintf("fill%d", round), 400, 2048); err != nil {
				return err
			}
		}
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for ; ; round++ {
				_, _ = fault.Fill(ctx, admin, fmt.Sprintf("fill%d", round), 400, 2048)
				select {
				case <-stop:
					return
				case <-time.After(e.cfg.Lease / 3):
				}
			}
		}()
		err := e.runOps(ctx, w, ops)
		close(stop)
		<-done
		after, ierr := fault.EvictedKeys(context.WithoutCancel(ctx), admin)
		if ierr == nil {
			e.faultN("evicted-keys", after-before)
		}
		return err
	}
	return w, nil
}

func setupDelayedReply(ctx context.Context, e *env) (*workload, error) {
	px, err := fault.NewScriptDelay(e.redisOpt.Addr)
	if err != nil {
		return nil, err
	}
	e.onClose(px.Close)
	sends := &fault.ScriptSends{}
	w, err := e.mixedWith(ctx, storeOpts{}, func(int) redis.Scripter {
		c := e.redisUser(px.Addr(), func(o *redis.Options) {
			o.ReadTimeout = 50 * time.Millisecond
			o.Dialer = sends.Dialer(nil)
		})
		c.AddHook(sends.Hook())
		return c
	}, claimerOpts{luaOpts: func(o *lua.Options) { o.Timeout = max(e.cfg.Lease, 400*time.Millisecond) }})
	if err != nil {
		return nil, err
	}
	w.startOp = func(ctx context.Context, o *op) {
		if !e.planned(o, "delay", 0.1, 1) {
			return
		}
		e.bg(func() {
			px.Set(80 * time.Millisecond) // past the 50ms read timeout
			e.fault("redis-replies-delayed")
			sleep(ctx, e.cfg.Lease)
			px.Set(0)
		})
	}
	w.after = func(context.Context, *env, []*op) error {
		e.faultN("scripts-resent", sends.Resent())
		e.counter(e.obs, "script-replies-delayed").Add(px.Delayed())
		return nil
	}
	return w, nil
}

func setupDBKill(ctx context.Context, e *env) (*workload, error) {
	w, err := e.mixed(ctx, storeOpts{}, e.userRedis)
	if err != nil {
		return nil, err
	}
	w.startOp = e.planDoFlow("kill-in-tx", 0.5, "kill-pool", 0.3)
	w.afterEffect = func(ctx context.Context, a *attempt) error {
		if !a.o.take("kill-in-tx") {
			return nil
		}
		pid, err := fault.BackendPID(ctx, a.tx)
		if err != nil {
			return nil
		}
		if ok, _ := fault.Terminate(ctx, e.admin, pid); ok {
			e.fault("backend-terminated-in-tx")
			a.note = "backend terminated before commit"
		}
		return nil
	}
	w.beforeComplete = func(ctx context.Context, a *attempt) {
		if a.o.take("kill-pool") {
			n, _ := fault.TerminateApp(context.WithoutCancel(ctx), e.admin, e.app)
			e.faultN("library-backends-terminated", int64(n))
		}
	}
	return w, nil
}

func setupCommitCut(ctx context.Context, e *env) (*workload, error) {
	pcfg, err := pgxpool.ParseConfig(e.cfg.PostgresURL)
	if err != nil {
		return nil, err
	}
	network, target := "tcp", net.JoinHostPort(pcfg.ConnConfig.Host, strconv.Itoa(int(pcfg.ConnConfig.Port)))
	if strings.HasPrefix(pcfg.ConnConfig.Host, "/") {
		network, target = "unix", fmt.Sprintf("%s/.s.PGSQL.%d", pcfg.ConnConfig.Host, pcfg.ConnConfig.Port)
	}
	cutter, err := pgproxy.New(network, target)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", fault.ErrProxy, err)
	}
	e.onClose(cutter.Close)
	pool, err := e.newPool(ctx, cutter.Addr())
	if err != nil {
		return nil, err
	}
	st, err := e.store(storeOpts{}, pool)
	if err != nil {
		return nil, err
	}
	w, err := e.mixedOn(ctx, st, e.userRedis, claimerOpts{})
	if err != nil {
		return nil, err
	}
	w.startOp = func(_ context.Context, o *op) {
		if !e.planned(o, "cut", 0.5, 0, 1) {
			return
		}
		if o.i%2 == 0 {
			cutter.Arm(pgproxy.CutCommit)
		} else {
			cutter.Arm(pgproxy.CutStatement)
		}
	}
	w.after = func(context.Context, *env, []*op) error {
		e.faultN("acknowledgement-lost", cutter.Cuts())
		return nil
	}
	return w, nil
}

func setupPausedOwner(ctx context.Context, e *env) (*workload, error) {
	// The server ends a transaction left idle for a lease, so a paused
	// owner's row lock does not block the others for ever.
	w, err := e.mixed(ctx, storeOpts{lockTimeout: e.cfg.Lease / 2, idleInTx: e.cfg.Lease}, e.userRedis)
	if err != nil {
		return nil, err
	}
	w.startOp = e.planDoFlow("pause-in-tx", 0.5, "pause-before-complete", 0.6)
	w.afterEffect = func(_ context.Context, a *attempt) error {
		if a.o.take("pause-in-tx") {
			e.fault("paused-in-transaction")
			fault.Pause(e.pauseFor(), nil)
		}
		return nil
	}
	w.beforeComplete = func(_ context.Context, a *attempt) {
		e.pauseBeforeComplete(a, "pause-before-complete", "paused-before-complete")
	}
	return w, nil
}

func setupClockSkew(ctx context.Context, e *env) (*workload, error) {
	px, err := fault.NewProxy(e.redisOpt.Addr)
	if err != nil {
		return nil, err
	}
	e.onClose(px.Close)
	// Every client's store is watched for takeovers of live leases; each
	// is given its worker's clock, which only the negative control's
	// worker-clock-lease bug reads.
	floors := newLeaseFloors()
	st, err := e.store(storeOpts{})
	if err != nil {
		return nil, err
	}
	st = e.watchLeases(st, floors)
	direct := e.redisUser("", nil)
	var clocks []*fault.SkewedClock
	w := e.newWorkload()
	for c := 0; c < e.cfg.Clients; c++ {
		hours := time.Duration(1+e.sched.intn(48, "skew-hours", c)) * time.Hour
		if e.sched.chance(0.5, "skew-behind", c) {
			hours = -hours
		}
		clock := fault.NewSkewedClock(hours, 30*time.Minute, uint64(e.cfg.Seed)+uint64(c))
		clocks = append(clocks, clock)
		rdb := e.redisUser(px.Addr(), nil)
		warm(ctx, rdb)
		cst, err := e.store(storeOpts{clock: clock.Now})
		if err != nil {
			return nil, err
		}
		cl, err := e.claimer(claimerOpts{store: e.watchLeases(cst, floors), redis: rdb, clock: clock.Now})
		if err != nil {
			return nil, err
		}
		w.claimers = append(w.claimers, cl)
	}
	v, err := e.claimer(claimerOpts{store: st, redis: direct})
	if err != nil {
		return nil, err
	}
	w.verifier = v
	if err := e.mix(w); err != nil {
		return nil, err
	}
	vanish := func(ctx context.Context, a *attempt) {
		// Only a lease that exists can vanish: an attempt that claimed
		// without Redis (breaker open) leaves the fault to the next one.
		if a.o.planned("vanish") {
			if ok, _ := fault.VanishLease(ctx, direct, e.prefix, a.o.ref); ok && a.o.take("vanish") {
				e.fault("redis-lease-vanished")
			}
		}
	}
	w.startOp = func(ctx context.Context, o *op) {
		e.planned(o, "vanish", 0.4, 0, 1)
		if o.i%2 == 1 {
			e.planned(o, "pause", 0.3, 3)
			e.planned(o, "long-work", 0.5, 1)
		}
		// Redis outages make the breakers read their (skewed) clocks.
		// The first is planned late, once the first leases were made
		// to vanish.
		if o.i > e.cfg.Parallel && e.planned(o, "outage", 0.04, e.cfg.Parallel+1, e.cfg.Iterations-1) {
			e.bg(func() { e.hold(ctx, "redis-blackholed", 2*e.cfg.Lease, px.Blackhole) })
		}
	}
	w.inTx = func(ctx context.Context, a *attempt) error { vanish(ctx, a); return nil }
	w.afterClaim = func(ctx context.Context, a *attempt) {
		vanish(ctx, a)
		if a.o.take("long-work") {
			// Work longer than the lease, renewed by KeepAlive by the
			// database's clock, while the others ask (through Redis, or
			// straight to the database once the Redis lease vanished):
			// no clock of theirs may end it early.
			e.fault("work-past-lease")
			time.Sleep(e.cfg.Lease * 3 / 2)
		}
	}
	w.beforeComplete = func(_ context.Context, a *attempt) { e.pauseBeforeComplete(a, "pause", "paused-past-lease") }
	w.after = func(context.Context, *env, []*op) error {
		var reads int64
		for _, c := range clocks {
			reads += c.Reads()
		}
		e.faultN("skewed-clock-reads", reads)
		return nil
	}
	return w, nil
}
