package postgres_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/durable/driver/pgmigrate"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/testkit/pgproxy"
	"github.com/oncekey/oncekey/testkit/storetest"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// fixture is one store on a fresh schema.
type fixture struct {
	s      storeapi.Store[pgx.Tx]
	pool   *pgxpool.Pool
	schema testenv.Schema
	stmts  *testenv.StatementCounter
	app    string // application_name of the store's sessions
	proxy  *pgproxy.Cutter
	opts   []postgres.Option // the store's options, for Migrate
}

type fixtureOpts struct {
	unconfigured bool // do not call ConfigurePool: the store bounds its own lock waits
	proxy        bool // connect through a pgproxy.Cutter
	noMigrate    bool
	// qualified: WithSchema(the test schema) while the sessions' search_path
	// points elsewhere, so any unqualified name would fail.
	qualified bool
	opts      []postgres.Option
	// partitions: the store's table is created WithPartitions(partitions)
	// (0: not partitioned). Set it in opts too.
	partitions int
	// genericPlans: the sessions run with plan_cache_mode=force_generic_plan.
	genericPlans bool
	// contracted: after Migrate, migration 007's contract step (the digest
	// as the primary key). The default table, unqualified.
	contracted bool
}

var fixtures sync.Map // storeapi.Store[pgx.Tx] → *fixture

func newFixture(t testing.TB, o fixtureOpts) *fixture {
	t.Helper()
	sch := testenv.Postgres(t)
	cfg, err := pgxpool.ParseConfig(sch.URL)
	if err != nil {
		t.Fatal(err)
	}
	opts := o.opts
	if o.qualified {
		opts = append([]postgres.Option{postgres.WithSchema(sch.Name)}, opts...)
		cfg.ConnConfig.RuntimeParams["search_path"] = "pg_catalog"
	}
	if !o.unconfigured {
		if err := postgres.ConfigurePool(cfg, opts...); err != nil {
			t.Fatal(err)
		}
	}
	f := &fixture{schema: sch, stmts: &testenv.StatementCounter{}, app: sch.Name}
	cfg.ConnConfig.RuntimeParams["application_name"] = f.app
	if o.genericPlans {
		cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	}
	cfg.ConnConfig.Tracer = f.stmts
	if o.proxy {
		network, target := "tcp", net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
		if strings.HasPrefix(cfg.ConnConfig.Host, "/") {
			network, target = "unix", cfg.ConnConfig.Host+"/.s.PGSQL."+strconv.Itoa(int(cfg.ConnConfig.Port))
		}
		f.proxy = newCutProxy(t, network, target)
		cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", f.proxy.Port()
		cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f.pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.pool.Close)
	f.opts = opts
	st, err := postgres.New(f.pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	f.s = st.(storeapi.Store[pgx.Tx])
	if !o.noMigrate {
		if err := postgres.Migrate(ctx, f.pool, f.opts...); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
	if o.contracted {
		if _, err := pgmigrate.Contract(ctx, f.pool, postgres.Migrations(), pgmigrate.Target{Schema: sch.Name, Table: pgmigrate.DefaultTable}); err != nil {
			t.Fatalf("contract: %v", err)
		}
	}
	fixtures.Store(f.s, f)
	t.Cleanup(func() { fixtures.Delete(f.s) })
	return f
}

func fixtureOf(s storeapi.Store[pgx.Tx]) *fixture {
	f, _ := fixtures.Load(s)
	return f.(*fixture)
}

// lockWaiters counts the store's sessions waiting for a lock.
func (f *fixture) lockWaiters() int {
	var n int
	err := f.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, f.app).Scan(&n)
	if err != nil {
		return 0
	}
	return n
}

// unreachable returns a store on a pool whose server does not exist (a port
// nothing listens on).
func unreachable(t testing.TB) storeapi.Store[pgx.Tx] {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg, err := pgxpool.ParseConfig("postgres://postgres@" + addr + "/test?sslmode=disable&connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.ConfigurePool(cfg); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := postgres.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	return s.(storeapi.Store[pgx.Tx])
}

func harness(o fixtureOpts) storetest.Harness[pgx.Tx] {
	return storetest.Harness[pgx.Tx]{
		New: func(t testing.TB) storeapi.Store[pgx.Tx] { return newFixture(t, o).s },
		Unreachable: func(t testing.TB) storeapi.Store[pgx.Tx] {
			return unreachable(t)
		},
		Upgrade: upgradeWith(o.partitions),
		LoseCommitAck: func(t testing.TB) (storeapi.Store[pgx.Tx], func()) {
			po := o
			po.proxy = true
			f := newFixture(t, po)
			return f.s, func() { f.proxy.Arm(pgproxy.CutCommit) }
		},
		// A unique constraint checked at COMMIT, on a temporary table of the
		// caller's, violated by two rows.
		BreakCommit: func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `CREATE TEMP TABLE IF NOT EXISTS durabletest_orders (id integer,
				CONSTRAINT durabletest_orders_id_key UNIQUE (id) DEFERRABLE INITIALLY DEFERRED) ON COMMIT DROP`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO durabletest_orders VALUES (1), (1)`)
			return err
		},
		Statements:  func(s storeapi.Store[pgx.Tx]) int64 { return fixtureOf(s).stmts.Count() },
		LockWaiters: func(s storeapi.Store[pgx.Tx]) int { return fixtureOf(s).lockWaiters() },
	}
}

// TestContract runs the contract suite on a pool set up with ConfigurePool,
// the recommended way.
func TestContract(t *testing.T) {
	t.Parallel()
	storetest.Run(t, harness(fixtureOpts{}))
}

// TestContractUnconfiguredPool runs the suite again on a plain pool (the
// store then bounds its lock waits per statement), with a schema-qualified
// table of another name and a key secret.
func TestContractUnconfiguredPool(t *testing.T) {
	t.Parallel()
	storetest.Run(t, harness(fixtureOpts{
		unconfigured: true,
		qualified:    true,
		opts:         []postgres.Option{postgres.WithTable("idem_keys"), postgres.WithKeySecret([]byte("test secret"))},
	}))
}

// TestContractExpectNew runs the suite with ClaimParams.ExpectNew on every
// Claim (a Claimer's claim after Redis granted the key): the insert first
// (claimNewSQL) must change no outcome, on a plain pool that bounds lock
// waits per statement.
func TestContractExpectNew(t *testing.T) {
	t.Parallel()
	h := harness(fixtureOpts{unconfigured: true})
	h.ExpectNew = true
	storetest.Run(t, h)
}

// TestContractDigestKey runs the suite on a table whose primary key is the
// operation digest (migration 007's contract step): the statements are the
// same as before it, and so must be every outcome.
func TestContractDigestKey(t *testing.T) {
	t.Parallel()
	storetest.Run(t, harness(fixtureOpts{contracted: true}))
}

// TestContractPartitioned runs the suite on a table hash-partitioned into 4
// (WithPartitions): the store's behaviour must not change.
func TestContractPartitioned(t *testing.T) {
	t.Parallel()
	storetest.Run(t, harness(fixtureOpts{partitions: 4, opts: []postgres.Option{postgres.WithPartitions(4)}}))
}
