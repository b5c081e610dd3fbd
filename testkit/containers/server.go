package containers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
)

// Server is a container of its own, apart from the Set's shared services
// (see [Set.URL]): a server a test or a chaos scenario restarts, or kills
// and starts again, through the container API. It keeps its address
// across those: in host mode the server's own port, otherwise a host port
// fixed when the container is created (a port Docker picks would change
// at every start). [Set.Close] removes it if [Server.Close] did not.
type Server struct {
	set  *Set
	svc  Service
	what string // "postgres", "postgres standby", "redis replica", "redis sentinel": for the log
	c    testcontainers.Container
	addr string // host:port, as the host reaches it
	url  string
	ping func(context.Context) error
	// settings are a PostgreSQL's own settings (NewPostgres's), which its
	// standbys take.
	settings []string
}

// Addr is the host:port the server answers on, the same after a restart.
func (sv *Server) Addr() string { return sv.addr }

// URL is the server's URL (redis://... or postgres://...).
func (sv *Server) URL() string { return sv.url }

// ContainerID is the container's ID.
func (sv *Server) ContainerID() string { return sv.c.GetContainerID() }

// NewRedis starts a Redis of its own, without persistence (no RDB, no
// AOF): a restart brings it back empty, the way a crashed cache node comes
// back. It waits until it answers PING.
func (s *Set) NewRedis(ctx context.Context) (*Server, error) {
	return s.newServer(ctx, Redis, "redis", nil, func(ctx context.Context) (testcontainers.Container, string, error) {
		return s.redis(ctx, true)
	})
}

// NewPostgres starts a PostgreSQL of its own with settings (name=value,
// passed as -c, after the Set's own), database "test" as user postgres,
// and waits until it accepts connections. Its data lives in the
// container (its filesystem, or the anonymous volume of an image that
// declares one), so it survives [Server.Kill] and [Server.Start].
func (s *Set) NewPostgres(ctx context.Context, settings ...string) (*Server, error) {
	return s.newServer(ctx, Postgres, "postgres", settings, func(ctx context.Context) (testcontainers.Container, string, error) {
		return s.postgres(ctx, true, settings...)
	})
}

func (s *Set) newServer(ctx context.Context, svc Service, what string, settings []string, start func(context.Context) (testcontainers.Container, string, error)) (*Server, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, errors.New("containers: set closed")
	}
	c, u, err := start(ctx)
	if c != nil {
		s.mu.Lock()
		s.own[c] = what
		s.mu.Unlock()
	}
	sv := &Server{set: s, svc: svc, what: what, c: c, url: u, settings: settings}
	if err != nil {
		if c != nil {
			sv.Close()
		}
		return nil, fmt.Errorf("containers: %s of its own: %w", what, err)
	}
	switch svc {
	case Redis:
		sv.addr = urlAddr(u)
		sv.ping = func(ctx context.Context) error { return pingRedis(ctx, sv.addr) }
	case Postgres:
		sv.addr = urlAddr(u)
		sv.ping = func(ctx context.Context) error { return pingPostgres(ctx, sv.addr) }
	}
	fmt.Fprintf(s.opts.Log, "containers: %s of its own at %s (container %.12s)\n", what, u, c.GetContainerID())
	return sv, nil
}

// peer returns the host:port at which the other containers of the Set
// reach the server: its own address on the host's network, its
// container's IP and the server's port in the container on Docker's
// bridge network (looked up now: a container restarted may get another
// IP).
func (sv *Server) peer(ctx context.Context) (string, error) {
	if sv.set.opts.HostNetwork {
		return sv.addr, nil
	}
	ip, err := sv.c.ContainerIP(ctx)
	if err != nil {
		return "", fmt.Errorf("containers: %s: container IP: %w", sv.what, err)
	}
	if ip == "" {
		return "", fmt.Errorf("containers: %s: its container has no IP on a single network", sv.what)
	}
	port := "6379"
	if sv.svc == Postgres {
		port = "5432"
	}
	return net.JoinHostPort(ip, port), nil
}

