package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/testkit/loopback"
	"github.com/oncekey/oncekey/testkit/redisproc"
)

// Servers starts the servers of their own that some scenarios restart,
// crash, replicate or fail over, in place of the processes they start
// from the machine's binaries: the chaos runner's -containers sets one
// that starts containers (see [Config.Servers]). The scenarios that use
// it are redis-restart (a Redis), redis-failover and split-brain (two
// Redis, made a primary and its replica through a fault proxy of the
// suite), redis-sentinel (a Redis, a replica, three Sentinels), pg-crash
// and the hazard pg-crash-async-commit (a PostgreSQL), pg-failover-sync
// and the hazard pg-failover-async (a PostgreSQL and a streaming standby);
// -list says "under -containers" for each. The other scenarios that start servers of their own start
// processes as without it. Without Config.Servers those scenarios run on
// processes through the same interface (the process servers satisfy it),
// so that each has one code path.
//
// A method that cannot start what is asked on its servers returns an
// error wrapping [ErrServersUnsupported]; the scenario is then skipped
// with that error as its reason.
type Servers interface {
	// Redis starts an empty Redis without persistence, reached on
	// loopback, and waits until it answers.
	Redis(ctx context.Context) (RedisServer, error)
	// RedisReplica starts an empty Redis without persistence that
	// replicates primary (a server of this Servers' Redis) from its start,
	// and waits until its link to the primary is up.
	RedisReplica(ctx context.Context, primary RedisServer) (RedisServer, error)
	// Sentinel starts a Redis Sentinel monitoring primary (a server of
	// this Servers' Redis) under the name master, with a quorum of 2,
	// down-after-milliseconds 1000, failover-timeout 5000 and
	// parallel-syncs 1, and waits until it answers. The addresses it hands
	// out (of the primary, of the replicas it promotes) must be the ones
	// the caller reaches them on: their Addr.
	Sentinel(ctx context.Context, master string, primary RedisServer) (SentinelServer, error)
	// Postgres starts a PostgreSQL with settings (name=value) and waits
	// until it accepts connections. Its database postgres, user postgres,
	// needs no password.
	Postgres(ctx context.Context, settings ...string) (PostgresServer, error)
	// PostgresStandby starts a streaming standby of primary (a server of
	// this Servers' Postgres) from a base backup of it (pg_basebackup -R),
	// named "standby" (application_name), with the primary's settings but
	// synchronous_standby_names, and waits until it accepts connections.
	// A primary started with synchronous_standby_names='*' commits only
	// once the standby has its WAL.
	PostgresStandby(ctx context.Context, primary PostgresServer) (PostgresStandby, error)
	// ReachLoopback returns nil when its servers reach the caller's
	// loopback addresses, where the suite's fault proxies listen (the
	// replication link of redis-failover and split-brain); else an error
	// wrapping [ErrServersUnsupported].
	ReachLoopback() error
}

// ErrServersUnsupported is wrapped by a [Servers] method that cannot start
// what it is asked for on its servers (the runner's containers on Docker's
// bridge network, for Sentinels): the scenario that asked is skipped, with
// the error as its reason.
var ErrServersUnsupported = errors.New("chaos: not on these servers")

// RedisServer is a Redis of a scenario's own.
type RedisServer interface {
	// Addr is its host:port, the same after Restart.
	Addr() string
	// Restart stops it and starts it again, empty, on the same address,
	// and waits until it answers.
	Restart() error
	// Crash kills it with SIGKILL and waits until it is gone; it stays
	// down (Restart starts it again, empty).
	Crash() error
	// Pause stops it without killing it (SIGSTOP, a frozen container):
	// connections are accepted and nothing is answered until Resume.
	Pause() error
	// Resume undoes Pause.
	Resume() error
	// Close stops and removes it.
	Close()
}

// SentinelServer is a Redis Sentinel of a scenario's own.
type SentinelServer interface {
	// Addr is its host:port.
	Addr() string
	// Close stops and removes it.
	Close()
}

// PostgresServer is a PostgreSQL of a scenario's own.
type PostgresServer interface {
	// Addr is its host:port, the same after Start.
	Addr() string
	// URL is a connection string for it, the same after Start.
	URL() string
	// Crash kills every server process at once with SIGKILL, as a power
	// loss does; what was written to its files stays.
	Crash() error
	// Start starts it again after Crash, on the same data (it recovers
	// from its WAL), and waits until it accepts connections.
	Start(ctx context.Context) error
	// Close stops and removes it.
	Close()
}

// PostgresStandby is a streaming standby of a scenario's own PostgreSQL.
type PostgresStandby interface {
	PostgresServer
	// Disconnect cuts its streaming for good (primary_conninfo emptied
	// and reloaded), and waits until its WAL receiver is gone: it
	// receives nothing more from its primary.
	Disconnect(ctx context.Context) error
	// Promote promotes it to primary and waits until it accepts writes.
	Promote(ctx context.Context) error
}

