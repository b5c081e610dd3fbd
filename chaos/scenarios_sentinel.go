package chaos

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/internal/redisproc"
)

// sentinelMaster is the name the sentinels monitor.
const sentinelMaster = "oncekey"

// startSentinel starts one redis-server --sentinel on a free loopback port
// monitoring primary (quorum 2), and returns its address.
func (e *env) startSentinel(primary string) (string, error) {
	bin, err := redisproc.Binary()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "oncekey-sentinel-")
	if err != nil {
		return "", err
	}
	e.onClose(func() { os.RemoveAll(dir) })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	host, pport, _ := net.SplitHostPort(primary)
	conf := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\nlogfile %s\n"+
		"sentinel monitor %s %s %s 2\nsentinel down-after-milliseconds %s 1000\n"+
		"sentinel failover-timeout %s 5000\nsentinel parallel-syncs %s 1\n",
		port, dir, filepath.Join(dir, "sentinel.log"), sentinelMaster, host, pport, sentinelMaster, sentinelMaster, sentinelMaster)
	cf := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o600); err != nil {
		return "", err
	}
	cmd := exec.Command(bin, cf, "--sentinel")
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		return "", err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	e.onClose(func() { _ = cmd.Process.Kill(); <-done })
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	c := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer c.Close()
	for range 200 {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err = c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return addr, nil
		}
		time.Sleep(25 * time.Millisecond)
	}
	return "", fmt.Errorf("sentinel on %s did not answer: %w", addr, err)
}

// setupSentinel runs the library on go-redis failover clients against a
// primary, a replica and three sentinels. Halfway through, the primary is
// SIGKILLed mid-load; the sentinels promote the replica. Operations that
// start after the kill wait for the promotion (those in flight meet the
// outage: the breaker and the fallback to the database). At the end the
// new primary must hold claim keys written after its promotion: the claim
// path recovered on it.
func setupSentinel(ctx context.Context, e *env) (*workload, error) {
	primary, err := redisproc.New(redisproc.Options{})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	e.onClose(primary.Close)
	replica, err := redisproc.New(redisproc.Options{ReplicaOf: primary.Addr()})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	e.onClose(replica.Close)
	if err := replica.WaitLinked(ctx, 10*time.Second); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	var sentinels []string
	for range 3 {
		a, err := e.startSentinel(primary.Addr())
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSetup, err)
		}
		sentinels = append(sentinels, a)
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
	w, err := e.mixed(ctx, storeOpts{}, newClient)
	if err != nil {
		return nil, err
	}
	at := e.cfg.Iterations / 2
	promoted := make(chan struct{})
	var once sync.Once
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
				time.Sleep(e.cfg.Lease) // mid-load
				primary.Kill()
				e.fault("redis-primary-killed")
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
		if o.i > at+e.cfg.Parallel {
			select {
			case <-promoted:
			case <-ctx.Done():
			}
		}
	}
	w.after = func(ctx context.Context, e *env, _ []*op) error {
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
