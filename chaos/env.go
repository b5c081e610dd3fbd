package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/chaos/internal/broken"
	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/lua"
)

func splitHostPort(addr string) (string, uint16, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("%w: %q: %w", ErrSetup, addr, err)
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("%w: port in %q: %w", ErrSetup, addr, err)
	}
	return h, uint16(n), nil
}

// storeOpts are the durable store's settings for a scenario.
type storeOpts struct {
	lockTimeout time.Duration // defaults to the lease
	idleInTx    time.Duration // defaults to 20 leases
	// seam, when set, wraps the PostgreSQL store in a fault layer; the
	// negative control's bug, when one is set, goes over that layer, so
	// that it sees the faults the way the library would.
	seam func(storeapi.Store[pgxTx]) storeapi.Store[pgxTx]
	// clock is the worker's clock, for the negative control that
	// measures leases with it (worker-clock-lease); the library itself
	// never gets it.
	clock func() time.Time
}

// store returns the scenario's durable store on pool (the env's library
// pool when nil), wrapped in the negative control's bug when one is set.
func (e *env) store(o storeOpts, pool ...*pgxPool) (storeapi.Store[pgxTx], error) {
	p := e.pool
	if len(pool) > 0 && pool[0] != nil {
		p = pool[0]
	}
	if o.lockTimeout == 0 {
		o.lockTimeout = e.cfg.Lease
	}
	if o.idleInTx == 0 {
		o.idleInTx = 20 * e.cfg.Lease
	}
	st, err := postgres.New(p, postgres.WithSchema(e.schema),
		postgres.WithLockTimeout(o.lockTimeout), postgres.WithIdleInTxTimeout(o.idleInTx))
	if err != nil {
		return nil, fmt.Errorf("%w: store: %w", ErrSetup, err)
	}
	proto := st.(storeapi.Store[pgxTx]) // the claim protocol, for the fault layers
	inner := proto
	if o.seam != nil {
		inner = o.seam(proto)
	}
	if e.cfg.negative == "" || e.cfg.negative.Settlement() || e.cfg.negative.Redis() {
		// A broken settlement is the engine's (Run), a broken Redis client
		// the Claimers' (claimer): not the store's.
		return inner, nil
	}
	return broken.Wrap(proto, p, e.schema+"."+storeTable, e.cfg.negative, broken.Over(inner), broken.WorkerClock(o.clock),
		broken.OnLockSkipped(func() { e.observe("lock-first-skipped") }))
}

// redisUser returns a client for the user's Redis, through addr when set
// (a fault proxy in front of it).
func (e *env) redisUser(addr string, tweak func(*redis.Options)) *redis.Client {
	opt := *e.redisOpt
	if addr != "" {
		opt.Addr = addr
	}
	return e.redisClient(&opt, tweak)
}

// redisOwn returns a client for one of the scenario's own servers.
func (e *env) redisOwn(addr string, tweak func(*redis.Options)) *redis.Client {
	return e.redisClient(&redis.Options{Addr: addr}, tweak)
}

func (e *env) redisClient(opt *redis.Options, tweak func(*redis.Options)) *redis.Client {
	opt.ContextTimeoutEnabled = true
	opt.MaxRetries = 3 // go-redis's default, spelled out: retries re-run scripts
	opt.DialTimeout = 250 * time.Millisecond
	opt.ReadTimeout = 250 * time.Millisecond
	opt.WriteTimeout = 250 * time.Millisecond
	opt.PoolSize = e.cfg.Parallel*2 + 4
	if tweak != nil {
		tweak(opt)
	}
	c := redis.NewClient(opt)
	e.onClose(func() { c.Close() })
	return c
}

// claimerOpts configure one Claimer of a scenario.
type claimerOpts struct {
	store     storeapi.Store[pgxTx]
	redis     redis.Scripter // nil: durable store alone
	luaOpts   func(*lua.Options)
	clock     func() time.Time // the breaker's clock; nil: time.Now
	retention time.Duration
	policy    claim.Option // nil: the default (fail fast)
	// logger replaces the run's logger for this Claimer; logFor, in
	// [env.standard], gives each client's Claimer its own.
	logger *slog.Logger
	logFor func(client int) *slog.Logger
	// atCommit gives the Claimer claim.WithWriteAtCommit; [env.standard]
	// sets it for every other client, so a Do workload runs both of Do's
	// paths (claiming first, the default, and the opt-in).
	atCommit bool
	// replayCache, when positive, gives the Claimer
	// claim.WithReplayCache(replayCache): finished results kept in its
	// process (scenarios_cache.go). The verifier never gets it.
	replayCache int64
}