// Restart stops the container (SIGTERM, then SIGKILL after timeout),
// starts it again, and waits until the server answers.
func (sv *Server) Restart(ctx context.Context, timeout time.Duration) error {
	if err := sv.c.Stop(ctx, &timeout); err != nil {
		return fmt.Errorf("containers: restart %s: %w", sv.what, err)
	}
	if err := sv.Start(ctx); err != nil {
		return err
	}
	fmt.Fprintf(sv.set.opts.Log, "containers: %s of its own restarted at %s\n", sv.what, sv.addr)
	return nil
}

// Kill sends SIGKILL to the container's main process through the
// container API and waits until the container is stopped: every process
// of the container dies with it at once, as in a power loss. The
// container, and what its server wrote to its filesystem, stay; [Server.Start]
// starts it again.
func (sv *Server) Kill(ctx context.Context) error {
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return fmt.Errorf("containers: kill %s: %w", sv.what, err)
	}
	defer cli.Close()
	if _, err := cli.ContainerKill(ctx, sv.c.GetContainerID(), client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		return fmt.Errorf("containers: kill %s: %w", sv.what, err)
	}
	for {
		st, err := sv.c.State(ctx)
		if err != nil {
			return fmt.Errorf("containers: kill %s: %w", sv.what, err)
		}
		if !st.Running && !st.Restarting {
			fmt.Fprintf(sv.set.opts.Log, "containers: %s of its own killed (SIGKILL, exit code %d)\n", sv.what, st.ExitCode)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("containers: kill %s: still running: %w", sv.what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Pause freezes every process of the container (docker pause: the
// cgroup freezer, as SIGSTOP to each): connections are accepted by the
// kernel and nothing is answered until [Server.Unpause].
func (sv *Server) Pause(ctx context.Context) error {
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return fmt.Errorf("containers: pause %s: %w", sv.what, err)
	}
	defer cli.Close()
	if _, err := cli.ContainerPause(ctx, sv.c.GetContainerID(), client.ContainerPauseOptions{}); err != nil {
		return fmt.Errorf("containers: pause %s: %w", sv.what, err)
	}
	return nil
}

// Unpause resumes a container frozen by [Server.Pause].
func (sv *Server) Unpause(ctx context.Context) error {
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return fmt.Errorf("containers: unpause %s: %w", sv.what, err)
	}
	defer cli.Close()
	if _, err := cli.ContainerUnpause(ctx, sv.c.GetContainerID(), client.ContainerUnpauseOptions{}); err != nil {
		return fmt.Errorf("containers: unpause %s: %w", sv.what, err)
	}
	return nil
}

// Start starts a stopped (or killed) container again and waits until the
// server answers.
func (sv *Server) Start(ctx context.Context) error {
	if err := sv.c.Start(ctx); err != nil {
		return fmt.Errorf("containers: start %s: %w", sv.what, err)
	}
	if err := sv.set.await(ctx, sv.c, sv.ping); err != nil {
		return fmt.Errorf("containers: start %s: %w", sv.what, err)
	}
	return nil
}

// Close removes the container.
func (sv *Server) Close() {
	sv.set.mu.Lock()
	_, ok := sv.set.own[sv.c]
	delete(sv.set.own, sv.c)
	sv.set.mu.Unlock()
	if !ok {
		return // removed by Set.Close
	}
	if err := sv.c.Terminate(context.Background()); err != nil {
		fmt.Fprintf(sv.set.opts.Log, "containers: remove %s of its own: %v\n", sv.what, err)
		return
	}
	fmt.Fprintf(sv.set.opts.Log, "containers: %s of its own removed\n", sv.what)
}

// fixedHostPort binds the container's port to a free host port picked
// now, so that the server keeps its address across stops and starts.
func fixedHostPort(req *testcontainers.GenericContainerRequest, port string) error {
	hp, err := freePort()
	if err != nil {
		return err
	}
	p, err := network.ParsePort(port + "/tcp")
	if err != nil {
		return err
	}
	prev := req.HostConfigModifier
	req.HostConfigModifier = func(hc *container.HostConfig) {
		if prev != nil {
			prev(hc)
		}
		if hc.PortBindings == nil {
			hc.PortBindings = network.PortMap{}
		}
		hc.PortBindings[p] = []network.PortBinding{{HostPort: strconv.Itoa(hp)}}
	}
	return nil
}
