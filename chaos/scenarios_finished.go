package chaos

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/lua"
)

// finished-bursts (issue 43): a finished operation replays, never "in
// progress", whatever the reason Redis has no copy of its result.
//
// Each operation is first run to its end by every client at once: with Do
// (a tenth of them business rejections, a stored failure), some with a
// result larger than the 64 KiB Redis caches (Redis keeps only a marker
// of it), the others small; or as a workflow (Claim, the downstream,
// Complete). Then come rounds of bursts of retries of the finished
// operation: right before each burst the scenario's Redis keys are deleted
// (its prefix, nothing else: every operation in flight loses its copy, its
// marker or its lease), and in half of the bursts the operation's own key
// is deleted again while the burst runs. A burst is 2*Clients+2 retries
// from every client, their starts spread over a few milliseconds so that
// some arrive together and others while the first one, which found Redis
// empty, reads the database. Every retry must get the stored result: the
// checker's finished-never-in-progress says so, besides every other
// invariant. Operations run Parallel at a time, so one operation's bursts
// meet the others' completions and flushes.
//
// Its negative control, retry-takes-lease, confirms every lease claim.lua
// grants the moment it is granted, as claim.lua's leases were before the
// fix: the retry that found Redis empty takes a lease only to read the
// database and replay, and the retries arriving meanwhile are told "in
// progress".
func setupFinishedBursts(ctx context.Context, e *env) (*workload, error) {
	// Redis is not what fails here: a script call slowed by the machine's
	// load must not time out and leave behind a confirmed lease of a
	// finished operation (a Redis failure, redis-down's matter, not this
	// scenario's), so the calls get as long as redis-delayed-reply's.
	timeout := max(e.cfg.Lease, 400*time.Millisecond)
	slow := func(o *redis.Options) { o.ReadTimeout, o.WriteTimeout = timeout, timeout }
	w, _, err := e.standardOn(ctx, storeOpts{}, func(int) redis.Scripter { return e.redisUser("", slow) },
		claimerOpts{luaOpts: func(o *lua.Options) { o.Timeout = timeout }})
	if err != nil {
		return nil, err
	}
	x := &finishedWorld{e: e, w: w, roles: make([]string, e.cfg.Iterations), admin: e.redisUser("", nil)}
	for i := range x.roles {
		x.roles[i] = e.finishedRole(i)
	}
	w.modeOf = func(o *op) mode {
		if x.roles[o.i] == roleFlow {
			return flowMode
		}
		return doMode
	}
	w.rejectRate = 0.1
	w.bodyPad = func(o *op) int {
		if x.roles[o.i] == roleLarge {
			return largePad
		}
		return 0
	}
	if err := e.withDownstream(w, nil); err != nil {
		return nil, err
	}
	e.expectFaults("redis-flushed-before-burst", "redis-key-deleted-during-burst", "burst-large-result", "burst-small-result")
	w.run = func(ctx context.Context, e *env, ops []*op) error {
		return e.eachOp(ctx, ops, func(o *op) { x.op(ctx, o) })
	}
	return w, nil
}

// The roles of finished-bursts' operations.
const (
	// roleLarge: Do, a result over the 64 KiB Redis caches.
	roleLarge = "large"
	// roleSmall: Do, a small result.
	roleSmall = "small"
	// roleFlow: a workflow, a small result.
	roleFlow = "flow"
)

// largePad is the padding of a large result: with the rest of the body,
// over fastpath's DefaultMaxCachedBody (64 KiB), which the scenario's
// Claimers keep.
const largePad = 80 << 10

// finishedRounds is how many bursts each operation gets after it finished.
const finishedRounds = 3

// finishedRole draws operation i's role; the first three are fixed, so
// that a short run has each.
func (e *env) finishedRole(i int) string {
	if i < 3 {
		return [...]string{roleLarge, roleSmall, roleFlow}[i]
	}
	switch r := e.sched.intn(10, "role", i); {
	case r < 4:
		return roleLarge
	case r < 7:
		return roleSmall
	}
	return roleFlow
}

// finishedWorld is finished-bursts' world.
type finishedWorld struct {
	e     *env
	w     *workload
	roles []string
	admin *redis.Client // the flushes'
}

// op runs o to its end with every client at once, then its bursts, each
// after a flush of the scenario's keys.
func (x *finishedWorld) op(ctx context.Context, o *op) {
	e := x.e
	e.runOp(ctx, x.w, o, e.cfg.Clients)
	for r := 0; r < finishedRounds && ctx.Err() == nil; r++ {
		if flushPrefix(ctx, x.admin, e.prefix, 5*time.Second) > 0 {
			e.fault("redis-flushed-before-burst")
		}
		x.burst(ctx, o, r)
	}
}

// burst sends 2*Clients+2 retries of o from every client, the first two at
// once and each other one after a delay drawn within a spread of a
// fifteenth of the lease (20ms at the suite's 300ms), and waits for them:
// each retries until it gets a final answer, as a client does. In half of
// the bursts o's Redis key is deleted again at a moment drawn within the
// spread.
func (x *finishedWorld) burst(ctx context.Context, o *op, round int) {
	e := x.e
	spread := int64(max(e.cfg.Lease/15, 5*time.Millisecond))
	rnd := e.sched.rnd("burst", o.i, round)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for m := range 2*e.cfg.Clients + 2 {
		c := m % e.cfg.Clients
		var at time.Duration
		if m >= 2 {
			at = time.Duration(rnd.Int64N(spread + 1))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			sleep(ctx, at)
			e.client(ctx, x.w, o, c, maxAttempts)
		}()
	}
	if e.sched.chance(0.5, "delete-during-burst", o.i, round) {
		at := time.Duration(rnd.Int64N(spread + 1))
		key := fastpath.KeysFor(e.prefix, o.ref).Record
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			sleep(ctx, at)
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if n, _ := x.admin.Del(dctx, key).Result(); n > 0 {
				e.fault("redis-key-deleted-during-burst")
			}
		}()
	}
	close(start)
	wg.Wait()
	if x.roles[o.i] == roleLarge {
		e.fault("burst-large-result")
	} else {
		e.fault("burst-small-result")
	}
}
