package main

import (
	"context"
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
// -scenario: empty for all). The own servers of redis-restart and
// pg-crash are containers of the set too (see servers), started by their
// scenarios.
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

// servers starts the own servers of redis-restart and pg-crash as
// containers of the set: Redis restarted and PostgreSQL killed with
// SIGKILL and started again through the container API.
type servers struct{ set *containers.Set }

var _ chaos.Servers = servers{}

func (s servers) Redis(ctx context.Context) (chaos.RedisServer, error) {
	sv, err := s.set.NewRedis(ctx)
	if err != nil {
		return nil, err
	}
	return redisServer{sv}, nil
}

func (s servers) Postgres(ctx context.Context, settings ...string) (chaos.PostgresServer, error) {
	sv, err := s.set.NewPostgres(ctx, settings...)
	if err != nil {
		return nil, err
	}
	return pgServer{sv}, nil
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
