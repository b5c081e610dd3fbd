//go:build unix

package postgres_test

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/testkit/pgbouncer"
	"github.com/oncekey/oncekey/testkit/pgproxy"
	"github.com/oncekey/oncekey/testkit/storetest"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// bouncerFixture is a store on a fresh schema whose pool connects through
// b, a PgBouncer in transaction pooling mode, with mode as its
// DefaultQueryExecMode: the setup the package documentation gives for
// PgBouncer. PgBouncer refuses startup parameters it does not know, so the
// pool carries none (no ConfigurePool, no search_path): the store names its
// schema (WithSchema) and bounds its own lock waits. With proxy, the pool
// connects through a pgproxy.Cutter in front of b.
func bouncerFixture(t testing.TB, b *pgbouncer.Bouncer, mode pgx.QueryExecMode, proxy, migrate bool, opts ...postgres.Option) *fixture {
	t.Helper()
	sch := testenv.Postgres(t)
	cfg := b.PoolConfig(t, b.Database(), mode)
	opts = append([]postgres.Option{postgres.WithSchema(sch.Name)}, opts...)
	f := &fixture{schema: sch, stmts: &testenv.StatementCounter{}, app: sch.Name, opts: opts}
	// application_name is one of the few parameters PgBouncer carries per
	// client (it sets it on the server session each transaction runs on).
	cfg.ConnConfig.RuntimeParams["application_name"] = f.app
	cfg.ConnConfig.Tracer = f.stmts
	if proxy {
		f.proxy = newCutProxy(t, "tcp", b.Addr())
		cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", f.proxy.Port()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	if f.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.pool.Close)
	st, err := postgres.New(f.pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	f.s = st.(storeapi.Store[pgx.Tx])
	if migrate {
		if err := postgres.Migrate(ctx, f.pool, opts...); err != nil {
			t.Fatalf("Migrate through PgBouncer: %v", err)
		}
	}
	fixtures.Store(f.s, f)
	t.Cleanup(func() { fixtures.Delete(f.s) })
	return f
}

// bouncerUpgrade is Harness.Upgrade through b: the tables of 001 and 002
// and the rows of the previous release written in one transaction (its
// search_path set with SET LOCAL, which holds for that transaction only),
// then Migrate, all through PgBouncer.
func bouncerUpgrade(b *pgbouncer.Bouncer, mode pgx.QueryExecMode) func(t testing.TB, refs []durable.Ref) storeapi.Store[pgx.Tx] {
	return func(t testing.TB, refs []durable.Ref) storeapi.Store[pgx.Tx] {
		t.Helper()
		f := bouncerFixture(t, b, mode, false, false)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+f.schema.Name); err != nil {
				return err
			}
			for _, name := range []string{"001_create_idempotency_requests.up.sql", "002_retention_and_binary_headers.up.sql"} {
				sql, err := fs.ReadFile(postgres.Migrations(), name)
				if err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, string(sql)); err != nil {
					return err
				}
			}
			for _, ref := range refs {
				if _, err := tx.Exec(ctx, `INSERT INTO idempotency_requests (tenant_id, operation, key_hash,
	request_hash, state, generation, status_code, response_body, response_version, completed_at, expires_at, retention_us)
VALUES ($1, $2, $3, 'v1:fp', 'completed', 1, 201, '\x7b7d', 1, now(), now() + interval '1 hour', 3600000000)`,
					ref.Tenant, ref.Operation, ref.KeyHash[:]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("tables of the previous release: %v", err)
		}
		if err := postgres.Migrate(ctx, f.pool, f.opts...); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
		return f.s
	}
}

// bouncerHarness is the contract suite's harness through b.
func bouncerHarness(b *pgbouncer.Bouncer, mode pgx.QueryExecMode) storetest.Harness[pgx.Tx] {
	h := harness(fixtureOpts{})
	h.New = func(t testing.TB) storeapi.Store[pgx.Tx] { return bouncerFixture(t, b, mode, false, true).s }
	h.Upgrade = bouncerUpgrade(b, mode)
	h.LoseCommitAck = func(t testing.TB) (storeapi.Store[pgx.Tx], func()) {
		f := bouncerFixture(t, b, mode, true, true)
		return f.s, func() { f.proxy.Arm(pgproxy.CutCommit) }
	}
	return h
}

// TestContractThroughPgBouncer runs the store contract suite through a
// PgBouncer 1.18 in transaction pooling mode, with each query exec mode
// the package documentation gives for it.
func TestContractThroughPgBouncer(t *testing.T) {
	t.Parallel()
	b := startBouncer(t, pgbouncer.Options{})
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeCacheDescribe} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, bouncerHarness(b, mode))
		})
	}
}

