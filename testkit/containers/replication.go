package containers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/moby/moby/api/types/container"
	"github.com/redis/go-redis/v9"
	"github.com/testcontainers/testcontainers-go"
	tcexec "github.com/testcontainers/testcontainers-go/exec"
)

// ErrNeedsHostNetwork is returned (wrapped) by [Set.NewSentinel] on
// Docker's bridge network. A Sentinel hands its clients the addresses it
// monitors, which there are container IPs and ports in the containers,
// while the host reaches each container on a published port of its own:
// the host network (ONCEKEY_CONTAINERS_NETWORK=host, [Options.HostNetwork])
// has one address per server, the same for the host and every container.
var ErrNeedsHostNetwork = errors.New("containers: needs ONCEKEY_CONTAINERS_NETWORK=host (Sentinels on Docker's bridge network would hand their clients container addresses)")

// NewPostgresStandby starts a streaming standby of primary (a PostgreSQL
// of [Set.NewPostgres]) in a container of its own: its data is a base
// backup of the primary (pg_basebackup -R -X stream, run in the container
// as user postgres at its first start, into $PGDATA/standby), its
// settings the primary's without synchronous_standby_names (once
// promoted it has no standby, and would wait for one forever), its
// application_name "standby". A primary with
// synchronous_standby_names='*' (or naming it) has it as its synchronous
// standby. It waits until the standby accepts connections and its WAL
// receiver streams. The primary is given a pg_hba.conf line that lets
// every host replicate (trust, as the Set's PostgreSQL trusts every
// host), then reloaded. The image must have sh and pg_basebackup on its
// PATH (the official one does). Kill and Start keep its data: it starts
// again as a standby, without a new base backup.
func (s *Set) NewPostgresStandby(ctx context.Context, primary *Server) (*Server, error) {
	if primary == nil || primary.svc != Postgres || primary.what != "postgres" {
		return nil, errors.New("containers: a standby needs a primary of NewPostgres")
	}
	if err := primary.allowReplication(ctx); err != nil {
		return nil, err
	}
	src, err := primary.peer(ctx)
	if err != nil {
		return nil, err
	}
	host, port, _ := net.SplitHostPort(src)
	settings := withoutSyncStandbys(primary.settings)
	sv, err := s.newServer(ctx, Postgres, "postgres standby", settings, func(ctx context.Context) (testcontainers.Container, string, error) {
		ep, err := s.plan("5432")
		if err != nil {
			return nil, "", err
		}
		more := postgresCmd(ep, withoutSyncStandbys(append(slices.Clone(s.opts.PostgresSettings), settings...)))[1:] // without "postgres"
		// $1 and $2: the primary; the rest: postgres's arguments.
		// The data goes to a new directory, which pg_basebackup creates
		// with the mode postgres wants (the image's data directory may
		// not have it, and the image may have no chmod: sh builtins
		// only).
		const script = `set -e
D=${PGDATA:-/var/lib/postgresql/data}/standby
if [ ! -s "$D/PG_VERSION" ]; then
	pg_basebackup -D "$D" -R -X stream -c fast -d "host=$1 port=$2 user=postgres application_name=standby"
fi
shift 2
exec postgres -D "$D" "$@"`
		req := s.request(s.opts.PostgresImage, ep, nil, []string{"/bin/sh", "-c", script, "sh"}, append([]string{host, port}, more...)...)
		req.ConfigModifier = func(c *container.Config) { c.User = "postgres" }
		return s.startPostgres(ctx, req, ep, true)
	})
	if err != nil {
		return nil, err
	}
	if err := sv.awaitStreaming(ctx); err != nil {
		sv.Close()
		return nil, err
	}
	return sv, nil
}

