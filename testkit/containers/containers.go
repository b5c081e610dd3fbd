// Package containers starts disposable PostgreSQL, Redis, NATS and
// RabbitMQ servers in containers with testcontainers-go, for oncekey's
// tests and chaos runner on a machine that has Docker and nothing else.
// Besides one shared container per service ([Set.URL]), it starts servers
// of their own that a chaos scenario restarts, kills with SIGKILL and
// starts again, or freezes, through the container API ([Set.NewRedis],
// [Set.NewPostgres], [Server]), and replicates: a Redis replica
// ([Set.NewRedisReplica]), Redis Sentinels ([Set.NewSentinel]), a
// PostgreSQL streaming standby made with pg_basebackup
// ([Set.NewPostgresStandby]), disconnected and promoted
// ([Server.Disconnect], [Server.Promote]).
//
// It is a module of its own (github.com/oncekey/oncekey/testkit/containers)
// so that testcontainers and the Docker client never enter the module graph
// of the library: the root module does not require it. The tests reach it
// through the oncekey-containers command (cmd/oncekey-containers), which
// testkit/testenv runs as a subprocess when no URL is set and Docker
// answers; the chaos runner (a tool module) imports it for -containers.
//
// # Images
//
// The public images by default (postgres:15-alpine, redis:7-alpine,
// nats:2-alpine, rabbitmq:3-alpine), or the ones named by
// ONCEKEY_POSTGRES_IMAGE, ONCEKEY_REDIS_IMAGE, ONCEKEY_NATS_IMAGE and
// ONCEKEY_RABBITMQ_IMAGE: .ci/containers imports images of its own from
// the machine's binaries, since no registry is reachable there. A
// PostgreSQL image must take the official image's interface (POSTGRES_DB,
// POSTGRES_HOST_AUTH_METHOD, a command starting with "postgres"; the data
// in the container's filesystem, so that it survives a kill and a start),
// a NATS image nats-server as its entrypoint, a RabbitMQ image the
// command "rabbitmq-server" and the official image's environment
// (RABBITMQ_NODE_PORT, RABBITMQ_NODE_IP_ADDRESS, RABBITMQ_DIST_PORT,
// RABBITMQ_NODENAME, ERL_EPMD_PORT, ERL_EPMD_ADDRESS,
// RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS) with the user guest.
//
// # Networks
//
// By default each container publishes its port on a random host port
// (Docker's bridge network), a [Server] on a free host port picked when
// it is created, which it keeps across a restart. With
// ONCEKEY_CONTAINERS_NETWORK=host (or [Options.HostNetwork]) the
// containers share the daemon's network namespace and listen on 127.0.0.1
// at a free port picked here: for a daemon run with --bridge=none inside a
// network namespace of its own, with the tests in the same namespace
// (.ci/containers).
//
// A replica or a standby reaches its primary at the primary's own address
// on the host network, at its container's IP on the bridge network.
// Sentinels need the host network ([ErrNeedsHostNetwork]): the addresses
// they hand out must be the ones their clients reach.
package containers

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/redis/go-redis/v9"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
)

// Default images, used when the environment names none.
const (
	DefaultPostgresImage = "postgres:15-alpine"
	DefaultRedisImage    = "redis:7-alpine"
	DefaultNATSImage     = "nats:2-alpine"
	DefaultRabbitMQImage = "rabbitmq:3-alpine"
)

// Service names a server this package starts.
type Service string

// The services.
const (
	Postgres Service = "postgres"
	Redis    Service = "redis"
	NATS     Service = "nats"
	RabbitMQ Service = "rabbitmq"
)

// Env is the environment variable through which the tests find the
// service: DATABASE_URL, REDIS_URL, NATS_URL or AMQP_URL.
func (s Service) Env() string {
	switch s {
	case Postgres:
		return "DATABASE_URL"
	case Redis:
		return "REDIS_URL"
	case NATS:
		return "NATS_URL"
	case RabbitMQ:
		return "AMQP_URL"
	}
	return ""
}

// ParseService returns the service named s ("postgres", "redis", "nats",
// "rabbitmq").
func ParseService(s string) (Service, error) {
	switch v := Service(strings.TrimSpace(s)); v {
	case Postgres, Redis, NATS, RabbitMQ:
		return v, nil
	}
	return "", fmt.Errorf("containers: unknown service %q (want postgres, redis, nats or rabbitmq)", s)
}

