package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// sentinelMaster is the name the sentinels monitor.
const sentinelMaster = "oncekey"

// setupSentinel runs the library on go-redis failover clients against a
// primary, a replica and three sentinels. Halfway through, the primary is
// SIGKILLed mid-load; the sentinels promote the replica. Operations that
// start after the kill wait for the promotion (those in flight meet the
// outage: the breaker and the fallback to the database). At the end the
// new primary must hold claim keys written after its promotion: the claim
// path recovered on it.
func setupSentinel(ctx context.Context, e *env) (*workload, error) {
	srv := e.servers()
	primary, err := srv.Redis(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	e.onClose(primary.Close)
	replica, err := srv.RedisReplica(ctx, primary)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	e.onClose(replica.Close)
	var sentinels []string
	for range 3 {
		s, err := srv.Sentinel(ctx, sentinelMaster, primary)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSetup, err)
		}
		e.onClose(s.Close)
		sentinels = append(sentinels, s.Addr())
	}
	newClient := func(int) redis.Scripter {
		c := redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: sentinelMaster, SentinelAddrs: sentinels, ContextTimeoutEnabled: true,
			DialTimeout: 250 * time.Millisecond, ReadTimeout: 250 * time.Millisecond, WriteTimeout: 250 * time.Millisecond,
			PoolSize: e.cfg.Parallel*2 + 4,
		})
		e.onClose(func() { c.Close() })
		return c
	}
	// Each client's Claimer logs to a recorder of its Redis breaker's
	// transitions.
	brk := &breakers{states: map[int][]string{}}
	w, err := e.mixedWith(ctx, storeOpts{}, newClient, claimerOpts{logFor: func(c int) *slog.Logger {
		var inner slog.Handler
		if e.log != nil {
			inner = e.log.Handler()
		}
		return slog.New(&breakerHandler{b: brk, client: c, inner: inner})
	}})
	if err != nil {
		return nil, err
	}
	// The outage must be seen: some client's breaker opens (else the run
	// proved nothing about the fallback).
	e.faultN("redis-breaker-opened", 0)
	nodes := [2]RedisServer{primary, replica}
	cur := 0 // the primary's node; only the cycles, one at a time, use it
	var newPrimary string
	var keysAtPromotion int64
	var scs []*redis.SentinelClient
	for _, a := range sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: a})
		e.onClose(func() { sc.Close() })
		scs = append(scs, sc)
	}
	countKeys := func(ctx context.Context, addr string) int64 {
		c := redis.NewClient(&redis.Options{Addr: addr})
		defer c.Close()
		var n int64
		iter := c.Scan(ctx, 0, e.prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			n++
		}
		return n
	}
	e.expectFaults("redis-primary-killed", "sentinel-failover", "old-primary-rejoined-as-replica")
	// Failed over again and again for the whole run (issue 48), back and
	// forth: the primary killed, the Sentinels promote the replica, the
	// old primary restarted (empty) and turned into the new one's replica
	// by the Sentinels. The operations within Parallel after a kill start
	// once it happened, so they meet the outage (the breaker opens and
	// they go to the database); the ones after those wait until the
	// cluster healed, and two leases more: past two cool-downs every open
	// breaker lets a probe through, so each client's breaker can close on
	// the new primary. No kill in the last Parallel+1 operations, so that
	// the breakers end closed.
	cy := e.repeat("redis-sentinel-failover", repeatedPlanned(e.cfg.Iterations, 2), e.cfg.Parallel+1, e.cfg.Parallel, func(ctx context.Context, _ int, ready func()) {
		bctx := context.WithoutCancel(ctx)
		old, next := nodes[cur], nodes[1-cur]
		time.Sleep(e.cfg.Lease) // mid-load
		end := e.span("redis-sentinel-failover")
		defer end()
		err := old.Crash()
		ready()
		if err != nil {
			e.violation("setup", "", "kill the primary: %v", err)
			return
		}
		e.fault("redis-primary-killed")
		// Every Sentinel must name the new primary before the old one comes
		// back: one that still names the old one would make the promoted
		// replica a replica of the old primary, empty after its restart.
		master := func() string {
			m := ""
			for i, sc := range scs {
				addr, err := sc.GetMasterAddrByName(bctx, sentinelMaster).Result()
				if err != nil || len(addr) != 2 || (i > 0 && net.JoinHostPort(addr[0], addr[1]) != m) {
					return ""
				}
				m = net.JoinHostPort(addr[0], addr[1])
			}
			return m
		}
		deadline := time.Now().Add(60 * time.Second)
		for master() != next.Addr() {
			if time.Now().After(deadline) {
				e.violation("setup", "", "the sentinels did not promote the replica within 60s")
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		newPrimary = next.Addr()
		keysAtPromotion = countKeys(bctx, newPrimary)
		e.fault("sentinel-failover")
		// Healed before the next cycle: the old primary back, empty, and
		// replicating the primary the Sentinels name (they reconfigure
		// it). On a loaded machine the Sentinels may fail over once more
		// by themselves (down-after-milliseconds is 1s): the next cycle
		// kills whichever primary they agree on.
		if err := old.Restart(); err != nil {
			e.violation("setup", "", "restart the old primary: %v", err)
			return
		}
		var err2 error
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			m := master()
			i := slices.IndexFunc(nodes[:], func(n RedisServer) bool { return n.Addr() == m })
			if i < 0 {
				continue
			}
			if err2 = waitReplicaOf(bctx, nodes[1-i].Addr(), m, time.Second); err2 == nil {
				if i != 1-cur {
					e.observe("sentinel-failover-by-itself")
				}
				cur = i
				newPrimary = m
				e.fault("old-primary-rejoined-as-replica")
				return
			}
		}
		e.violation("setup", "", "the cluster did not heal within 60s: %v", err2)
	}).healedFirst(2 * e.cfg.Lease)
	w.startOp = cy.start
	w.after = func(ctx context.Context, e *env, _ []*op) error {
		opened, open := brk.verdict()
		e.faultN("redis-breaker-opened", int64(opened))
		for _, c := range open {
			e.violation("sentinel-breaker-recovery", "", "client %d's Redis breaker is still %s at the end, after the promotion: the claim path did not come back to Redis", c, brk.last(c))
		}
		// A claim that took longer than the start margin is refused with
		// ErrLeaseExpired (nothing ran, retry): counted apart, not here.
		if n := e.observed()["error"]; n > 0 {
			e.violation("sentinel-fallback", "", "%d calls failed while Redis failed over: the breaker must send them to the database instead", n)
		}
		if newPrimary == "" {
			return nil
		}
		if n := countKeys(ctx, newPrimary); n <= keysAtPromotion {
			e.violation("sentinel-recovery", "", "the new primary holds %d claim keys, as many as at its promotion (%d): the claim path did not recover on it", n, keysAtPromotion)
		} else {
			e.counter(e.obs, "claim-keys-written-on-new-primary").Add(n - keysAtPromotion)
		}
		return nil
	}
	return w, nil
}