// PostgresNode is a PostgreSQL of a scenario's own that changes roles
// again and again, as pg-failover-sync's nodes do (issue 48): a primary
// crashed, a standby promoted, the old primary rejoined as a standby of
// the new one, and back. The process servers' PostgreSQL are; a
// [Servers] whose PostgreSQL (primary and standby alike) do not
// implement it makes pg-failover-sync skip, saying so.
type PostgresNode interface {
	PostgresStandby
	// Rejoin makes it, crashed, a streaming standby of primary (a node of
	// the same Servers): its data replaced by a base backup of primary,
	// started again on the same address, without
	// synchronous_standby_names.
	Rejoin(ctx context.Context, primary PostgresServer) error
	// SetSynchronous makes it, a primary, commit only once a standby has
	// the commit's WAL (on), or alone, and waits until a standby streams
	// from it (a synchronous one with on).
	SetSynchronous(ctx context.Context, on bool) error
	// WaitStandby waits until a standby streams from it, a primary (a
	// synchronous one with sync).
	WaitStandby(ctx context.Context, sync bool) error
}

// asPostgresNode returns s as a PostgresNode when it is one.
func asPostgresNode(s PostgresServer) (PostgresNode, bool) {
	if c, ok := s.(*fault.Cluster); ok {
		return clusterNode{c}, true
	}
	n, ok := s.(PostgresNode)
	return n, ok
}

// clusterNode is a process cluster as a PostgresNode.
type clusterNode struct{ *fault.Cluster }

func (c clusterNode) Rejoin(ctx context.Context, primary PostgresServer) error {
	p, ok := primary.(clusterNode)
	if !ok {
		return fmt.Errorf("chaos: rejoin as a standby of %T: want a node of the same Servers", primary)
	}
	return c.Cluster.Rejoin(ctx, p.Cluster)
}

// The processes started from the machine's binaries are the servers
// without [Config.Servers].
var (
	_ Servers         = processes{}
	_ RedisServer     = (*redisproc.Server)(nil)
	_ fault.Node      = RedisServer(nil) // a Pair runs on any of them
	_ SentinelServer  = (*sentinelProc)(nil)
	_ PostgresServer  = (*fault.Cluster)(nil)
	_ PostgresStandby = (*fault.Cluster)(nil)
)

// servers returns cfg.Servers when set, else processes.
func (e *env) servers() Servers {
	if e.cfg.Servers != nil {
		return e.cfg.Servers
	}
	return processes{}
}

// ownRedis starts the scenario's own Redis (see [Servers]).
func (e *env) ownRedis(ctx context.Context) (RedisServer, error) {
	return e.servers().Redis(ctx)
}

// ownPostgres starts the scenario's own PostgreSQL with settings (see
// [Servers]).
func (e *env) ownPostgres(ctx context.Context, settings ...string) (PostgresServer, error) {
	return e.servers().Postgres(ctx, settings...)
}

// processes is the [Servers] of a run without Config.Servers: processes
// from the machine's binaries, on loopback ports (redis-server,
// redis-server --sentinel; initdb, pg_ctl and pg_basebackup in temporary
// directories).
type processes struct{}

func (processes) Redis(context.Context) (RedisServer, error) {
	s, err := redisproc.New(redisproc.Options{})
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (processes) RedisReplica(ctx context.Context, primary RedisServer) (RedisServer, error) {
	s, err := redisproc.New(redisproc.Options{ReplicaOf: primary.Addr()})
	if err != nil {
		return nil, err
	}
	if err := s.WaitLinked(ctx, 10*time.Second); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (processes) Sentinel(_ context.Context, master string, primary RedisServer) (SentinelServer, error) {
	return startSentinel(master, primary.Addr())
}

func (processes) Postgres(ctx context.Context, settings ...string) (PostgresServer, error) {
	c, err := fault.NewCluster(ctx, settings...)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (processes) PostgresStandby(ctx context.Context, primary PostgresServer) (PostgresStandby, error) {
	p, ok := primary.(*fault.Cluster)
	if !ok {
		return nil, fmt.Errorf("chaos: a standby of %T: want a primary of the same Servers", primary)
	}
	s, err := p.Standby(ctx)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (processes) ReachLoopback() error { return nil }

// sentinelProc is a redis-server --sentinel process on a loopback port,
// its configuration in a temporary directory of its own (Sentinel
// rewrites it).
type sentinelProc struct {
	addr string
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// startSentinel starts a sentinel monitoring primary under the name
// master (quorum 2), and waits until it answers.
func startSentinel(master, primary string) (*sentinelProc, error) {
	bin, err := redisproc.Binary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "oncekey-sentinel-")
	if err != nil {
		return nil, err
	}
	port, err := loopback.FreePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	host, pport, _ := net.SplitHostPort(primary)
	conf := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\nlogfile %s\n"+
		"sentinel monitor %s %s %s 2\nsentinel down-after-milliseconds %s 1000\n"+
		"sentinel failover-timeout %s 5000\nsentinel parallel-syncs %s 1\n",
		port, dir, filepath.Join(dir, "sentinel.log"), master, host, pport, master, master, master)
	cf := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	cmd := exec.Command(bin, cf, "--sentinel")
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &sentinelProc{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	c := redis.NewSentinelClient(&redis.Options{Addr: s.addr})
	defer c.Close()
	for range 200 {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err = c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return s, nil
		}
		time.Sleep(25 * time.Millisecond)
	}
	s.Close()
	return nil, fmt.Errorf("sentinel on %s did not answer: %w", s.addr, err)
}

// Addr is its host:port.
func (s *sentinelProc) Addr() string { return s.addr }

// Close kills it and removes its directory.
func (s *sentinelProc) Close() {
	_ = s.cmd.Process.Kill()
	<-s.done
	os.RemoveAll(s.dir)
}