// startBouncer starts a PgBouncer in front of the server testenv gives the
// test (its schemas are made there), in transaction pooling mode unless
// opts say otherwise.
func startBouncer(t testing.TB, opts pgbouncer.Options) *pgbouncer.Bouncer {
	t.Helper()
	opts.Target = testenv.DatabaseURL(t)
	return pgbouncer.Start(t, opts)
}

// bouncerPool returns a pool through b on database (an alias of b, or the
// server's database), with mode, and with ConfigurePool's startup
// parameters when configure.
func bouncerPool(t testing.TB, b *pgbouncer.Bouncer, database string, mode pgx.QueryExecMode, configure bool, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg := b.PoolConfig(t, database, mode)
	if configure {
		if err := postgres.ConfigurePool(cfg); err != nil {
			t.Fatal(err)
		}
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// wantPoolerError fails the test unless err matches ErrConfig, not
// ErrUnavailable (retrying does not help), and says what to change.
func wantPoolerError(t testing.TB, what string, err error, says ...string) {
	t.Helper()
	if !errors.Is(err, postgres.ErrConfig) || errors.Is(err, durable.ErrUnavailable) {
		t.Fatalf("%s = %v; want an error matching ErrConfig, not ErrUnavailable", what, err)
	}
	for _, s := range append([]string{"PgBouncer", "transaction"}, says...) {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("%s = %v; want it to say %q", what, err, s)
		}
	}
	t.Logf("%s: %v", what, err)
}

// TestPgBouncer_WorkingPoolsPassTheCheck: behind PgBouncer in transaction
// mode, a pool without named prepared statements and without startup
// parameters passes CheckDurability; so does pgx's default (named
// statements) behind PgBouncer in session mode, where they work.
func TestPgBouncer_WorkingPoolsPassTheCheck(t *testing.T) {
	t.Parallel()
	tx := startBouncer(t, pgbouncer.Options{})
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec, pgx.QueryExecModeSimpleProtocol} {
		if err := postgres.CheckDurability(t.Context(), bouncerPool(t, tx, tx.Database(), mode, false, 0)); err != nil {
			t.Errorf("%v through PgBouncer in transaction mode: CheckDurability = %v", mode, err)
		}
	}
	sess := startBouncer(t, pgbouncer.Options{PoolMode: "session"})
	if err := postgres.CheckDurability(t.Context(), bouncerPool(t, sess, sess.Database(), pgx.QueryExecModeCacheStatement, false, 0)); err != nil {
		t.Errorf("named statements through PgBouncer in session mode: CheckDurability = %v", err)
	}
}

