package containers

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strconv"

	"github.com/testcontainers/testcontainers-go"
)

// rabbitmq starts a RabbitMQ. In host mode every port it opens is a free
// loopback port picked here: AMQP, Erlang distribution and epmd (each
// container its own epmd), the node named rabbit@localhost, so that two
// brokers can share the namespace and nothing listens beyond loopback.
func (s *Set) rabbitmq(ctx context.Context) (testcontainers.Container, string, error) {
	ep, err := s.plan("5672")
	if err != nil {
		return nil, "", err
	}
	env := map[string]string{}
	if ep.listen != "" {
		dist, err := freePort()
		if err != nil {
			return nil, "", err
		}
		epmd, err := freePort()
		if err != nil {
			return nil, "", err
		}
		env = map[string]string{
			"RABBITMQ_NODE_PORT":       ep.port,
			"RABBITMQ_NODE_IP_ADDRESS": ep.listen,
			"RABBITMQ_DIST_PORT":       strconv.Itoa(dist),
			"RABBITMQ_NODENAME":        "rabbit@localhost",
			"ERL_EPMD_PORT":            strconv.Itoa(epmd),
			"ERL_EPMD_ADDRESS":         ep.listen,
			// The distribution listens on loopback only too.
			"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
		}
	}
	return s.launch(ctx, s.request(s.opts.RabbitMQImage, ep, env, nil, "rabbitmq-server"), ep, false, "amqp://guest:guest@%s/", pingAMQP)
}

// pingAMQP opens a connection, sends the AMQP 0-9-1 protocol header and
// expects the broker's Connection.Start (a method frame on channel 0),
// which it sends only once it accepts clients.
func pingAMQP(ctx context.Context, addr string) error {
	conn, err := dial(ctx, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("AMQP\x00\x00\x09\x01")); err != nil {
		return err
	}
	var hdr [7]byte
	if _, err := io.ReadFull(bufio.NewReader(conn), hdr[:]); err != nil {
		return err
	}
	if hdr[0] != 1 || hdr[1] != 0 || hdr[2] != 0 {
		return fmt.Errorf("unexpected AMQP frame header % x", hdr)
	}
	return nil
}
