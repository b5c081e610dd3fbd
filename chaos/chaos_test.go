package chaos_test

import (
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oncekey/oncekey/chaos"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// ciIterations is the number of logical operations per scenario in CI:
// all scenarios together stay well within a few minutes on two cores.
const ciIterations = 20

// config returns a run on the test services with a CI-sized budget.
func config(t *testing.T, scenarios ...string) chaos.Config {
	t.Helper()
	cfg := chaos.Config{
		RedisURL:    testenv.RedisURL(t),
		PostgresURL: testenv.DatabaseURL(t),
		NATSURL:     testenv.NATSURL(t),
		AMQPURL:     testenv.AMQPURL(t),
		Scenarios:   scenarios,
		Iterations:  ciIterations,
		Lease:       300 * time.Millisecond,
		Seed:        7,
		Progress:    testWriter{t},
	}
	if d, err := time.ParseDuration(os.Getenv("CHAOS_LEASE")); err == nil {
		cfg.Lease = d
	}
	if os.Getenv("CHAOS_LOG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return cfg
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// entryFamilies are the scenarios that drive an adapter's own settlement
// (renewal goroutine, finish retries) under -race through many windows at
// once, and the HTTP windows whose checks count on every renewal landing
// within the lease (the soak's second effects and a CI run's "record is
// uncertain" in http-finish-outage-long were renewals that came late; the
// README test command run beside a chaos run on 2026-12-05, load 8, had
// http-oversized-response's renewals land after its 300ms lease twice);
// familyLease is their lease in this test.
var entryFamilies = []string{"grpc-windows", "nats-windows", "river-windows", "amqp-windows", "kafka-windows",
	"http-client-timeout", "http-client-disconnect", "http-oversized-response",
	"http-finish-outage-short", "http-finish-outage-long"}

// familyLease is the entry-point families' lease under `go test -race` on
// CI's two cores: at the suite's 300ms, the start of a family (a server,
// 60 concurrent calls, the race detector) stalled a renewal goroutine past
// the lease about once in eight runs of grpc-windows alone (the lease
// watch said "no renewal sent for 305ms"), a takeover the guarantee allows
// after a stall longer than the lease, and a flake here. At 1s they ran
// clean 6 of 6 each. The soak runs them at 300ms (chaos/README.md).
const familyLease = time.Second

// openHoles are scenarios that still find a hole in the library, each
// with the hole: TestScenarios leaves them out of its run of the correct
// library (it would fail as often as the hole is met) until it is closed,
// and TestNegativeControl still runs them with the broken modes they must
// catch. chaos/README.md ("Repeated faults and the nemesis") describes
// each; remove the entry with the fix.
var openHoles = map[string]string{
	"nemesis": "a COMMIT waiting for a synchronous standby that is gone, cancelled when its context ends, commits locally; " +
		"the re-read after the lost reply (or a retry's replay) acknowledges it and the failover that follows loses it " +
		"(seed 7, 20 operations: 1 run in 6)",
}

// TestScenarios runs every scenario and requires zero violations and that
// every kind of fault each scenario injects actually fired: the entry-point
// families at familyLease, the others at the suite's lease. Set
// CHAOS_SCENARIOS=a,b to run some (at the suite's lease), CHAOS_LEASE=1s to
// try another lease.
func TestScenarios(t *testing.T) {
	if s := os.Getenv("CHAOS_SCENARIOS"); s != "" {
		names := strings.Split(s, ",")
		runScenarios(t, config(t, names...), len(names))
		return
	}
	var rest []string
	for _, s := range chaos.Scenarios() {
		if !slices.Contains(entryFamilies, s.Name) && openHoles[s.Name] == "" {
			rest = append(rest, s.Name)
		}
	}
	if len(rest)+len(entryFamilies)+len(openHoles) != len(chaos.Scenarios()) {
		t.Fatalf("the entry-point families %v and the open holes %v are not all scenarios", entryFamilies, openHoles)
	}
	for name, why := range openHoles {
		t.Logf("%s is left out of this run of the correct library (its negative controls run it): %s", name, why)
	}
	runScenarios(t, config(t, rest...), len(rest))
	cfg := config(t, entryFamilies...)
	cfg.Lease = max(cfg.Lease, familyLease)
	runScenarios(t, cfg, len(entryFamilies))
}

// runScenarios runs cfg and checks each of its want results.
func runScenarios(t *testing.T, cfg chaos.Config, want int) {
	t.Helper()
	rep, err := chaos.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != want {
		t.Fatalf("%d scenarios ran, want %d", len(rep.Results), want)
	}
	for _, r := range rep.Results {
		t.Run(r.Scenario, func(t *testing.T) {
			ranToEnd(t, r)
			for _, v := range r.Violations {
				t.Errorf("violation: %s", v)
			}
			if u := r.Unfired(); len(u) > 0 {
				t.Errorf("faults that never fired: %v (fired: %v)", u, r.Faults)
			}
			if r.Acknowledged == 0 {
				t.Errorf("no operation was acknowledged: the workload did nothing")
			}
			checkRepeated(t, r)
			t.Logf("lease %v; faults %v; observed %v", cfg.Lease, r.Faults, r.Observed)
		})
	}
}

// repeatedScenarios are the infrastructure scenarios that cycle their
// fault for the whole run (issue 48), each with its main fault: it must
// fire chaos.RepeatedFaultsRequired times at the run's size.
var repeatedScenarios = map[string]string{
	"pg-failover-sync":      "primary-killed",
	"pg-crash":              "postgres-killed",
	"pgbouncer":             "pgbouncer-restarted",
	"redis-sentinel":        "sentinel-failover",
	"patroni-kill-leader":   "leader-killed",
	"patroni-dcs-partition": "leader-cut-from-dcs",
	"patroni-switchover":    "switchover",
}

// checkRepeated fails r, a result of a repeated scenario, when its main
// fault is not the one it must repeat or fired fewer times than required.
func checkRepeated(t *testing.T, r chaos.Result) {
	t.Helper()
	want, ok := repeatedScenarios[r.Scenario]
	if !ok {
		return
	}
	switch {
	case r.Repeated == nil || r.Repeated.Fault != want || r.Repeated.Note != "":
		t.Errorf("repeated %+v, want the main fault %s counted", r.Repeated, want)
	case r.Repeated.Required != chaos.RepeatedFaultsRequired(r.Iterations) || r.Repeated.Fired < int64(chaos.RepeatedFaultsRequired(r.Iterations)):
		t.Errorf("%s fired %d times at %d operations, want at least %d", want, r.Repeated.Fired, r.Iterations, chaos.RepeatedFaultsRequired(r.Iterations))
	default:
		t.Logf("%s fired %d times (%d required); timeline %v", want, r.Repeated.Fired, r.Repeated.Required, r.Timeline)
	}
}

// TestRepeated_Requirement pins what issue 48 asks of the repeated
// scenarios: each is marked with its main fault, at least 2 at CI's size
// and 20 at the soak's 1000, and a result short of it fails.
func TestRepeated_Requirement(t *testing.T) {
	got := map[string]string{}
	for _, s := range chaos.Scenarios() {
		if s.Repeats != "" {
			got[s.Name] = s.Repeats
		}
	}
	for name, fault := range repeatedScenarios {
		if got[name] != fault {
			t.Errorf("%s repeats %q, want %q", name, got[name], fault)
		}
	}
	if len(got) != len(repeatedScenarios) {
		t.Errorf("repeated scenarios %v, want %v", got, repeatedScenarios)
	}
	if n := chaos.RepeatedFaultsRequired(ciIterations); n < 2 {
		t.Errorf("required at CI's size: %d, want at least 2", n)
	}
	if n := chaos.RepeatedFaultsRequired(1000); n < 20 {
		t.Errorf("required at 1000 operations: %d, want at least 20", n)
	}
	r := chaos.Result{Scenario: "pg-crash", Iterations: 1000, Faults: map[string]int64{"postgres-killed": 19}, FaultsTotal: 19,
		Repeated: &chaos.Repeated{Fault: "postgres-killed", Fired: 19, Required: chaos.RepeatedFaultsRequired(1000)}}
	if !r.Failed() || !r.TooFew() {
		t.Errorf("a result with its main fault fired 19 times of 20 does not fail")
	}
	r.Repeated.Fired = 20
	if r.Failed() || r.TooFew() {
		t.Errorf("a result with its main fault fired 20 times of 20 fails")
	}
}

// ranToEnd skips the test for a scenario that was skipped (it fails it
// under CI=true) and fails it for one that did not run to the end.
func ranToEnd(t *testing.T, r chaos.Result) {
	t.Helper()
	switch {
	case r.Skipped != "" && testenv.CI():
		t.Fatalf("skipped under CI=true: %s", r.Skipped)
	case r.Skipped != "":
		t.Skip(r.Skipped)
	case r.Error != "":
		t.Fatalf("did not run to the end: %s", r.Error)
	}
}

// TestRun_SameSeedSameSchedule checks that the fault schedule is drawn
// from the seed alone.
func TestRun_SameSeedSameSchedule(t *testing.T) {
	digests := map[int64][]string{}
	for _, seed := range []int64{11, 11, 12} {
		cfg := config(t, "crash-before-commit", "downstream-incident")
		cfg.Seed, cfg.Iterations = seed, 6
		rep, err := chaos.Run(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		var d []string
		for _, r := range rep.Results {
			d = append(d, r.Schedule)
		}
		if prev, ok := digests[seed]; ok && strings.Join(prev, ",") != strings.Join(d, ",") {
			t.Fatalf("seed %d drew schedules %v, then %v", seed, prev, d)
		}
		digests[seed] = d
	}
	if strings.Join(digests[11], ",") == strings.Join(digests[12], ",") {
		t.Fatalf("seeds 11 and 12 drew the same schedules %v", digests[11])
	}
}

func TestRun_Config(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  chaos.Config
	}{
		{"NoRedis", chaos.Config{PostgresURL: "postgres://x"}},
		{"NoPostgres", chaos.Config{RedisURL: "redis://x"}},
		{"ShortLease", chaos.Config{RedisURL: "redis://x", PostgresURL: "postgres://x", Lease: time.Millisecond}},
		{"OneClient", chaos.Config{RedisURL: "redis://x", PostgresURL: "postgres://x", Clients: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := chaos.Run(t.Context(), c.cfg); err == nil || !strings.Contains(err.Error(), "invalid config") {
				t.Fatalf("Run = %v, want a config error", err)
			}
		})
	}
	t.Run("UnknownScenario", func(t *testing.T) {
		_, err := chaos.Run(t.Context(), chaos.Config{RedisURL: "redis://x", PostgresURL: "postgres://x", Scenarios: []string{"nope"}})
		if err == nil || !strings.Contains(err.Error(), "unknown scenario") {
			t.Fatalf("Run = %v, want ErrUnknownScenario", err)
		}
	})
	t.Run("UnknownNegativeMode", func(t *testing.T) {
		if _, err := chaos.NegativeControl(chaos.Config{}, "nope"); err == nil {
			t.Fatal("NegativeControl accepted an unknown mode")
		}
	})
}

// TestPostgresHazards runs the negative controls on PostgreSQL configured
// to lose acknowledged commits: the checker must report violations, and
// their faults must have fired. They are not part of TestScenarios.
func TestPostgresHazards(t *testing.T) {
	for _, name := range []string{"pg-crash-async-commit", "pg-failover-async", "patroni-async-failover"} {
		t.Run(name, func(t *testing.T) {
			// Three times the operations of the other scenarios: a hazard
			// is caught when a crash or failover finds acknowledged commits
			// not yet durable, and at 20 operations under a loaded CI
			// machine pg-crash-async-commit once found none (0 violations
			// in 113 calls; 7-14 in each of 10 runs alone).
			cfg := config(t, name)
			cfg.Iterations = 3 * ciIterations
			rep, err := chaos.Run(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Results) != 1 {
				t.Fatalf("%d results, want 1", len(rep.Results))
			}
			r := rep.Results[0]
			ranToEnd(t, r)
			if len(r.Violations) == 0 {
				t.Fatalf("%s: no violation reported: the hazard was not caught (faults %v)", name, r.Faults)
			}
			for _, v := range r.Violations[:min(5, len(r.Violations))] {
				t.Logf("caught: %s %s: %s", v.Invariant, v.Op, v.Detail)
			}
		})
	}
}
