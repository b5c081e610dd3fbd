package fault

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/testkit/redisproc"
)

// linkTimeout bounds how long a replica may take to (re)attach.
const linkTimeout = 20 * time.Second

// Node is a Redis server of a [Pair]: a testkit/redisproc process (see
// [StartPair]) or any server that is killed, restarted and paused the same
// way (the chaos runner's containers).
type Node interface {
	// Addr is its host:port, the same after Restart.
	Addr() string
	// Crash kills it with SIGKILL and waits until it is gone; it stays
	// down until Restart.
	Crash() error
	// Restart starts it again, empty (no persistence), on the same
	// address, killing it first if it runs, and waits until it answers.
	Restart() error
	// Pause stops it (SIGSTOP, a frozen container): connections are
	// accepted but nothing is answered until Resume.
	Pause() error
	// Resume undoes Pause.
	Resume() error
	// Close stops and removes it.
	Close()
}

var _ Node = (*redisproc.Server)(nil)

// Pair is a Redis primary with one replica, both servers of the suite.
// The replica reaches its primary through a [Proxy] (the replication link),
// so replication can be paused without touching either server: writes the
// primary accepts meanwhile never reach the replica, and are lost when the
// replica is promoted. The servers must reach the proxy's loopback address
// (processes do, and containers on the host's network).
//
// Clients should reach the pair through proxies of their own whose
// upstream the scenario switches ([Proxy.SetUpstream]) on a failover.
type Pair struct {
	mu      sync.Mutex
	primary Node
	replica Node
	link    *Proxy
	undo    func() // removes the blackhole on the link

	failovers   atomic.Int64
	splitBrains atomic.Int64
}

// StartPair starts a primary and a replica of it, redis-server processes,
// and waits until the replica has synchronized. An error matches
// redisproc.ErrNoBinary when redis-server is not installed.
func StartPair(ctx context.Context) (*Pair, error) {
	return StartPairOn(ctx, func(context.Context) (Node, error) {
		s, err := redisproc.New(redisproc.Options{})
		if err != nil {
			return nil, err
		}
		return s, nil
	})
}

// StartPairOn is [StartPair] on servers that start starts: each an empty
// Redis without persistence, started as a primary (so that a restart
// brings it back as one; the pair attaches it with REPLICAOF).
func StartPairOn(ctx context.Context, start func(context.Context) (Node, error)) (*Pair, error) {
	primary, err := start(ctx)
	if err != nil {
		return nil, err
	}
	link, err := NewProxy(primary.Addr())
	if err != nil {
		primary.Close()
		return nil, err
	}
	replica, err := start(ctx)
	if err != nil {
		link.Close()
		primary.Close()
		return nil, err
	}
	p := &Pair{primary: primary, replica: replica, link: link}
	if err := ReplicaOf(ctx, replica, link.Addr()); err != nil {
		p.Close()
		return nil, err
	}
	if err := p.waitLinked(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Primary returns the current primary.
func (p *Pair) Primary() Node {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.primary
}

// Replica returns the current replica.
func (p *Pair) Replica() Node {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.replica
}

// Failovers returns how many failovers [Pair.Failover] performed.
func (p *Pair) Failovers() int64 { return p.failovers.Load() }

// SplitBrains returns how many split brains [Pair.SplitBrain] created.
func (p *Pair) SplitBrains() int64 { return p.splitBrains.Load() }

// PauseReplication blackholes the replication link: the replica receives
// nothing more from its primary until [Pair.ResumeReplication] or the next
// [Pair.Failover].
func (p *Pair) PauseReplication() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.undo != nil {
		return nil
	}
	u, err := p.link.Blackhole()
	if err != nil {
		return err
	}
	p.undo = u
	return nil
}

// ResumeReplication removes the blackhole of [Pair.PauseReplication].
func (p *Pair) ResumeReplication() {
	p.mu.Lock()
	u := p.undo
	p.undo = nil
	p.mu.Unlock()
	if u != nil {
		u()
	}
}

// Lag returns how many bytes of replication stream the replica is behind
// its primary (what a promotion now would lose).
func (p *Pair) Lag(ctx context.Context) (int64, error) {
	po, err := replOffset(ctx, p.Primary(), "master_repl_offset")
	if err != nil {
		return 0, err
	}
	ro, err := replOffset(ctx, p.Replica(), "slave_repl_offset")
	if err != nil {
		return 0, err
	}
	return po - ro, nil
}

// Failover promotes the replica with REPLICAOF NO ONE (losing every write
// it had not received), kills the old primary, and brings it back empty as
// the new primary's replica. It returns the new primary; clients must be
// pointed at it. lost is the replication lag, in bytes, at the promotion.
func (p *Pair) Failover(ctx context.Context) (newPrimary Node, lost int64, err error) {
	lost, _ = p.Lag(ctx)
	p.mu.Lock()
	oldP, oldR := p.primary, p.replica
	p.mu.Unlock()
	if err := ReplicaOf(ctx, oldR, ""); err != nil {
		return nil, 0, err
	}
	if err := oldP.Crash(); err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrRedisProcess, err)
	}
	p.mu.Lock()
	p.primary, p.replica = oldR, oldP
	p.mu.Unlock()
	if err := p.relink(ctx, true); err != nil {
		return nil, lost, err
	}
	p.failovers.Add(1)
	return oldR, lost, nil
}