// Options configure a [Set].
type Options struct {
	// HostNetwork runs the containers in the daemon's network namespace,
	// listening on 127.0.0.1. Defaults to ONCEKEY_CONTAINERS_NETWORK=host.
	HostNetwork bool
	// PostgresImage, RedisImage, NATSImage and RabbitMQImage default to
	// $ONCEKEY_POSTGRES_IMAGE (etc.), else the Default*Image constants.
	PostgresImage, RedisImage, NATSImage, RabbitMQImage string
	// PostgresSettings are extra server settings (name=value, passed as
	// -c).
	PostgresSettings []string
	// Log gets a line per container started and stopped, and
	// testcontainers' own lines. Defaults to os.Stderr.
	Log io.Writer
	// Ready bounds the wait for a server to answer. Defaults to 2 minutes.
	Ready time.Duration
}

// FromEnv returns the options the environment sets.
func FromEnv() Options {
	return Options{HostNetwork: os.Getenv("ONCEKEY_CONTAINERS_NETWORK") == "host"}
}

func (o Options) normalized() Options {
	if o.PostgresImage == "" {
		o.PostgresImage = envOr("ONCEKEY_POSTGRES_IMAGE", DefaultPostgresImage)
	}
	if o.RedisImage == "" {
		o.RedisImage = envOr("ONCEKEY_REDIS_IMAGE", DefaultRedisImage)
	}
	if o.NATSImage == "" {
		o.NATSImage = envOr("ONCEKEY_NATS_IMAGE", DefaultNATSImage)
	}
	if o.RabbitMQImage == "" {
		o.RabbitMQImage = envOr("ONCEKEY_RABBITMQ_IMAGE", DefaultRabbitMQImage)
	}
	if o.Log == nil {
		o.Log = os.Stderr
	}
	if o.Ready == 0 {
		o.Ready = 2 * time.Minute
	}
	return o
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Set is the containers started for one test binary or one chaos run:
// at most one of each service, started on demand by [Set.URL]. Close
// removes them.
type Set struct {
	opts Options

	mu     sync.Mutex
	urls   map[Service]string
	ctrs   map[Service]testcontainers.Container
	own    map[testcontainers.Container]string // the [Server]s, by what they are ("postgres standby")
	closed bool
}

// New returns an empty Set; nothing starts until [Set.URL].
func New(o Options) *Set {
	o = o.normalized()
	tclog.SetDefault(logger{o.Log})
	return &Set{opts: o, urls: map[Service]string{}, ctrs: map[Service]testcontainers.Container{},
		own: map[testcontainers.Container]string{}}
}

type logger struct{ w io.Writer }

func (l logger) Printf(format string, v ...any) {
	fmt.Fprintf(l.w, "testcontainers: "+strings.TrimSuffix(format, "\n")+"\n", v...)
}

// URL returns the URL of the service, starting its container the first
// time and waiting until the server answers.
func (s *Set) URL(ctx context.Context, svc Service) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", errors.New("containers: set closed")
	}
	if u, ok := s.urls[svc]; ok {
		return u, nil
	}
	var (
		u   string
		c   testcontainers.Container
		err error
	)
	switch svc {
	case Postgres:
		c, u, err = s.postgres(ctx, false)
	case Redis:
		c, u, err = s.redis(ctx, false)
	case NATS:
		c, u, err = s.nats(ctx)
	case RabbitMQ:
		c, u, err = s.rabbitmq(ctx)
	default:
		return "", fmt.Errorf("containers: unknown service %q", svc)
	}
	if c != nil {
		s.ctrs[svc] = c
	}
	if err != nil {
		return "", fmt.Errorf("containers: %s: %w", svc, err)
	}
	s.urls[svc] = u
	fmt.Fprintf(s.opts.Log, "containers: %s at %s (container %.12s)\n", svc, u, c.GetContainerID())
	return u, nil
}

// Close stops and removes every container of the set, the [Server]s
// too.
func (s *Set) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	var errs []error
	for svc, c := range s.ctrs {
		if err := c.Terminate(context.Background()); err != nil {
			errs = append(errs, fmt.Errorf("containers: remove %s: %w", svc, err))
			continue
		}
		fmt.Fprintf(s.opts.Log, "containers: %s removed\n", svc)
	}
	for c, what := range s.own {
		if err := c.Terminate(context.Background()); err != nil {
			errs = append(errs, fmt.Errorf("containers: remove %s of its own: %w", what, err))
			continue
		}
		fmt.Fprintf(s.opts.Log, "containers: %s of its own removed\n", what)
	}
	clear(s.ctrs)
	clear(s.own)
	clear(s.urls)
	return errors.Join(errs...)
}

