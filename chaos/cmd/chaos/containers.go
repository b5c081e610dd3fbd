package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/oncekey/oncekey/testkit/containers"
)

// ctrs are the containers of a -containers run.
type ctrs struct {
	set                      *containers.Set
	redisURL, pgURL, natsURL string
	stderr                   io.Writer
}

// startContainers starts PostgreSQL and Redis, and NATS when the run
// includes nats-windows (scenarios is -scenario: empty for all). RabbitMQ
// has no container: amqp-windows uses -amqp as without -containers.
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
	if scenarios == "" || slices.Contains(strings.Split(scenarios, ","), "nats-windows") {
		if c.natsURL, err = c.set.URL(ctx, containers.NATS); err != nil {
			c.close()
			return nil, fmt.Errorf("chaos: -containers: %w", err)
		}
	}
	fmt.Fprintf(stdout, "chaos: containers: PostgreSQL %s, Redis %s", c.pgURL, c.redisURL)
	if c.natsURL != "" {
		fmt.Fprintf(stdout, ", NATS %s", c.natsURL)
	}
	fmt.Fprintln(stdout)
	return c, nil
}

func (c *ctrs) close() {
	if err := c.set.Close(); err != nil {
		fmt.Fprintln(c.stderr, err)
	}
}