// breakers records the transitions of each client's Redis breaker, which
// the library logs at Warn ("oncekey: redis breaker", state=...).
type breakers struct {
	mu     sync.Mutex
	states map[int][]string
}

// verdict returns how many clients' breakers opened and, sorted, the
// clients whose breaker opened and did not end closed.
func (b *breakers) verdict() (opened int, open []int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for c, ss := range b.states {
		if !slices.Contains(ss, "open") {
			continue
		}
		opened++
		if ss[len(ss)-1] != "closed" {
			open = append(open, c)
		}
	}
	slices.Sort(open)
	return opened, open
}

// last returns client c's last recorded breaker state.
func (b *breakers) last(c int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ss := b.states[c]; len(ss) > 0 {
		return ss[len(ss)-1]
	}
	return "closed"
}

// breakerHandler feeds b from one client's log and passes every record on
// to inner (nil: the run logs nothing).
type breakerHandler struct {
	b      *breakers
	client int
	inner  slog.Handler
}

func (h *breakerHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || (h.inner != nil && h.inner.Enabled(ctx, l))
}

func (h *breakerHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "oncekey: redis breaker" {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "state" {
				h.b.mu.Lock()
				h.b.states[h.client] = append(h.b.states[h.client], a.Value.String())
				h.b.mu.Unlock()
				return false
			}
			return true
		})
	}
	if h.inner != nil && h.inner.Enabled(ctx, r.Level) {
		return h.inner.Handle(ctx, r)
	}
	return nil
}

func (h *breakerHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	if h.inner != nil {
		c.inner = h.inner.WithAttrs(as)
	}
	return &c
}

func (h *breakerHandler) WithGroup(name string) slog.Handler {
	c := *h
	if h.inner != nil {
		c.inner = h.inner.WithGroup(name)
	}
	return &c
}

// waitReplicaOf waits until the Redis at addr replicates primary with its
// link up, within d.
func waitReplicaOf(ctx context.Context, addr, primary string, d time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	host, port, _ := net.SplitHostPort(primary)
	var info string
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var err error
		if info, err = c.Info(ctx, "replication").Result(); err != nil {
			continue
		}
		if strings.Contains(info, "role:slave") && strings.Contains(info, "master_host:"+host+"\r") &&
			strings.Contains(info, "master_port:"+port+"\r") && strings.Contains(info, "master_link_status:up") {
			return nil
		}
	}
	return fmt.Errorf("the old primary %s does not replicate the new one %s after %v:\n%s", addr, primary, d, info)
}