// allowReplication appends "host replication all all trust" to the
// primary's pg_hba.conf (in its container) and reloads it: the initdb
// defaults let only loopback replicate, and on Docker's bridge network a
// standby connects from its own container's IP.
func (sv *Server) allowReplication(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, sv.url)
	if err != nil {
		return fmt.Errorf("containers: %s: allow replication: %w", sv.what, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var hba string
	if err := conn.QueryRow(ctx, "SHOW hba_file").Scan(&hba); err != nil {
		return fmt.Errorf("containers: %s: allow replication: %w", sv.what, err)
	}
	code, out, err := sv.c.Exec(ctx, []string{"sh", "-c", `echo "host replication all all trust" >>"$1"`, "sh", hba}, tcexec.Multiplexed())
	if err == nil && code != 0 {
		b, _ := io.ReadAll(out)
		err = fmt.Errorf("exit code %d: %s", code, b)
	}
	if err != nil {
		return fmt.Errorf("containers: %s: allow replication: append to %s: %w", sv.what, hba, err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("containers: %s: allow replication: %w", sv.what, err)
	}
	return nil
}

// awaitStreaming waits until the standby's WAL receiver streams.
func (sv *Server) awaitStreaming(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, sv.set.opts.Ready)
	defer cancel()
	var last error
	for {
		var status string
		last = func() error {
			conn, err := pgx.Connect(ctx, sv.url)
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			err = conn.QueryRow(ctx, "SELECT coalesce((SELECT status FROM pg_stat_wal_receiver), 'no WAL receiver')").Scan(&status)
			if err == nil && status != "streaming" {
				err = fmt.Errorf("WAL receiver: %s", status)
			}
			return err
		}()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("containers: %s: not streaming after %v: %w%s", sv.what, sv.set.opts.Ready, last, tail(sv.c))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Disconnect cuts a standby's streaming (of [Set.NewPostgresStandby]), as
// the process clusters of the chaos suite do: primary_conninfo is emptied
// (ALTER SYSTEM) and the configuration reloaded, so its WAL receiver exits
// and does not come back; it waits until the receiver is gone. (Pausing
// the container is not enough: the WAL already in the socket's buffers is
// still received once it resumes.)
func (sv *Server) Disconnect(ctx context.Context) error {
	if sv.what != "postgres standby" {
		return fmt.Errorf("containers: disconnect: %s is not a standby", sv.what)
	}
	conn, err := pgx.Connect(ctx, sv.url)
	if err != nil {
		return fmt.Errorf("containers: disconnect standby: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, q := range []string{"ALTER SYSTEM SET primary_conninfo = ''", "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("containers: disconnect standby: %s: %w", q, err)
		}
	}
	for {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_wal_receiver").Scan(&n); err != nil {
			return fmt.Errorf("containers: disconnect standby: %w", err)
		}
		if n == 0 {
			fmt.Fprintf(sv.set.opts.Log, "containers: %s of its own disconnected from its primary\n", sv.what)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("containers: disconnect standby: its WAL receiver is still running: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Promote promotes a standby (of [Set.NewPostgresStandby]) to primary with
// pg_promote, which waits (up to 60s) until it accepts writes.
func (sv *Server) Promote(ctx context.Context) error {
	if sv.what != "postgres standby" {
		return fmt.Errorf("containers: promote: %s is not a standby", sv.what)
	}
	conn, err := pgx.Connect(ctx, sv.url)
	if err != nil {
		return fmt.Errorf("containers: promote standby: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&ok); err != nil {
		return fmt.Errorf("containers: promote standby: %w", err)
	}
	if !ok {
		return errors.New("containers: promote standby: not promoted within 60s")
	}
	fmt.Fprintf(sv.set.opts.Log, "containers: %s of its own promoted at %s\n", sv.what, sv.addr)
	return nil
}

// NewRedisReplica starts a Redis of its own, as [Set.NewRedis] does, that
// replicates primary (a Redis of NewRedis) with --replicaof, at every
// start; it waits until its link to the primary is up. (Sentinel's
// REPLICAOF NO ONE lasts until the container's next start.)
func (s *Set) NewRedisReplica(ctx context.Context, primary *Server) (*Server, error) {
	if primary == nil || primary.svc != Redis || primary.what != "redis" {
		return nil, errors.New("containers: a replica needs a primary of NewRedis")
	}
	src, err := primary.peer(ctx)
	if err != nil {
		return nil, err
	}
	host, port, _ := net.SplitHostPort(src)
	sv, err := s.newServer(ctx, Redis, "redis replica", nil, func(ctx context.Context) (testcontainers.Container, string, error) {
		return s.redis(ctx, true, "--replicaof", host, port)
	})
	if err != nil {
		return nil, err
	}
	if err := sv.awaitLinked(ctx); err != nil {
		sv.Close()
		return nil, err
	}
	return sv, nil
}

// awaitLinked waits until a replica reports its link to its primary up.
func (sv *Server) awaitLinked(ctx context.Context) error {
	rc := redis.NewClient(&redis.Options{Addr: sv.addr, MaxRetries: -1})
	defer rc.Close()
	ctx, cancel := context.WithTimeout(ctx, sv.set.opts.Ready)
	defer cancel()
	var last error
	for {
		info, err := rc.Info(ctx, "replication").Result()
		if err == nil && !strings.Contains(info, "master_link_status:up") {
			err = errors.New("master_link_status not up")
		}
		if last = err; last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("containers: %s: link to its primary not up after %v: %w%s", sv.what, sv.set.opts.Ready, last, tail(sv.c))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// SentinelOptions configure a Sentinel of [Set.NewSentinel].
type SentinelOptions struct {
	// Master is the name under which it monitors the primary.
	Master string
	// Quorum is how many Sentinels must agree that the primary is down.
	// Defaults to 2.
	Quorum int
	// DownAfter is how long the primary may not answer before it is
	// down. Defaults to 1s.
	DownAfter time.Duration
	// FailoverTimeout is Sentinel's failover-timeout. Defaults to 5s.
	FailoverTimeout time.Duration
}

// NewSentinel starts a Redis Sentinel (redis-server CONF --sentinel) in a
// container of its own, monitoring primary (a Redis of [Set.NewRedis])
// with o, and waits until it answers PING. Its configuration file is
// written in the container at its first start, in /tmp, where it can
// replace it (Sentinel rewrites it as it learns the other Sentinels and
// the replicas). It needs the host network: on Docker's
// bridge network it returns an error matching [ErrNeedsHostNetwork].
// The image must have sh (the official one does).
func (s *Set) NewSentinel(ctx context.Context, primary *Server, o SentinelOptions) (*Server, error) {
	if !s.opts.HostNetwork {
		return nil, fmt.Errorf("containers: redis sentinel: %w", ErrNeedsHostNetwork)
	}
	if primary == nil || primary.svc != Redis || o.Master == "" {
		return nil, errors.New("containers: a sentinel needs a master name and a Redis to monitor")
	}
	if o.Quorum == 0 {
		o.Quorum = 2
	}
	if o.DownAfter == 0 {
		o.DownAfter = time.Second
	}
	if o.FailoverTimeout == 0 {
		o.FailoverTimeout = 5 * time.Second
	}
	src, err := primary.peer(ctx)
	if err != nil {
		return nil, err
	}
	host, port, _ := net.SplitHostPort(src)
	return s.newServer(ctx, Redis, "redis sentinel", nil, func(ctx context.Context) (testcontainers.Container, string, error) {
		ep, err := s.plan("26379")
		if err != nil {
			return nil, "", err
		}
		conf := fmt.Sprintf("port %s\nbind %s\nprotected-mode no\ndir /tmp\n"+
			"sentinel monitor %[5]s %[3]s %[4]s %[6]d\nsentinel down-after-milliseconds %[5]s %[7]d\n"+
			"sentinel failover-timeout %[5]s %[8]d\nsentinel parallel-syncs %[5]s 1\n",
			ep.port, ep.listen, host, port, o.Master, o.Quorum, o.DownAfter.Milliseconds(), o.FailoverTimeout.Milliseconds())
		// $1: the configuration, written once (a restart keeps what
		// Sentinel rewrote); sh builtins only (the image may have no
		// other tool). It runs as the image's user (root in the
		// official one, whose entrypoint is left out), who can write
		// /tmp, where Sentinel replaces the file as it rewrites it.
		const script = `set -e
[ -s /tmp/sentinel.conf ] || printf '%s' "$1" >/tmp/sentinel.conf
exec redis-server /tmp/sentinel.conf --sentinel`
		req := s.request(s.opts.RedisImage, ep, nil, []string{"/bin/sh", "-c", script, "sh"}, conf)
		return s.launch(ctx, req, ep, false, "redis://%s", pingRedis)
	})
}

// withoutSyncStandbys returns settings without synchronous_standby_names.
func withoutSyncStandbys(settings []string) []string {
	var out []string
	for _, v := range settings {
		if !strings.HasPrefix(v, "synchronous_standby_names=") {
			out = append(out, v)
		}
	}
	return out
}
