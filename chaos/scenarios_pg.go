package chaos

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/durable/postgres"
)

// hazards are scenarios that run PostgreSQL configured to lose
// acknowledged commits: negative controls that show the hazard is real and
// that the checker sees it. They run only when named (Config.Scenarios,
// -scenario); a run of every scenario leaves them out, since they must fail.
func hazards() []scenario {
	return []scenario{
		{name: "pg-failover-async", forces: "negative control: PostgreSQL primary with an asynchronous streaming standby; the standby's streaming is cut, the primary is SIGKILLed, the standby promoted: acknowledged commits vanish (must be caught)", ownPostgres: true, setup: pgFailover(false)},
		{name: "pg-crash-async-commit", forces: "negative control: PostgreSQL with synchronous_commit=off SIGKILLed mid-load and restarted: acknowledged commits vanish (must be caught)", ownPostgres: true, setup: pgCrash("off")},
	}
}

// pgRegistry lists the scenarios on throwaway PostgreSQL clusters.
func pgRegistry() []scenario {
	return []scenario{
		{name: "pg-failover-sync", forces: "PostgreSQL primary with a synchronous standby (synchronous_standby_names, synchronous_commit=on); the standby's streaming is cut, the primary is SIGKILLed, the standby promoted; the library follows through a multi-host connection string with target_session_attrs=read-write", ownPostgres: true, setup: pgFailover(true)},
		{name: "pg-crash", forces: "PostgreSQL (synchronous_commit=on) SIGKILLed mid-load, every server process at once, and restarted: it recovers every acknowledged commit", ownPostgres: true, setup: pgCrash("on")},
	}
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
		c, err := fault.NewCluster(ctx, "synchronous_commit="+sync, "wal_writer_delay=10s",
			"wal_writer_flush_after=1GB", "fsync=on", "max_connections=200")
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSetup, err)
		}
		e.onClose(c.Close)
		if err := e.onCluster(ctx, c.URL()); err != nil {
			return nil, err
		}
		if sync == "on" {
			if err := postgres.CheckDurability(ctx, e.pool); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrSetup, err)
			}
		}
		w, err := e.mixed(ctx, storeOpts{}, nil)
		if err != nil {
			return nil, err
		}
		every := max(e.cfg.Iterations/3, 5)
		w.startOp = func(ctx context.Context, o *op) {
			if o.i == 0 || o.i%every != every-1 {
				return
			}
			e.bg(func() {
				// Let the operations started so far commit and answer.
				time.Sleep(3 * e.cfg.Lease)
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
		}
		return w, nil
	}
}

// pgFailover runs a primary and a streaming standby (synchronous when
// sync), the library on a multi-host connection string with
// target_session_attrs=read-write. Halfway through the run the standby is
// disconnected (it receives nothing more), operations go on for a few
// leases, the primary is SIGKILLed, the standby promoted. An asynchronous
// standby misses the commits the primary acknowledged meanwhile; a synchronous one made the primary wait for it, so no
// acknowledged commit is missing.
func pgFailover(sync bool) func(ctx context.Context, e *env) (*workload, error) {
	return func(ctx context.Context, e *env) (*workload, error) {
		settings := []string{"synchronous_commit=on", "max_connections=200", "wal_level=replica"}
		if sync {
			settings = append(settings, "synchronous_standby_names=*")
		}
		primary, err := fault.NewCluster(ctx, settings...)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSetup, err)
		}
		e.onClose(primary.Close)
		standby, err := primary.Standby(ctx)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSetup, err)
		}
		e.onClose(standby.Close)
		url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2&target_session_attrs=read-write",
			primary.Port(), standby.Port())
		if err := e.onCluster(ctx, url); err != nil {
			return nil, err
		}
		// The durability check sees the standby, and whether it is synchronous.
		var derr error
		for range 100 {
			if derr = postgres.CheckDurability(ctx, e.pool); (derr == nil) == sync {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if (derr == nil) != sync {
			return nil, fmt.Errorf("%w: CheckDurability with sync=%v: %v", ErrSetup, sync, derr)
		}
		w, err := e.mixed(ctx, storeOpts{}, nil)
		if err != nil {
			return nil, err
		}
		at := e.cfg.Iterations / 2
		w.startOp = func(ctx context.Context, o *op) {
			if o.i != at {
				return
			}
			e.bg(func() {
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				err := standby.Disconnect(dctx)
				cancel()
				if err != nil {
					e.violation("setup", "", "%v", err)
					return
				}
				e.fault("standby-disconnected")
				time.Sleep(3 * e.cfg.Lease)
				if err := primary.Crash(); err != nil {
					e.violation("setup", "", "crash primary: %v", err)
				}
				e.fault("primary-killed")
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 90*time.Second)
				defer cancel()
				if err := standby.Promote(rctx); err != nil {
					e.violation("setup", "", "promote standby: %v", err)
					return
				}
				e.fault("standby-promoted")
			})
		}
		return w, nil
	}
}
