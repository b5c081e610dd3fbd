package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
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
	at := e.cfg.Iterations / 2
	killed, promoted := make(chan struct{}), make(chan struct{})
	var once, killOnce sync.Once
	var newPrimary string
	var keysAtPromotion int64
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinels[0]})
	e.onClose(func() { sc.Close() })
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
	w.startOp = func(ctx context.Context, o *op) {
		if o.i == at {
			e.bg(func() {
				defer once.Do(func() { close(promoted) })
				defer killOnce.Do(func() { close(killed) })
				time.Sleep(e.cfg.Lease) // mid-load
				if err := primary.Crash(); err != nil {
					e.violation("setup", "", "kill the primary: %v", err)
					return
				}
				e.fault("redis-primary-killed")
				killOnce.Do(func() { close(killed) })
				deadline := time.Now().Add(60 * time.Second)
				for time.Now().Before(deadline) {
					addr, err := sc.GetMasterAddrByName(context.WithoutCancel(ctx), sentinelMaster).Result()
					if err == nil && len(addr) == 2 && net.JoinHostPort(addr[0], addr[1]) == replica.Addr() {
						newPrimary = replica.Addr()
						keysAtPromotion = countKeys(context.WithoutCancel(ctx), newPrimary)
						e.fault("sentinel-failover")
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
				e.violation("setup", "", "the sentinels did not promote the replica within 60s")
			})
		}
		// The next operations start once the primary is dead, so they meet
		// the outage: the breaker opens and they go to the database.
		if o.i > at && o.i <= at+e.cfg.Parallel {
			select {
			case <-killed:
			case <-ctx.Done():
			}
		}
		if o.i > at+e.cfg.Parallel {
			select {
			case <-promoted:
			case <-ctx.Done():
			}
			// Past two cool-downs every open breaker lets a probe through,
			// so each client's breaker can close on the new primary.
			select {
			case <-time.After(2 * e.cfg.Lease):
			case <-ctx.Done():
			}
		}
	}
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
