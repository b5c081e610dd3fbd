package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/oncekey/oncekey/testkit/testenv"
)

// oneWayServers are the process servers with PostgreSQL that cannot
// change roles (no PostgresNode), as the runner's containers are: what
// pg-failover-sync does on them is what it does under -containers.
type oneWayServers struct{ processes }

type plainPostgres struct{ PostgresServer }
type plainStandby struct{ PostgresStandby }

func (s oneWayServers) Postgres(ctx context.Context, settings ...string) (PostgresServer, error) {
	p, err := s.processes.Postgres(ctx, settings...)
	if err != nil {
		return nil, err
	}
	return plainPostgres{p}, nil
}

func (s oneWayServers) PostgresStandby(ctx context.Context, primary PostgresServer) (PostgresStandby, error) {
	st, err := s.processes.PostgresStandby(ctx, primary.(plainPostgres).PostgresServer)
	if err != nil {
		return nil, err
	}
	return plainStandby{st}, nil
}

// TestFailover_OnServersThatCannotRejoin: on servers whose PostgreSQL
// cannot rejoin an old primary as a standby (the runner's containers),
// pg-failover-sync fails over once, and its result says so: its main
// fault must fire once, the note says why, and the run passes.
func TestFailover_OnServersThatCannotRejoin(t *testing.T) {
	cfg := Config{RedisURL: testenv.RedisURL(t), PostgresURL: testenv.DatabaseURL(t), Scenarios: []string{"pg-failover-sync"},
		Iterations: 12, Lease: 300 * time.Millisecond, Seed: 7, Servers: oneWayServers{}}
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Results[0]
	if r.Skipped != "" && !testenv.CI() {
		t.Skip(r.Skipped)
	}
	if r.Repeated == nil || r.Repeated.Required != 1 || r.Repeated.Fired != 1 || r.Repeated.Note == "" {
		t.Fatalf("repeated %+v, want one failover, required once, with a note", r.Repeated)
	}
	if r.Failed() {
		t.Fatalf("failed: %v %s %v", r.Violations, r.Error, r.Faults)
	}
	if _, ok := r.Faults["old-primary-rejoined"]; ok {
		t.Errorf("faults %v: no rejoin on these servers", r.Faults)
	}
}
