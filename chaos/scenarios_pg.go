package chaos

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/testkit/redisproc"
)

// hazards are scenarios that run PostgreSQL configured to lose
// acknowledged commits: negative controls that show the hazard is real and
// that the checker sees it. They run only when named (Config.Scenarios,
// -scenario); a run of every scenario leaves them out, since they must fail.
func hazards() []scenario {
	return append([]scenario{
		{name: "pg-failover-async", forces: "negative control: PostgreSQL primary with an asynchronous streaming standby; the standby's streaming is cut, the primary is SIGKILLed, the standby promoted: acknowledged commits vanish (must be caught)", ownPostgres: true, onServers: true, setup: pgFailover(false)},
		{name: "pg-crash-async-commit", forces: "negative control: PostgreSQL with synchronous_commit=off SIGKILLed mid-load and restarted: acknowledged commits vanish (must be caught)", ownPostgres: true, onServers: true, setup: pgCrash("off")},
	}, patroniHazards()...)
}

// pgRegistry lists the scenarios on throwaway PostgreSQL clusters.
func pgRegistry() []scenario {
	return append([]scenario{
		{name: "pg-failover-sync", forces: "PostgreSQL primary with a synchronous standby (synchronous_standby_names, synchronous_commit=on), failed over and back for the whole run: the standby's streaming cut, the primary SIGKILLed, the standby promoted, the old primary rejoined as its synchronous standby; the library follows through a multi-host connection string with target_session_attrs=read-write", ownPostgres: true, onServers: true, repeats: "primary-killed", setup: pgFailover(true)},
		{name: "pg-network", forces: "latency of twice the lease, and a partition of twice the lease, between one client and PostgreSQL, inside a Do transaction before its commit or between a workflow's effect and its finish, where it lasts until another client, which still reaches the database, has taken the operation over", setup: setupPGNetwork},
		{name: "redis-sentinel", forces: "Redis behind three sentinels, the library on go-redis failover clients; failed over and back for the whole run: the primary SIGKILLed mid-load, the next operations sent into the outage, the replica promoted, the old primary restarted empty and made its replica; the breakers must open, no call may fail, and the claim path must come back on the new primary", ownRedis: true, onServers: true, repeats: "sentinel-failover", setup: setupSentinel},
		{name: "tls", forces: "both stores over TLS verified against a CA made at run time (PostgreSQL ssl=on with sslmode=verify-full, redis-server --tls-port with go-redis TLSConfig); clients trusting another CA are refused", ownRedis: true, ownPostgres: true, setup: setupTLS},
		{name: "pg-crash", forces: "PostgreSQL (synchronous_commit=on) SIGKILLed mid-load, every server process at once, and restarted, again and again for the whole run: it recovers every acknowledged commit", ownPostgres: true, onServers: true, repeats: "postgres-killed", setup: pgCrash("on")},
		{name: "pgbouncer", forces: "every client through PgBouncer 1.18 in transaction pooling mode (query exec mode exec); its server connections terminated mid-transaction and the bouncer SIGKILLed and restarted on the same port, mid-load, again and again for the whole run", needs: pgbouncerInstalled, repeats: "pgbouncer-restarted", setup: setupPgBouncer},
	}, patroniRegistry()...)
}

// onCluster moves the scenario onto a throwaway cluster: its history
// tables, its durable store and the library's pool live there, so that
// what the crash loses is what the checker reads.
func (e *env) onCluster(ctx context.Context, url string) error {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	pcfg.MaxConns = 8
	pcfg.ConnConfig.RuntimeParams["application_name"] = "oncekey-chaos-admin"
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	admin, err := pgxpool.NewWithConfig(pctx, pcfg)
	if err != nil {
		return fmt.Errorf("%w: cluster: %w", ErrSetup, err)
	}
	e.onClose(admin.Close)
	r := *e.runEnv
	r.admin = admin
	r.cfg.PostgresURL = url
	if _, err := admin.Exec(pctx, "CREATE SCHEMA "+r.schema); err != nil {
		return fmt.Errorf("%w: cluster schema: %w", ErrSetup, err)
	}
	if r.tables, err = history.NewTables(r.schema); err == nil {
		err = r.tables.Create(pctx, admin)
	}
	if err == nil {
		err = postgres.Migrate(pctx, admin, postgres.WithSchema(r.schema))
	}
	if err != nil {
		return fmt.Errorf("%w: cluster: %w", ErrSetup, err)
	}
	e.runEnv = &r
	pool, err := e.newPool(ctx, "")
	if err != nil {
		return err
	}
	e.pool = pool
	return nil
}