// SplitBrain pauses the primary (SIGSTOP), promotes the replica, and
// resumes the old primary: two primaries now accept writes, each with its
// own counters, so both grant the same generations. Clients still pointed
// at the old primary keep reaching it. heal makes the old primary a
// replica of the new one again (dropping what it accepted meanwhile) and
// returns the new primary.
func (p *Pair) SplitBrain(ctx context.Context) (newPrimary Node, heal func(context.Context) error, err error) {
	p.mu.Lock()
	oldP, oldR := p.primary, p.replica
	p.mu.Unlock()
	if err := oldP.Pause(); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrRedisProcess, err)
	}
	promoteErr := ReplicaOf(ctx, oldR, "")
	if err := oldP.Resume(); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrRedisProcess, err)
	}
	if promoteErr != nil {
		return nil, nil, promoteErr
	}
	p.splitBrains.Add(1)
	heal = func(ctx context.Context) error {
		p.mu.Lock()
		p.primary, p.replica = oldR, oldP
		p.mu.Unlock()
		return p.relink(ctx, false)
	}
	return oldR, heal, nil
}

// relink points the replication link at the current primary, makes the
// current replica (restarted empty first when restart: it was killed)
// replicate through it, and waits until it is attached.
func (p *Pair) relink(ctx context.Context, restart bool) error {
	p.ResumeReplication()
	p.mu.Lock()
	primary, replica := p.primary, p.replica
	p.mu.Unlock()
	if err := p.link.SetUpstream(primary.Addr()); err != nil {
		return err
	}
	if restart {
		if err := replica.Restart(); err != nil {
			return fmt.Errorf("%w: %w", ErrRedisProcess, err)
		}
	}
	if err := ReplicaOf(ctx, replica, p.link.Addr()); err != nil {
		return err
	}
	return p.waitLinked(ctx)
}

// waitLinked waits until the replica reports its link to its primary up
// (INFO replication: master_link_status:up), for at most linkTimeout.
func (p *Pair) waitLinked(ctx context.Context) error {
	replica := p.Replica()
	c := AdminClient(replica.Addr())
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, linkTimeout)
	defer cancel()
	for {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("replica link not up:\n%s", info)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: replica %s of %s: %w", ErrRedisProcess, replica.Addr(), p.Primary().Addr(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Close stops both servers and the link.
func (p *Pair) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.link.Close()
	p.primary.Close()
	p.replica.Close()
}

func replOffset(ctx context.Context, s Node, field string) (int64, error) {
	c := AdminClient(s.Addr())
	defer c.Close()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return 0, fmt.Errorf("%w: info on %s: %w", ErrRedisProcess, s.Addr(), err)
	}
	return infoInt(info, field), nil
}

// infoInt reads "field:<int>" from an INFO reply; 0 when absent.
func infoInt(info, field string) int64 {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// EvictedKeys returns the evicted_keys counter of c's server (INFO stats).
func EvictedKeys(ctx context.Context, c redis.Cmdable) (int64, error) {
	info, err := c.Info(ctx, "stats").Result()
	if err != nil {
		return 0, fmt.Errorf("%w: info stats: %w", ErrRedisProcess, err)
	}
	return infoInt(info, "evicted_keys"), nil
}

// Fill writes n keys of size bytes under prefix (named prefix:fill:<i>), to
// push a server running with --maxmemory and allkeys-lru into evicting
// other keys: leases and cached results. It returns
// how many keys it wrote.
func Fill(ctx context.Context, c redis.Cmdable, prefix string, n, size int) (int, error) {
	val := strings.Repeat("x", size)
	written := 0
	for i := 0; i < n; i += 50 {
		pipe := c.Pipeline()
		for j := i; j < min(n, i+50); j++ {
			pipe.Set(ctx, prefix+":fill:"+strconv.Itoa(j), val, 0)
		}
		cmds, err := pipe.Exec(ctx)
		for _, cmd := range cmds {
			if cmd.Err() == nil {
				written++
			}
		}
		if err != nil {
			return written, fmt.Errorf("%w: fill: %w", ErrRedisProcess, err)
		}
	}
	return written, nil
}
