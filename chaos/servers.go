package chaos

import (
	"context"

	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/testkit/redisproc"
)

// Servers starts the servers of their own that some scenarios restart or
// crash, in place of the processes they start from the machine's
// binaries: the chaos runner's -containers sets one that starts containers
// (see [Config.Servers]). Only redis-restart and pg-crash (and the hazard
// pg-crash-async-commit) use it; the other scenarios that start servers of
// their own start processes as without it.
type Servers interface {
	// Redis starts an empty Redis without persistence, reached on
	// loopback, and waits until it answers.
	Redis(ctx context.Context) (RedisServer, error)
	// Postgres starts a PostgreSQL with settings (name=value) and waits
	// until it accepts connections.
	Postgres(ctx context.Context, settings ...string) (PostgresServer, error)
}

// RedisServer is a Redis of a scenario's own.
type RedisServer interface {
	// Addr is its host:port, the same after Restart.
	Addr() string
	// Restart stops it and starts it again, empty, on the same address,
	// and waits until it answers.
	Restart() error
	// Close stops and removes it.
	Close()
}

// PostgresServer is a PostgreSQL of a scenario's own.
type PostgresServer interface {
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

// The processes started from the machine's binaries are the servers
// without [Config.Servers].
var (
	_ RedisServer    = (*redisproc.Server)(nil)
	_ PostgresServer = (*fault.Cluster)(nil)
)

// ownRedis starts the scenario's own Redis: on cfg.Servers when set,
// else a redis-server process.
func (e *env) ownRedis(ctx context.Context) (RedisServer, error) {
	if e.cfg.Servers != nil {
		return e.cfg.Servers.Redis(ctx)
	}
	s, err := redisproc.New(redisproc.Options{})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// ownPostgres starts the scenario's own PostgreSQL with settings: on
// cfg.Servers when set, else a throwaway cluster from the machine's
// binaries (initdb, pg_ctl).
func (e *env) ownPostgres(ctx context.Context, settings ...string) (PostgresServer, error) {
	if e.cfg.Servers != nil {
		return e.cfg.Servers.Postgres(ctx, settings...)
	}
	c, err := fault.NewCluster(ctx, settings...)
	if err != nil {
		return nil, err
	}
	return c, nil
}