// pgCrash SIGKILLs every process of a throwaway cluster, running with
// synchronous_commit=sync, a few times while operations run, and restarts
// it. With sync=off the WAL writer waits 10s (wal_writer_delay) before it
// writes the commits that did not wait for it, so each crash loses the
// commits acknowledged in the seconds before it.
func pgCrash(sync string) func(ctx context.Context, e *env) (*workload, error) {
	return func(ctx context.Context, e *env) (*workload, error) {
		c, err := e.ownPostgres(ctx, "synchronous_commit="+sync, "wal_writer_delay=10s",
			"wal_writer_flush_after=1GB", "fsync=on", "max_connections=200")
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSetup, err)
		}
		e.onClose(c.Close)
		if err := e.onCluster(ctx, c.URL()); err != nil {
			return nil, err
		}
		// The durability check must tell the two apart: nothing to report
		// with synchronous_commit=on, the setting to change with off.
		derr := postgres.CheckDurability(ctx, e.pool)
		switch {
		case sync == "on" && derr != nil:
			return nil, fmt.Errorf("%w: %w", ErrSetup, derr)
		case sync != "on" && (!errors.Is(derr, postgres.ErrNotDurable) || !strings.Contains(derr.Error(), "synchronous_commit=off")):
			return nil, fmt.Errorf("%w: CheckDurability on a cluster with synchronous_commit=off = %v, want ErrNotDurable naming it", ErrSetup, derr)
		}
		w, err := e.mixed(ctx, storeOpts{}, nil)
		if err != nil {
			return nil, err
		}
		// Killed and restarted again and again for the whole run (issue
		// 48), at least five times, each kill once the previous restart
		// is done.
		e.expectFaults("postgres-killed", "postgres-restarted")
		cy := e.repeat("postgres-crash", repeatedPlanned(e.cfg.Iterations, 5), 0, 0, func(ctx context.Context, _ int, _ func()) {
			// Let the operations started so far commit and answer.
			time.Sleep(e.cfg.Lease)
			end := e.span("postgres-crash")
			defer end()
			if err := c.Crash(); err != nil {
				e.violation("setup", "", "crash: %v", err)
				return
			}
			e.fault("postgres-killed")
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 90*time.Second)
			defer cancel()
			if err := c.Start(rctx); err != nil {
				e.violation("setup", "", "restart after crash: %v", err)
				return
			}
			e.fault("postgres-restarted")
		})
		w.startOp = cy.start
		return w, nil
	}
}

// pgFailover runs a primary and a streaming standby (synchronous when
// sync), the library on a multi-host connection string with
// target_session_attrs=read-write, and fails them over again and again
// for the whole run (issue 48), back and forth: the standby is
// disconnected (it receives nothing more), operations go on for a few
// leases, the primary is SIGKILLed, the standby promoted, the old primary
// rejoined as a standby of the new one (a base backup of it), and the new
// primary made synchronous again; then the next cycle fails back. An
// asynchronous standby misses the commits the primary acknowledged
// meanwhile; a synchronous one made the primary wait for it, so no
// acknowledged commit is missing.
func pgFailover(sync bool) func(ctx context.Context, e *env) (*workload, error) {
	return func(ctx context.Context, e *env) (*workload, error) {
		settings := []string{"synchronous_commit=on", "max_connections=200", "wal_level=replica"}
		if sync {
			settings = append(settings, "synchronous_standby_names=*")
		}
		primary, err := e.ownPostgres(ctx, settings...)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSetup, err)
		}
		e.onClose(primary.Close)
		standby, err := e.servers().PostgresStandby(ctx, primary)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSetup, err)
		}
		e.onClose(standby.Close)
		a, aok := asPostgresNode(primary)
		b, bok := asPostgresNode(standby)
		rejoin := aok && bok
		if !rejoin {
			// Servers whose PostgreSQL cannot rejoin an old primary as a
			// standby (the runner's containers, for now) fail over once,
			// and the result says so (Repeated.Note).
			a, b = oneWay{PostgresServer: primary}, oneWay{PostgresServer: standby, standby: standby}
			e.repeatOnce("these servers' PostgreSQL cannot rejoin an old primary as a standby: one failover")
		}
		nodes := [2]PostgresNode{a, b}
		url := fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable&connect_timeout=2&target_session_attrs=read-write",
			primary.Addr(), standby.Addr())
		if err := e.onCluster(ctx, url); err != nil {
			return nil, err
		}
		if err := e.seesStandby(ctx, sync); err != nil {
			return nil, err
		}
		w, err := e.mixed(ctx, storeOpts{}, nil)
		if err != nil {
			return nil, err
		}
		e.expectFaults("standby-disconnected", "primary-killed", "standby-promoted")
		n := repeatedPlanned(e.cfg.Iterations, 2)
		if !sync || !rejoin {
			n = 1 // the hazard: one failover loses acknowledged commits
		}
		if rejoin {
			e.expectFaults("old-primary-rejoined")
		}
		// The operations within Parallel after a cycle's start start only
		// once the standby is disconnected, so they commit on the primary
		// alone: with an asynchronous standby their acknowledged results
		// exist nowhere else when the primary dies.
		pair := &pgPair{nodes: nodes, sync: sync, once: !rejoin}
		cy := e.repeat("postgres-failover", n, 0, e.cfg.Parallel, func(ctx context.Context, _ int, ready func()) {
			e.pgFailoverOnce(ctx, pair, ready, nil)
		})
		w.startOp = cy.start
		return w, nil
	}
}

