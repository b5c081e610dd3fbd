package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/oncekey/oncekey/chaos"
	"github.com/oncekey/oncekey/testkit/containers"
)

// ctrs are the containers of a -containers run.
type ctrs struct {
	set                      *containers.Set
	redisURL, pgURL, natsURL string
	amqpURL                  string
	stderr                   io.Writer
}

// startContainers starts PostgreSQL and Redis, NATS when the run includes
// nats-windows, RabbitMQ when it includes amqp-windows (scenarios is
// -scenario: empty for all). The own servers of redis-restart,
// redis-sentinel, pg-crash and pg-failover-sync are containers of the set
// too (see servers), started by their scenarios.
func startContainers(ctx context.Context, stdout, stderr io.Writer, scenarios string) (*ctrs, error) {
	o := containers.FromEnv()
	o.Log = stderr
	c := &ctrs{set: containers.New(o), stderr: stderr}
	var err error
	if c.pgURL, err = c.set.URL(ctx, containers.Postgres); err != nil {
		c.close()
		return nil, fmt.Errorf("chaos: -containers: %w", err)
	}
	if c.redisURL, err = c.set.URL(ctx, containers.Redis); err != nil {
		c.close()
		return nil, fmt.Errorf("chaos: -containers: %w", err)
	}
	runs := func(name string) bool {
		return scenarios == "" || slices.Contains(strings.Split(scenarios, ","), name)
	}
	if runs("nats-windows") {
		if c.natsURL, err = c.set.URL(ctx, containers.NATS); err != nil {
			c.close()
			return nil, fmt.Errorf("chaos: -containers: %w", err)
		}
	}
	if runs("amqp-windows") {
		if c.amqpURL, err = c.set.URL(ctx, containers.RabbitMQ); err != nil {
			c.close()
			return nil, fmt.Errorf("chaos: -containers: %w", err)
		}
	}
	fmt.Fprintf(stdout, "chaos: containers: PostgreSQL %s, Redis %s", c.pgURL, c.redisURL)
	if c.natsURL != "" {
		fmt.Fprintf(stdout, ", NATS %s", c.natsURL)
	}
	if c.amqpURL != "" {
		fmt.Fprintf(stdout, ", RabbitMQ %s", c.amqpURL)
	}
	fmt.Fprintln(stdout)
	return c, nil
}

// servers starts the scenarios' own servers (chaos.Servers) as
// containers of the set: redis-restart's Redis (restarted: stop, start),
// redis-sentinel's primary, replica and Sentinels (the primary killed
// with SIGKILL), pg-crash's PostgreSQL (killed with SIGKILL and started
// again), pg-failover-sync's primary (killed) and standby (a container
// made with pg_basebackup -R, disconnected and promoted with SQL), all
// through the container API; redis-failover's and split-brain's pair
// (killed with SIGKILL and restarted, or frozen with docker pause). The
// Sentinels, and the pair's replication link through a fault proxy of
// the runner's, need the host network (ONCEKEY_CONTAINERS_NETWORK=host):
// on Docker's bridge network redis-sentinel, redis-failover and
// split-brain are skipped, saying so.
type servers struct{ set *containers.Set }

var _ chaos.Servers = servers{}

func (s servers) Redis(ctx context.Context) (chaos.RedisServer, error) {
	sv, err := s.set.NewRedis(ctx)
	if err != nil {
		return nil, err
	}
	return redisServer{sv}, nil
}

func (s servers) RedisReplica(ctx context.Context, primary chaos.RedisServer) (chaos.RedisServer, error) {
	p, ok := primary.(redisServer)
	if !ok {
		return nil, fmt.Errorf("chaos: -containers: a replica of %T: want a Redis of the same servers", primary)
	}
	sv, err := s.set.NewRedisReplica(ctx, p.Server)
	if err != nil {
		return nil, err
	}
	return redisServer{sv}, nil
}

func (s servers) Sentinel(ctx context.Context, master string, primary chaos.RedisServer) (chaos.SentinelServer, error) {
	p, ok := primary.(redisServer)
	if !ok {
		return nil, fmt.Errorf("chaos: -containers: a sentinel of %T: want a Redis of the same servers", primary)
	}
	sv, err := s.set.NewSentinel(ctx, p.Server, containers.SentinelOptions{Master: master, Quorum: 2,
		DownAfter: time.Second, FailoverTimeout: 5 * time.Second})
	if errors.Is(err, containers.ErrNeedsHostNetwork) {
		return nil, fmt.Errorf("%w: %w", chaos.ErrServersUnsupported, err)
	}
	if err != nil {
		return nil, err
	}
	return sv, nil
}

func (s servers) Postgres(ctx context.Context, settings ...string) (chaos.PostgresServer, error) {
	sv, err := s.set.NewPostgres(ctx, settings...)
	if err != nil {
		return nil, err
	}
	return pgServer{sv}, nil
}

func (s servers) PostgresStandby(ctx context.Context, primary chaos.PostgresServer) (chaos.PostgresStandby, error) {
	p, ok := primary.(pgServer)
	if !ok {
		return nil, fmt.Errorf("chaos: -containers: a standby of %T: want a PostgreSQL of the same servers", primary)
	}
	sv, err := s.set.NewPostgresStandby(ctx, p.Server)
	if err != nil {
		return nil, err
	}
	return pgServer{sv}, nil
}

// ReachLoopback: containers on the host's network reach the runner's
// loopback addresses (its fault proxies); on Docker's bridge network they
// do not.
func (s servers) ReachLoopback() error {
	if s.set.HostNetwork() {
		return nil
	}
	return fmt.Errorf("%w: containers on Docker's bridge network do not reach the runner's fault proxies on loopback: needs ONCEKEY_CONTAINERS_NETWORK=host", chaos.ErrServersUnsupported)
}

// serverOpTimeout bounds a restart, a kill or a start of a container.
const serverOpTimeout = 2 * time.Minute

type redisServer struct{ *containers.Server }

// Restart stops the container (SIGTERM; Redis without persistence exits
// at once, SIGKILL after 5s) and starts it again: empty, same address.
func (r redisServer) Restart() error {
	ctx, cancel := context.WithTimeout(context.Background(), serverOpTimeout)
	defer cancel()
	return r.Server.Restart(ctx, 5*time.Second)
}

// Crash kills the container with SIGKILL: redis-server is its main
// process.
func (r redisServer) Crash() error {
	ctx, cancel := context.WithTimeout(context.Background(), serverOpTimeout)
	defer cancel()
	return r.Kill(ctx)
}

// Pause freezes the container (docker pause).
func (r redisServer) Pause() error {
	ctx, cancel := context.WithTimeout(context.Background(), serverOpTimeout)
	defer cancel()
	return r.Server.Pause(ctx)
}

// Resume thaws it (docker unpause).
func (r redisServer) Resume() error {
	ctx, cancel := context.WithTimeout(context.Background(), serverOpTimeout)
	defer cancel()
	return r.Unpause(ctx)
}

// pgServer is a PostgreSQL container: a primary, or a standby
// (Disconnect and Promote are the container's Server's).
type pgServer struct{ *containers.Server }

// Crash kills the container with SIGKILL: the postmaster is its main
// process, and every other process of the container dies with it.
func (p pgServer) Crash() error {
	ctx, cancel := context.WithTimeout(context.Background(), serverOpTimeout)
	defer cancel()
	return p.Kill(ctx)
}

func (c *ctrs) close() {
	if err := c.set.Close(); err != nil {
		fmt.Fprintln(c.stderr, err)
	}
}