func (e *env) claimer(o claimerOpts) (*claim.Claimer[pgxTx], error) {
	log := e.log
	if o.logger != nil {
		log = o.logger
	}
	opts := []claim.Option{claim.WithLease(e.cfg.Lease), claim.WithLogger(log)}
	if o.policy != nil {
		opts = append(opts, o.policy)
	}
	if o.retention > 0 {
		opts = append(opts, claim.WithRetention(o.retention))
	}
	if o.atCommit {
		opts = append(opts, claim.WithWriteAtCommit())
	}
	if o.replayCache > 0 {
		opts = append(opts, claim.WithReplayCache(o.replayCache))
	}
	if o.redis != nil {
		lo := lua.Options{
			Prefix:          e.prefix,
			Timeout:         max(e.cfg.Lease/3, 100*time.Millisecond),
			BreakerFailures: 3,
			BreakerCoolDown: e.cfg.Lease,
		}
		if o.luaOpts != nil {
			o.luaOpts(&lo)
		}
		if e.cfg.negative == broken.TrustLease || e.cfg.negative == broken.RetryTakesLease {
			// Every lease, for its whole length: trust-lease's bug, and the
			// world retry-takes-lease recreates (before issue 43 a
			// confirmed lease always answered alone).
			lo.TrustLease = time.Hour
		}
		rc := o.redis
		if e.cfg.negative.Redis() {
			e.breakRedis(rc)
		}
		if o.clock != nil {
			rc = fastpath.WithHooks(rc, fastpath.Hooks{Now: o.clock})
		}
		opts = append(opts, claim.WithRedis(rc, lo))
	}
	c, err := claim.New[pgxTx](o.store, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: claimer: %w", ErrSetup, err)
	}
	e.mu.Lock()
	if e.atCommit == nil {
		e.atCommit = map[*claim.Claimer[pgxTx]]bool{}
	}
	e.atCommit[c] = o.atCommit
	e.mu.Unlock()
	return c, nil
}

// locked reports whether c, one of the scenario's Claimers, runs Do's
// function in a transaction that holds the key's lock: without
// claim.WithWriteAtCommit, Do locks first (the durable store writes at
// commit: every store of the suite passes it on) or claims first (the
// claim's statement takes the lock), and the lock is held until the
// transaction ends. The opt-in runs fn first and holds no lock.
func (e *env) locked(c *claim.Claimer[pgxTx]) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	at, ok := e.atCommit[c]
	return ok && !at
}

// breakRedis gives rc the negative control's bug of the Claimers' Redis
// clients (retry-takes-lease), once per client however many Claimers
// share it.
func (e *env) breakRedis(rc redis.Scripter) {
	if _, ok := rc.(interface{ AddHook(redis.Hook) }); !ok {
		// Not a go-redis client (whose kinds are all pointers, fit for a
		// map key): the bug cannot be given; the run says so.
		e.observe("redis-client-not-broken")
		return
	}
	e.mu.Lock()
	if e.brokenRedis == nil {
		e.brokenRedis = map[redis.Scripter]bool{}
	}
	done := e.brokenRedis[rc]
	e.brokenRedis[rc] = true
	e.mu.Unlock()
	if !done {
		broken.TakeLeases(rc, func() { e.observe("lease-confirmed-at-once") })
	}
}

// standard builds the usual workload: one Claimer per client, each with a
// Redis client of its own from newRedis (nil: no Redis), and a verifier on
// the user's Redis.
func (e *env) standard(ctx context.Context, st storeapi.Store[pgxTx], newRedis func(client int) redis.Scripter, co claimerOpts) (*workload, error) {
	w := e.newWorkload()
	for c := 0; c < e.cfg.Clients; c++ {
		o := co
		o.store = st
		// Every other client writes Do's record at commit; all of them
		// under the negative control that breaks that path, so it runs as
		// often as it did when it was Do's default, and none under the one
		// that breaks Do's default path (the lock first), so every
		// duplicate takes it.
		o.atCommit = (c%2 == 1 && e.cfg.negative != broken.DoSkipsLock) || e.cfg.negative == broken.CommitOverExisting
		if co.logFor != nil {
			o.logger = co.logFor(c)
		}
		if newRedis != nil {
			o.redis = newRedis(c)
			warm(ctx, o.redis)
		}
		cl, err := e.claimer(o)
		if err != nil {
			return nil, err
		}
		w.claimers = append(w.claimers, cl)
	}
	vo := co
	vo.store, vo.redis, vo.luaOpts, vo.logger, vo.replayCache = st, e.redisUser("", nil), nil, nil, 0
	// The verification pass retries every operation through Do: on the
	// write at commit's path too under the negative control that breaks it
	// (its retries of finished keys are what exposes it).
	vo.atCommit = e.cfg.negative == broken.CommitOverExisting
	v, err := e.claimer(vo)
	if err != nil {
		return nil, err
	}
	w.verifier = v
	return w, nil
}