// pgPair is a primary and its standby that change roles at each
// failover; only one failover at a time may use it.
type pgPair struct {
	nodes [2]PostgresNode
	cur   int // the primary's node
	sync  bool
	once  bool // no rejoin: the old primary stays down
}

// oneWay is a PostgreSQL of servers that cannot rejoin an old primary as
// a standby, for a pgPair that fails over once: the standby's Disconnect
// and Promote are its own.
type oneWay struct {
	PostgresServer
	standby PostgresStandby // nil for the primary
}

var errOneWay = errors.New("chaos: this PostgreSQL fails over once")

func (o oneWay) Disconnect(ctx context.Context) error {
	if o.standby == nil {
		return errOneWay
	}
	return o.standby.Disconnect(ctx)
}

func (o oneWay) Promote(ctx context.Context) error {
	if o.standby == nil {
		return errOneWay
	}
	return o.standby.Promote(ctx)
}

func (oneWay) Rejoin(context.Context, PostgresServer) error { return errOneWay }
func (oneWay) SetSynchronous(context.Context, bool) error   { return errOneWay }
func (oneWay) WaitStandby(context.Context, bool) error      { return errOneWay }

func (p *pgPair) primary() PostgresNode { return p.nodes[p.cur] }

// pgFailoverOnce fails pair over: the standby disconnected (ready is
// called then), a few leases of operations, the primary SIGKILLed, the
// standby promoted (moved, when set, is told the new primary), and healed:
// the old primary rejoined as a standby of the new one, which is made
// synchronous again (with pair.sync).
func (e *env) pgFailoverOnce(ctx context.Context, pair *pgPair, ready func(), moved func(PostgresNode) error) (healed bool) {
	bctx := context.WithoutCancel(ctx)
	primary, standby := pair.nodes[pair.cur], pair.nodes[1-pair.cur]
	end := e.span("postgres-failover")
	defer end()
	dctx, cancel := context.WithTimeout(bctx, 10*time.Second)
	err := standby.Disconnect(dctx)
	cancel()
	since := e.rec.Now()
	ready()
	if err != nil {
		e.violation("setup", "", "%v", err)
		return false
	}
	e.fault("standby-disconnected")
	time.Sleep(3 * e.cfg.Lease)
	if !pair.sync {
		// The hazard needs acknowledged commits that only the primary
		// has: wait for some (a loaded machine may be slow to produce
		// them), within a bound.
		waitAcks(ctx, e, since, 2, 20*time.Second)
	}
	if err := primary.Crash(); err != nil {
		e.violation("setup", "", "crash primary: %v", err)
	}
	e.fault("primary-killed")
	rctx, cancel := context.WithTimeout(bctx, 90*time.Second)
	defer cancel()
	if err := standby.Promote(rctx); err != nil {
		e.violation("setup", "", "promote standby: %v", err)
		return false
	}
	e.fault("standby-promoted")
	pair.cur = 1 - pair.cur
	if moved != nil {
		if err := moved(standby); err != nil {
			e.violation("setup", "", "%v", err)
			return false
		}
	}
	if pair.once {
		return true
	}
	// Healed before the next failover: the old primary back as a standby
	// of the new one, which waits for it again.
	if err := primary.Rejoin(rctx, standby); err != nil {
		e.violation("setup", "", "rejoin the old primary: %v", err)
		return false
	}
	if err := standby.SetSynchronous(rctx, pair.sync); err != nil {
		e.violation("setup", "", "%v", err)
		return false
	}
	e.fault("old-primary-rejoined")
	return true
}

