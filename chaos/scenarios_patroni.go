package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/durable/postgres"
)

// patroniRegistry lists the scenarios on a three-node PostgreSQL cluster
// managed by Patroni with an etcd DCS, reached the way the README
// recommends: a multi-host connection string with
// target_session_attrs=read-write.
func patroniRegistry() []scenario {
	return []scenario{
		{name: "patroni-kill-leader", forces: "Patroni, synchronous_mode: the replicas' WAL receivers frozen, the leader (Patroni and PostgreSQL) SIGKILLed mid-load, Patroni promotes the synchronous standby; the old leader rejoins as a replica; again and again for the whole run", ownPostgres: true, needs: fault.PatroniInstalled, repeats: "leader-killed", setup: setupPatroniKill(true)},
		{name: "patroni-dcs-partition", forces: "Patroni, synchronous_mode: the leader cut off from etcd mid-load; it demotes itself before its lock expires and another node takes the lock: never two primaries; the old leader rejoins; again and again for the whole run", ownPostgres: true, needs: fault.PatroniInstalled, repeats: "leader-cut-from-dcs", setup: setupPatroniPartition},
		{name: "patroni-switchover", forces: "Patroni, synchronous_mode: a switchover to another node under load, as for maintenance, again and again for the whole run", ownPostgres: true, needs: fault.PatroniInstalled, repeats: "switchover", setup: setupPatroniSwitchover},
	}
}

// patroniHazards are the negative controls on Patroni, run only when named.
func patroniHazards() []scenario {
	return []scenario{
		{name: "patroni-async-failover", forces: "negative control: Patroni without synchronous_mode; the replicas' WAL receivers frozen, commits acknowledged on the leader alone, the leader SIGKILLed, a replica promoted: acknowledged commits vanish (must be caught)", ownPostgres: true, needs: fault.PatroniInstalled, setup: setupPatroniKill(false)},
	}
}

// onPatroni starts a three-node Patroni cluster and moves the scenario
// onto it (see onCluster), with a watch that counts the moments two nodes
// said they were primary.
func (e *env) onPatroni(ctx context.Context, sync bool) (*fault.Patroni, error) {
	p, err := fault.NewPatroni(ctx, 3, sync)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	e.onClose(p.Close)
	if err := e.onCluster(ctx, p.URL()); err != nil {
		return nil, err
	}
	// Patroni sets synchronous_standby_names in synchronous_mode.
	if err := e.seesStandby(ctx, sync); err != nil {
		return nil, err
	}
	if err := replicaNotDurable(ctx, p); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	e.onClose(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for wctx.Err() == nil {
			if ps := p.Primaries(); len(ps) > 1 {
				e.observe("two-primaries-reported")
			}
			sleep(wctx, 100*time.Millisecond)
		}
	}()
	return p, nil
}

// patroniAt runs the workload of a Patroni scenario: it runs fault again
// and again for the whole run (issue 48), each time once the cluster is
// whole again after the last (fault heals it before it returns); the
// operations within Parallel after each start only once fault says the
// window is open (ready), so they land in it. The hazard (sync false)
// runs it once: one failover loses acknowledged commits.
func (e *env) patroniAt(ctx context.Context, sync bool, fault func(ctx context.Context, ready func())) (*workload, error) {
	w, err := e.mixed(ctx, storeOpts{}, nil)
	if err != nil {
		return nil, err
	}
	n := repeatedPlanned(e.cfg.Iterations, 2)
	if !sync {
		n = 1
	}
	cy := e.repeat("patroni", n, 0, e.cfg.Parallel, func(ctx context.Context, _ int, ready func()) {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		fault(fctx, ready)
	})
	w.startOp = cy.start
	return w, nil
}

// rejoin restarts node i after it was killed or cut off and waits until
// the cluster is whole again.
func (e *env) rejoin(ctx context.Context, p *fault.Patroni, restart bool, i int) {
	if restart {
		if err := p.Restart(i); err != nil {
			e.violation("setup", "", "restart node%d: %v", i+1, err)
			return
		}
	}
	if err := p.WaitHealthy(ctx, 3*time.Minute); err != nil {
		e.violation("setup", "", "%v", err)
		return
	}
	e.fault("old-leader-rejoined")
}