// warm sends a few commands at once on a Redis client, so that its pool
// holds connections before any toxic is added (go-redis connects lazily,
// and a command on a new connection through a toxic is never sent).
func warm(ctx context.Context, c redis.Scripter) {
	u, ok := c.(redis.UniversalClient)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	done := make(chan struct{}, 4)
	for i := 0; i < 4; i++ {
		go func() { u.Ping(ctx); done <- struct{}{} }()
	}
	for i := 0; i < 4; i++ {
		<-done
	}
}

// withDownstream adds the suite's downstream to w: its effects go to the
// effects table, each with the result the operation must replay.
func (e *env) withDownstream(w *workload, plan func(o *op, n int) (fault.Behavior, time.Duration)) error {
	d, err := e.newDownstream(false, func(o *op, epoch int, id string) []byte { return flowBody(o.key, epoch, id) }, plan)
	if err != nil {
		return err
	}
	w.downstream = d
	return nil
}

// newDownstream starts a downstream (raw: without its deduplication) whose
// effects go to the effects table, each with the hash of bodyOf (the body
// the operation must replay if that effect is the one that counted). It is
// closed with the scenario.
func (e *env) newDownstream(raw bool, bodyOf func(o *op, epoch int, id string) []byte, plan func(o *op, n int) (fault.Behavior, time.Duration)) (*fault.Downstream, error) {
	d, err := fault.NewDownstream(fault.DownstreamOptions{
		Raw: raw,
		Apply: func(ctx context.Context, opID string, tok fence.Token) (string, error) {
			o := e.ops[opID]
			if o == nil {
				return "", fmt.Errorf("chaos: downstream call for an unknown operation")
			}
			epoch, _, _ := o.get()
			id := uuid.NewString()
			eff := history.Effect{Key: o.key, Epoch: epoch, Owner: tok.Owner, Generation: tok.Generation,
				Body: history.Hash(bodyOf(o, epoch, id)), Via: "downstream"}
			if err := e.insertEffectOnce(ctx, eff); err != nil {
				return "", err
			}
			return id, nil
		},
		Plan: func(opID string, n int) (fault.Behavior, time.Duration) {
			if o := e.ops[opID]; o != nil && plan != nil {
				return plan(o, n)
			}
			return fault.Succeed, 0
		},
	})
	if err != nil {
		return nil, err
	}
	e.onClose(d.Close)
	return d, nil
}

// insertEffectOnce is the downstream's own write, made idempotent: an
// insert whose acknowledgement was lost is found again (same key, token and
// body) rather than applied twice, and before each new try the effect is
// looked for first, so a try never repeats one that applied. It keeps
// trying until the database answers, for up to a minute (a crashed server
// restarting): a downstream that answered "failed" for an effect it had
// applied would apply it again for the next owner, which no idempotent
// downstream does.
func (e *env) insertEffectOnce(ctx context.Context, eff history.Effect) error {
	found := func(ctx context.Context) (bool, error) {
		var n int
		err := e.admin.QueryRow(ctx, `SELECT count(*) FROM `+e.tables.Effects()+
			` WHERE scenario = $1 AND key = $2 AND owner = $3 AND generation = $4 AND body = $5`,
			e.name, eff.Key, eff.Owner, int64(eff.Generation), eff.Body).Scan(&n)
		return n > 0, err
	}
	deadline := time.Now().Add(time.Minute)
	for try := 0; ; try++ {
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var err error
		if try > 0 {
			var ok bool
			if ok, err = found(ictx); ok {
				cancel()
				return nil
			}
		}
		if err == nil {
			if _, err = e.tables.InsertEffect(ictx, e.admin, e.name, eff); err != nil {
				if ok, ferr := found(ictx); ferr == nil && ok {
					err = nil
				}
			}
		}
		cancel()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type pgxPool = pgxpool.Pool