// HostNetwork reports whether the containers run on the daemon's network
// ([Options.HostNetwork]): they then reach the host's loopback addresses,
// and the host reaches them at the same addresses they reach each other
// at.
func (s *Set) HostNetwork() bool { return s.opts.HostNetwork }

// Container returns the service's container once started (for a test
// that restarts or kills it), or nil.
func (s *Set) Container(svc Service) testcontainers.Container {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctrs[svc]
}

// endpoint is where a server listens inside its container and where the
// host reaches it.
type endpoint struct {
	listen string // the address the server binds, "" for every one
	port   string // the port the server listens on in the container
}

// plan returns the server's endpoint: in host mode a free loopback port
// of the namespace, otherwise the service's usual port, published.
func (s *Set) plan(usual string) (endpoint, error) {
	if !s.opts.HostNetwork {
		return endpoint{port: usual}, nil
	}
	p, err := freePort()
	if err != nil {
		return endpoint{}, err
	}
	return endpoint{listen: "127.0.0.1", port: strconv.Itoa(p)}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Set) request(image string, ep endpoint, env map[string]string, entrypoint []string, cmd ...string) testcontainers.GenericContainerRequest {
	req := testcontainers.ContainerRequest{
		Image:      image,
		Env:        env,
		Entrypoint: entrypoint,
		Cmd:        cmd,
		Labels:     map[string]string{"org.oncekey.containers": "1"},
	}
	if s.opts.HostNetwork {
		req.HostConfigModifier = func(hc *container.HostConfig) { hc.NetworkMode = "host" }
		// testcontainers attaches every container to its default network
		// (reaper_default when the daemon has no bridge, as with
		// --bridge=none): a container on the host's network must have no
		// other endpoint.
		req.EndpointSettingsModifier = func(m map[string]*network.EndpointSettings) { clear(m) }
	} else {
		req.ExposedPorts = []string{ep.port + "/tcp"}
	}
	return testcontainers.GenericContainerRequest{ContainerRequest: req, Started: true}
}

// start starts req and returns the host:port the host reaches it on.
func (s *Set) start(ctx context.Context, req testcontainers.GenericContainerRequest, ep endpoint) (testcontainers.Container, string, error) {
	c, err := testcontainers.GenericContainer(ctx, req)
	if err != nil {
		return c, "", err
	}
	if s.opts.HostNetwork {
		return c, net.JoinHostPort("127.0.0.1", ep.port), nil
	}
	host, err := c.Host(ctx)
	if err != nil {
		return c, "", err
	}
	mp, err := c.MappedPort(ctx, ep.port+"/tcp")
	if err != nil {
		return c, "", err
	}
	return c, net.JoinHostPort(host, mp.Port()), nil
}

// launch starts req, a server listening at ep, and waits until ping
// answers at the host:port the host reaches it on; the URL it returns is
// urlFormat with that host:port. own fixes its host port (see [Server]).
func (s *Set) launch(ctx context.Context, req testcontainers.GenericContainerRequest, ep endpoint, own bool, urlFormat string, ping func(ctx context.Context, addr string) error) (testcontainers.Container, string, error) {
	if own && !s.opts.HostNetwork {
		if err := fixedHostPort(&req, ep.port); err != nil {
			return nil, "", err
		}
	}
	c, addr, err := s.start(ctx, req, ep)
	if err != nil {
		return c, "", err
	}
	err = s.await(ctx, c, func(ctx context.Context) error { return ping(ctx, addr) })
	return c, fmt.Sprintf(urlFormat, addr), err
}

// await calls ping until it succeeds, the container stops, or the
// deadline; the error carries the end of the container's log.
func (s *Set) await(ctx context.Context, c testcontainers.Container, ping func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Ready)
	defer cancel()
	var last error
	for {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		last = ping(pctx)
		pcancel()
		if last == nil {
			return nil
		}
		if st, err := c.State(ctx); err == nil && !st.Running {
			return fmt.Errorf("container exited (%d) before answering: %w%s", st.ExitCode, last, tail(c))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not answering after %v: %w%s", s.opts.Ready, last, tail(c))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// tail returns the end of the container's log, for an error.
func tail(c testcontainers.Container) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := c.Logs(ctx)
	if err != nil {
		return ""
	}
	defer r.Close()
	var lines []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 20 {
			lines = lines[1:]
		}
	}
	if len(lines) == 0 {
		return ""
	}
	return "\ncontainer log (end):\n" + strings.Join(lines, "\n")
}

