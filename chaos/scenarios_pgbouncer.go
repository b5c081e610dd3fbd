package chaos

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/testkit/pgbouncer"
)

// pgbouncerInstalled is the scenario's requirement: a pgbouncer binary.
func pgbouncerInstalled() error {
	_, err := pgbouncer.Binary()
	return err
}

// setupPgBouncer runs every client's store through one PgBouncer in
// transaction pooling mode in front of the suite's PostgreSQL, on pools set
// up as durable/postgres documents for it (query exec mode exec, no
// startup parameters but application_name). Mid-load, the bouncer's
// server connections are terminated (in the middle of transactions and
// commits) and the bouncer itself is SIGKILLed and restarted on the same
// port, every client connection dropping with it.
func setupPgBouncer(ctx context.Context, e *env) (*workload, error) {
	b, err := pgbouncer.New(pgbouncer.Options{Target: e.cfg.PostgresURL, PoolSize: 20})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	e.onClose(b.Close)
	pcfg, err := pgxpool.ParseConfig(e.cfg.PostgresURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	pcfg.ConnConfig.Host, pcfg.ConnConfig.Port = "127.0.0.1", uint16(b.Port())
	pcfg.ConnConfig.TLSConfig, pcfg.ConnConfig.Fallbacks = nil, nil
	pcfg.ConnConfig.Database = b.Database()
	pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pcfg.ConnConfig.RuntimeParams = map[string]string{"application_name": e.app}
	pcfg.MaxConns = int32(e.cfg.Parallel*e.cfg.Clients + 6)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(pctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("%w: pool through pgbouncer: %w", ErrSetup, err)
	}
	e.onClose(pool.Close)
	// The durability check works through the pooler and finds nothing to
	// report on a pool set up for it.
	if err := postgres.CheckDurability(pctx, pool); err != nil {
		return nil, fmt.Errorf("%w: CheckDurability through pgbouncer: %w\n%s", ErrSetup, err, b.Log())
	}
	e.pool = pool
	w, err := e.mixed(ctx, storeOpts{}, nil)
	if err != nil {
		return nil, err
	}
	e.expectFaults("pgbouncer-server-connections-terminated", "pgbouncer-restarted")
	// Both again and again for the whole run (issue 48), one at a time.
	n := repeatedPlanned(e.cfg.Iterations, 5)
	terminate := e.repeat("pgbouncer-terminate", n, 0, 0, func(ctx context.Context, _ int, _ func()) {
		time.Sleep(e.cfg.Lease / 3)
		defer e.span("pgbouncer-server-connections-terminated")()
		n, err := fault.TerminateApp(context.WithoutCancel(ctx), e.admin, e.app)
		if err != nil {
			e.violation("setup", "", "%v", err)
			return
		}
		e.faultN("pgbouncer-server-connections-terminated", int64(n))
	})
	restart := e.repeat("pgbouncer-restart", n, 0, 0, func(context.Context, int, func()) {
		time.Sleep(e.cfg.Lease / 3)
		defer e.span("pgbouncer-restart")()
		// A restart can fail to start the bouncer again (seen once in 25 at
		// 1000 operations: every operation after it then failed): tried
		// again, each failure counted and its error kept for the report.
		var err error
		for try := 0; try < 5; try++ {
			if err = b.Restart(); err == nil {
				break
			}
			e.observe("pgbouncer-restart-failed: " + err.Error())
			time.Sleep(time.Second)
		}
		if err != nil {
			log := b.Log()
			e.violation("setup", "", "%v\n%s", err, log[max(0, len(log)-2000):])
			return
		}
		e.fault("pgbouncer-restarted")
	})
	w.startOp = func(ctx context.Context, o *op) {
		terminate.start(ctx, o)
		restart.start(ctx, o)
	}
	return w, nil
}