// setupPatroniKill freezes the replicas' WAL receivers, lets operations
// commit for a few leases, SIGKILLs the leader, thaws the receivers and
// lets Patroni fail over. In synchronous_mode the leader's commits waited
// for the synchronous standby, so none was acknowledged in the window and
// the promoted standby has every acknowledged one; without it (sync
// false, the negative control) the leader acknowledged commits no replica
// received, and the promoted replica lacks them.
func setupPatroniKill(sync bool) func(ctx context.Context, e *env) (*workload, error) {
	return func(ctx context.Context, e *env) (*workload, error) {
		p, err := e.onPatroni(ctx, sync)
		if err != nil {
			return nil, err
		}
		e.expectFaults("replication-frozen", "leader-killed", "new-leader-promoted", "old-leader-rejoined")
		return e.patroniAt(ctx, sync, func(ctx context.Context, ready func()) {
			defer e.span("patroni-leader-killed")()
			thaw, err := p.FreezeReplication()
			since := e.rec.Now()
			ready()
			if err != nil {
				e.violation("setup", "", "%v", err)
				return
			}
			e.fault("replication-frozen")
			time.Sleep(3 * e.cfg.Lease)
			if !sync {
				waitAcks(ctx, e, since, 2, 20*time.Second)
			}
			old := p.Leader()
			if old < 0 {
				thaw()
				e.violation("setup", "", "no leader to kill")
				return
			}
			err = p.Kill(old)
			thaw()
			if err != nil {
				e.violation("setup", "", "kill node%d: %v", old+1, err)
				return
			}
			e.fault("leader-killed")
			if _, err := p.WaitLeader(ctx, 6*fault.PatroniTTL, old); err != nil {
				e.violation("setup", "", "%v", err)
				return
			}
			e.fault("new-leader-promoted")
			e.rejoin(ctx, p, true, old)
		})
	}
}

// setupPatroniPartition cuts the leader off from etcd. Patroni's leader
// cannot renew its lock, demotes itself after retry_timeout, before the
// lock's ttl runs out and another node may take it: the engine prevents
// split brain, and the checker sees whether any acknowledged result was
// lost or any operation ran twice.
func setupPatroniPartition(ctx context.Context, e *env) (*workload, error) {
	p, err := e.onPatroni(ctx, true)
	if err != nil {
		return nil, err
	}
	e.expectFaults("leader-cut-from-dcs", "new-leader-promoted", "old-leader-rejoined")
	return e.patroniAt(ctx, true, func(ctx context.Context, ready func()) {
		defer e.span("patroni-leader-cut-from-dcs")()
		old := p.Leader()
		if old < 0 {
			ready()
			e.violation("setup", "", "no leader to cut off")
			return
		}
		heal, err := p.CutFromDCS(old)
		ready()
		if err != nil {
			e.violation("setup", "", "%v", err)
			return
		}
		e.fault("leader-cut-from-dcs")
		_, err = p.WaitLeader(ctx, 6*fault.PatroniTTL, old)
		heal()
		if err != nil {
			e.violation("setup", "", "%v", err)
			return
		}
		e.fault("new-leader-promoted")
		e.rejoin(ctx, p, false, old)
	})
}

// setupPatroniSwitchover moves the leadership under load, the way an
// operator does before maintenance.
func setupPatroniSwitchover(ctx context.Context, e *env) (*workload, error) {
	p, err := e.onPatroni(ctx, true)
	if err != nil {
		return nil, err
	}
	e.expectFaults("switchover")
	return e.patroniAt(ctx, true, func(ctx context.Context, ready func()) {
		defer e.span("patroni-switchover")()
		ready()
		time.Sleep(e.cfg.Lease)
		if _, err := p.Switchover(ctx); err != nil {
			e.violation("setup", "", "%v", err)
			return
		}
		e.fault("switchover")
		if err := p.WaitHealthy(ctx, 3*time.Minute); err != nil {
			e.violation("setup", "", "%v", err)
		}
	})
}

// replicaNotDurable checks that the durability check, on a pool connected
// to one of the replicas (a connection string that names one node alone,
// without target_session_attrs), reports that the session is not on the
// primary.
func replicaNotDurable(ctx context.Context, p *fault.Patroni) error {
	replica := (p.Leader() + 1) % p.Nodes()
	pool, err := pgxpool.New(ctx, p.NodeURL(replica))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	defer pool.Close()
	derr := postgres.CheckDurability(ctx, pool)
	if !errors.Is(derr, postgres.ErrNotDurable) || !strings.Contains(derr.Error(), "pg_is_in_recovery") {
		return fmt.Errorf("%w: CheckDurability on a Patroni replica = %v, want ErrNotDurable saying the session is on a standby", ErrSetup, derr)
	}
	return nil
}