// seesStandby checks that the durability check sees the cluster's
// standby and whether it is synchronous: nothing to report with one
// (sync), ErrNotDurable without. A standby just started may take a moment
// to be listed.
func (e *env) seesStandby(ctx context.Context, sync bool) error {
	var derr error
	for range 100 {
		if derr = postgres.CheckDurability(ctx, e.pool); (derr == nil) == sync {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%w: CheckDurability with a synchronous standby %v: %v", ErrSetup, sync, derr)
}

// waitAcks waits until n operations were acknowledged to a client by an
// execution that started after since, or until bound.
func waitAcks(ctx context.Context, e *env, since time.Duration, n int, bound time.Duration) {
	end := time.Now().Add(bound)
	for time.Now().Before(end) && ctx.Err() == nil {
		acks := 0
		for _, c := range e.rec.Calls() {
			if c.Start >= since && (c.Kind == history.Execute || c.Kind == history.Complete) && !c.Ambiguous {
				acks++
			}
		}
		if acks >= n {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// setupPGNetwork gives each client its own fault proxy to PostgreSQL and,
// inside chosen operations' transactions (after the effect, before the
// commit), delays every reply on the owner's proxy by twice the lease or
// drops everything on it for twice the lease (a partition), then heals.
// Only the owner is cut off, as when one application host loses its
// network: its lease runs out while the other clients still reach the
// database and take the operation over, so the owner's late commit is a
// stale owner's, and the fence must refuse it (the negative control
// complete-without-fence shows that it is needed). Commits and fenced
// writes whose replies come late or never are resolved by reading.
func setupPGNetwork(ctx context.Context, e *env) (*workload, error) {
	pcfg, err := pgxpool.ParseConfig(e.cfg.PostgresURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	if strings.HasPrefix(pcfg.ConnConfig.Host, "/") {
		return nil, fmt.Errorf("%w: pg-network needs PostgreSQL over TCP, not a unix socket", ErrSetup)
	}
	target := net.JoinHostPort(pcfg.ConnConfig.Host, strconv.Itoa(int(pcfg.ConnConfig.Port)))
	w := e.newWorkload()
	pxs := make([]*fault.Proxy, e.cfg.Clients)
	for c := range pxs {
		px, err := fault.NewProxy(target)
		if err != nil {
			return nil, err
		}
		e.onClose(px.Close)
		pxs[c] = px
		pool, err := e.newPool(ctx, px.Addr())
		if err != nil {
			return nil, err
		}
		st, err := e.store(storeOpts{}, pool)
		if err != nil {
			return nil, err
		}
		rc := e.userRedis(c)
		warm(ctx, rc)
		cl, err := e.claimer(claimerOpts{store: st, redis: rc})
		if err != nil {
			return nil, err
		}
		w.claimers = append(w.claimers, cl)
	}
	vst, err := e.store(storeOpts{})
	if err != nil {
		return nil, err
	}
	if w.verifier, err = e.claimer(claimerOpts{store: vst, redis: e.redisUser("", nil)}); err != nil {
		return nil, err
	}
	if err := e.mix(w); err != nil {
		return nil, err
	}
	// One fault at a time on each client's proxy; an attempt whose proxy
	// is busy waits for it (at most 2 leases), so that every planned fault
	// fires.
	busy := make([]sync.Mutex, len(pxs))
	// Both kinds must fire: registered now, a kind left at zero fails the run.
	e.faultN("postgres-latency-beyond-lease", 0)
	e.faultN("postgres-partition-beyond-lease", 0)
	e.faultN("taken-over-during-partition", 0)
	w.startOp = func(_ context.Context, o *op) {
		// Even operations run with Do: the fault lands inside their
		// transaction, which holds the claim's row lock, so duplicates wait
		// for it. Odd ones are workflows: the fault lands between the
		// downstream effect and the fenced finish while the lease, not a
		// lock, holds the claim; it lapses, a duplicate takes over, and the
		// owner's late finish is a stale owner's.
		switch o.i % 4 {
		case 0, 1:
			e.planned(o, "latency", 0.3, 0, 1)
		case 2, 3:
			e.planned(o, "partition", 0.3, 2, 3)
		}
	}
	// untilTakeover keeps a partition before a workflow's finish up until
	// another client holds the operation under a newer generation (at
	// most 8 leases): a takeover that lands while the owner is cut off is
	// what makes its finish, retried after the heal, a stale owner's. At
	// two leases alone, it came too late about once in twenty CI runs, and
	// the negative control saw no stale finish to catch.
	inject := func(a *attempt, untilTakeover bool) {
		kind := ""
		switch {
		case a.o.take("latency"):
			kind = "latency"
		case a.o.take("partition"):
			kind = "partition"
		default:
			return
		}
		i := a.client % len(pxs)
		busy[i].Lock()
		var undo func()
		var err error
		if kind == "latency" {
			undo, err = pxs[i].Latency(2*e.cfg.Lease, 0)
		} else {
			undo, err = pxs[i].Blackhole()
		}
		if err != nil {
			busy[i].Unlock()
			return
		}
		e.fault("postgres-" + kind + "-beyond-lease")
		a.note = "postgres " + kind + " for 2 leases before the commit, on this client's connections only"
		o, tok := a.o, a.tok
		time.AfterFunc(2*e.cfg.Lease, func() {
			if untilTakeover && kind == "partition" && e.awaitTakeover(context.Background(), o, tok, 6*e.cfg.Lease) {
				e.fault("taken-over-during-partition")
			}
			undo()
			busy[i].Unlock()
		})
	}
	w.afterEffect = func(_ context.Context, a *attempt) error { inject(a, false); return nil }
	w.beforeComplete = func(_ context.Context, a *attempt) { inject(a, true) }
	return w, nil
}

// setupTLS runs the library on both stores over TLS verified against a
// throwaway CA made now: a PostgreSQL cluster with ssl=on reached with
// sslmode=verify-full, and a redis-server on a --tls-port reached with
// go-redis's TLSConfig. Before the load, a client trusting another CA must
// be refused by each (fail closed, x509: unknown authority).
func setupTLS(ctx context.Context, e *env) (*workload, error) {
	ca, err := fault.NewCA("oncekey-chaos-ca")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	wrong, err := fault.NewCA("some-other-ca")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	c, err := fault.NewCluster(ctx, "synchronous_commit=on", "max_connections=200")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	e.onClose(c.Close)
	caFile, err := c.EnableTLS(ctx, ca)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	wrongFile := filepath.Join(c.Dir(), "wrong-ca.crt")
	if err := os.WriteFile(wrongFile, wrong.PEM(), 0o644); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	base := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=verify-full&sslrootcert=", c.Port())
	var unknown x509.UnknownAuthorityError
	if conn, err := pgx.Connect(ctx, base+wrongFile); err == nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("%w: PostgreSQL accepted a connection verified against the wrong CA", ErrSetup)
	} else if !errors.As(err, &unknown) {
		return nil, fmt.Errorf("%w: PostgreSQL with the wrong CA: want x509 unknown authority, got %w", ErrSetup, err)
	}
	e.fault("postgres-wrong-ca-refused")
	if err := e.onCluster(ctx, base+caFile); err != nil {
		return nil, err
	}
	var ssl bool
	if err := e.pool.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil || !ssl {
		return nil, fmt.Errorf("%w: the library's session is not over TLS (ssl=%v, %v)", ErrSetup, ssl, err)
	}

	dir, err := os.MkdirTemp("", "oncekey-redis-tls-")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	e.onClose(func() { os.RemoveAll(dir) })
	rca, rcert, rkey, err := ca.WriteServer(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	tlsPort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	srv, err := redisproc.New(redisproc.Options{Args: []string{"--tls-port", strconv.Itoa(tlsPort),
		"--tls-cert-file", rcert, "--tls-key-file", rkey, "--tls-ca-cert-file", rca, "--tls-auth-clients", "no"}})
	if err != nil {
		return nil, fmt.Errorf("%w: redis-server with TLS: %w", ErrSetup, err)
	}
	e.onClose(srv.Close)
	tlsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))
	bad := e.redisOwn(tlsAddr, func(o *redis.Options) { o.TLSConfig = wrong.ClientTLS(); o.MaxRetries = -1 })
	if err := bad.Ping(ctx).Err(); err == nil {
		return nil, fmt.Errorf("%w: Redis accepted a connection verified against the wrong CA", ErrSetup)
	} else if !errors.As(err, &unknown) {
		return nil, fmt.Errorf("%w: Redis with the wrong CA: want x509 unknown authority, got %w", ErrSetup, err)
	}
	e.fault("redis-wrong-ca-refused")
	good := func(int) redis.Scripter {
		return e.redisOwn(tlsAddr, func(o *redis.Options) { o.TLSConfig = ca.ClientTLS() })
	}
	if err := good(0).(*redis.Client).Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("%w: Redis over TLS: %w", ErrSetup, err)
	}
	return e.mixed(ctx, storeOpts{}, good)
}