// TestPgBouncer_NamedStatementsAreDetected is the negative control of the
// check: pgx's default query exec mode (named prepared statements) behind
// PgBouncer 1.18 in transaction mode is reported by CheckDurability, and a
// store's statement that fails because of it (two clients on PgBouncer's
// one server session: the second prepares the statement the first left
// there, 42P05) fails with the same error, not ErrUnavailable.
func TestPgBouncer_NamedStatementsAreDetected(t *testing.T) {
	t.Parallel()
	b := startBouncer(t, pgbouncer.Options{PoolSize: 1})
	pool := bouncerPool(t, b, b.Database(), pgx.QueryExecModeCacheStatement, false, 1)
	wantPoolerError(t, "CheckDurability", postgres.CheckDurability(t.Context(), pool), "QueryExecModeExec")

	f := bouncerFixture(t, b, pgx.QueryExecModeExec, false, true)
	ref, err := f.s.Ref(scope())
	if err != nil {
		t.Fatal(err)
	}
	var errs []error
	for range 2 {
		other := bouncerPool(t, b, b.Database(), pgx.QueryExecModeCacheStatement, false, 1)
		st, err := postgres.New(other, f.opts...)
		if err != nil {
			t.Fatal(err)
		}
		_, err = st.Get(t.Context(), ref)
		errs = append(errs, err)
	}
	if !errors.Is(errs[0], durable.ErrNotFound) {
		t.Fatalf("first client's Get = %v; want ErrNotFound", errs[0])
	}
	wantPoolerError(t, "second client's Get", errs[1], "prepared statement")
	var pgErr *pgconn.PgError
	if !errors.As(errs[1], &pgErr) || pgErr.Code != "42P05" {
		t.Fatalf("second client's Get = %v; want the server's 42P05 kept as the cause", errs[1])
	}
}

