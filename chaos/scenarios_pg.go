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
		{name: "pg-crash-async-commit", forces: "negative control: PostgreSQL with synchronous_commit=off SIGKILLed mid-load and restarted: acknowledged commits vanish (must be caught)", ownPostgres: true, setup: pgCrash("off")},
	}
}

// pgRegistry lists the scenarios on throwaway PostgreSQL clusters.
func pgRegistry() []scenario {
	return []scenario{
		{name: "pg-crash", forces: "PostgreSQL (synchronous_commit=on) SIGKILLed mid-load, every server process at once, and restarted: it recovers every acknowledged commit", ownPostgres: true, setup: pgCrash("on")},
	}
}

// onCluster moves the scenario onto a throwaway cluster: its history
// tables, its durable store and the library's pool live there, so that
// what the crash loses is what the checker reads.
func (e *env) onCluster(ctx context.Context, c *fault.Cluster) error {
	pcfg, err := pgxpool.ParseConfig(c.URL())
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
	r.cfg.PostgresURL = c.URL()
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
		if err := e.onCluster(ctx, c); err != nil {
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