// postgres starts a PostgreSQL with the Set's settings and more; own
// fixes its host port (see [Server]).
func (s *Set) postgres(ctx context.Context, own bool, more ...string) (testcontainers.Container, string, error) {
	ep, err := s.plan("5432")
	if err != nil {
		return nil, "", err
	}
	env := map[string]string{"POSTGRES_DB": "test", "POSTGRES_HOST_AUTH_METHOD": "trust"}
	req := s.request(s.opts.PostgresImage, ep, env, nil, postgresCmd(ep, append(slices.Clone(s.opts.PostgresSettings), more...))...)
	return s.startPostgres(ctx, req, ep, own)
}

// postgresCmd is the command of a PostgreSQL listening at ep with
// settings.
func postgresCmd(ep endpoint, settings []string) []string {
	// On the bridge network, every address of the container (the
	// official image listens on all already; one whose initdb default is
	// localhost would answer neither the published port nor a standby).
	listen := cmp.Or(ep.listen, "*")
	cmd := []string{"postgres", "-p", ep.port, "-c", "max_connections=200", "-c", "listen_addresses=" + listen}
	for _, v := range settings {
		cmd = append(cmd, "-c", v)
	}
	return cmd
}

// startPostgres starts req, a PostgreSQL listening at ep, and waits until
// it accepts connections; own fixes its host port (see [Server]).
func (s *Set) startPostgres(ctx context.Context, req testcontainers.GenericContainerRequest, ep endpoint, own bool) (testcontainers.Container, string, error) {
	return s.launch(ctx, req, ep, own, postgresURL, pingPostgres)
}

// postgresURL is the format of the URL of the PostgreSQL at an address.
const postgresURL = "postgres://postgres@%s/test?sslmode=disable"

func pingPostgres(ctx context.Context, addr string) error {
	conn, err := pgx.Connect(ctx, fmt.Sprintf(postgresURL, addr))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.Ping(ctx)
}

// urlAddr is the host:port of a URL made by [Set.launch].
func urlAddr(u string) string {
	pu, err := url.Parse(u)
	if err != nil {
		return ""
	}
	return pu.Host
}

// redis starts a Redis without persistence, with more arguments; own
// fixes its host port (see [Server]) and lets a replica attaching to it
// sync at once (no wait for more replicas).
func (s *Set) redis(ctx context.Context, own bool, more ...string) (testcontainers.Container, string, error) {
	ep, err := s.plan("6379")
	if err != nil {
		return nil, "", err
	}
	cmd := []string{"redis-server", "--port", ep.port, "--save", "", "--appendonly", "no"}
	if ep.listen != "" {
		cmd = append(cmd, "--bind", ep.listen)
	} else {
		cmd = append(cmd, "--protected-mode", "no")
	}
	if own {
		cmd = append(cmd, "--repl-diskless-sync-delay", "0")
	}
	cmd = append(cmd, more...)
	return s.launch(ctx, s.request(s.opts.RedisImage, ep, nil, nil, cmd...), ep, own, "redis://%s/0", pingRedis)
}

func pingRedis(ctx context.Context, addr string) error {
	rc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rc.Close()
	return rc.Ping(ctx).Err()
}

func (s *Set) nats(ctx context.Context) (testcontainers.Container, string, error) {
	ep, err := s.plan("4222")
	if err != nil {
		return nil, "", err
	}
	cmd := []string{"-js", "-sd", "/tmp/nats", "-p", ep.port}
	if ep.listen != "" {
		cmd = append(cmd, "-a", ep.listen)
	}
	return s.launch(ctx, s.request(s.opts.NATSImage, ep, nil, nil, cmd...), ep, false, "nats://%s", pingNATS)
}

// dial connects to addr over TCP, ctx's deadline the connection's.
func dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	return conn, nil
}

// pingNATS expects the INFO line the server greets every connection with.
func pingNATS(ctx context.Context, addr string) error {
	conn, err := dial(ctx, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "INFO ") {
		return fmt.Errorf("unexpected greeting %q", line)
	}
	return nil
}