// TestPgBouncer_StartupParametersAreDetected: ConfigurePool's timeouts are
// startup parameters. PgBouncer refuses them (the store's operations and
// CheckDurability fail with ErrConfig, not ErrUnavailable), or, listed in
// ignore_startup_parameters, drops them: the sessions then have no
// lock_timeout, which CheckDurability reports, and the store, once it has
// seen a session (Stats, or the Claimer's settings read), bounds its own
// statements again: a claim waiting for a row lock fails after its
// lock_timeout instead of waiting for the holder.
func TestPgBouncer_StartupParametersAreDetected(t *testing.T) {
	t.Parallel()
	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		b := startBouncer(t, pgbouncer.Options{})
		pool := bouncerPool(t, b, b.Database(), pgx.QueryExecModeExec, true, 0)
		wantPoolerError(t, "CheckDurability", postgres.CheckDurability(t.Context(), pool), "ConfigurePool", "ALTER ROLE")
		st, err := postgres.New(pool)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := st.Ref(scope())
		if err != nil {
			t.Fatal(err)
		}
		_, err = st.Get(t.Context(), ref)
		wantPoolerError(t, "Get", err, "unsupported startup parameter")
		wantPoolerError(t, "Migrate", postgres.Migrate(t.Context(), pool), "ConfigurePool")
	})
	t.Run("Dropped", func(t *testing.T) {
		t.Parallel()
		b := startBouncer(t, pgbouncer.Options{IgnoreStartupParameters: []string{"lock_timeout", "idle_in_transaction_session_timeout"}})
		pool := bouncerPool(t, b, b.Database(), pgx.QueryExecModeExec, true, 0)
		wantPoolerError(t, "CheckDurability", postgres.CheckDurability(t.Context(), pool), "never reach the server sessions")

		f := bouncerFixture(t, b, pgx.QueryExecModeExec, false, true)
		cfg := pool.Config()
		cfg.ConnConfig.RuntimeParams["application_name"] = f.app
		configured, err := pgxpool.NewWithConfig(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(configured.Close)
		opts := append(f.opts, postgres.WithLockTimeout(50*time.Millisecond))
		st, err := postgres.New(configured, opts...)
		if err != nil {
			t.Fatal(err)
		}
		s := st.(storeapi.Store[pgx.Tx])
		if _, err := s.Stats(t.Context()); err != nil {
			t.Fatal(err)
		}
		// f's store holds the row in an open transaction; the configured
		// store's claim must give up at its lock_timeout.
		sc := scope()
		p := claimParams(sc, time.Minute)
		err = f.s.InTx(t.Context(), func(ctx context.Context, tx pgx.Tx) error {
			if res, err := f.s.Claim(ctx, tx, p); err != nil || !res.Acquired {
				t.Fatalf("claim in tx: %+v %v", res, err)
			}
			ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			p2 := p
			p2.Owner = [16]byte{9}
			_, err := s.Claim(ctx, nil, p2)
			if !errors.Is(err, durable.ErrUnavailable) || ctx.Err() != nil {
				t.Errorf("claim of a row held by an open transaction = %v (ctx %v); want ErrUnavailable from lock_timeout", err, ctx.Err())
			}
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
				t.Errorf("claim of a held row = %v; want lock_not_available (55P03)", err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// TestPgBouncer_DurabilityIsTheServerSessions: behind PgBouncer the
// settings that count are the server sessions', which CheckDurability and
// Stats read: synchronous_commit = off set on every server connection (a
// connect_query of the database alias) is reported; the same database
// through the plain alias is durable.
func TestPgBouncer_DurabilityIsTheServerSessions(t *testing.T) {
	t.Parallel()
	b := startBouncer(t, pgbouncer.Options{Databases: map[string]string{
		"async": "dbname=" + dbName(t) + " connect_query='SET synchronous_commit = off'",
	}})
	if err := postgres.CheckDurability(t.Context(), bouncerPool(t, b, b.Database(), pgx.QueryExecModeExec, false, 0)); err != nil {
		t.Fatalf("CheckDurability through PgBouncer = %v", err)
	}
	async := bouncerPool(t, b, "async", pgx.QueryExecModeExec, false, 0)
	err := postgres.CheckDurability(t.Context(), async)
	if !errors.Is(err, postgres.ErrNotDurable) || !strings.Contains(err.Error(), "synchronous_commit=off") {
		t.Fatalf("CheckDurability with synchronous_commit = off on PgBouncer's server sessions = %v; want ErrNotDurable naming it", err)
	}
	sch := testenv.Postgres(t)
	opts := []postgres.Option{postgres.WithSchema(sch.Name)}
	if err := postgres.Migrate(t.Context(), async, opts...); err != nil {
		t.Fatal(err)
	}
	st, err := postgres.New(async, opts...)
	if err != nil {
		t.Fatal(err)
	}
	stats, err := st.Stats(t.Context())
	if err != nil || !strings.Contains(stats.Durability, "synchronous_commit=off") {
		t.Fatalf("Stats through PgBouncer: Durability %q, %v; want synchronous_commit=off named", stats.Durability, err)
	}
}

// dbName is the database of the server testenv gives the test.
func dbName(t testing.TB) string {
	cfg, err := pgconn.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Database
}

// TestPgBouncer_ConcurrentMigrate: Migrate runs in one transaction under a
// transaction-scoped advisory lock, so it needs no direct connection:
// instances migrating at once through PgBouncer in transaction mode
// serialize, and every one succeeds.
func TestPgBouncer_ConcurrentMigrate(t *testing.T) {
	t.Parallel()
	b := startBouncer(t, pgbouncer.Options{PoolSize: 4})
	schema := testenv.Postgres(t).Name + "_m" // Migrate creates it; dropped with the test's schema below
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), testenv.DatabaseURL(t))
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
			_ = c.Close(context.Background())
		}
	})
	var wg sync.WaitGroup
	for range 4 {
		pool := bouncerPool(t, b, b.Database(), pgx.QueryExecModeExec, false, 0)
		wg.Go(func() {
			if err := postgres.Migrate(t.Context(), pool, postgres.WithSchema(schema), postgres.WithPartitions(2)); err != nil {
				t.Errorf("Migrate through PgBouncer: %v", err)
			}
		})
	}
	wg.Wait()
	pool := bouncerPool(t, b, b.Database(), pgx.QueryExecModeExec, false, 0)
	var versions int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM `+schema+`.idempotency_requests_migrations`).Scan(&versions); err != nil || versions == 0 {
		t.Fatalf("%d versions recorded (%v)", versions, err)
	}
}
