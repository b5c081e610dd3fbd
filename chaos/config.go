package chaos

import (
	"fmt"
	"io"
	"log/slog"
	"sort"
	"time"

	"github.com/oncekey/oncekey/chaos/internal/broken"
)

// Defaults of a [Config].
const (
	DefaultIterations = 40
	DefaultClients    = 3
	DefaultParallel   = 6
	DefaultLease      = 300 * time.Millisecond
	DefaultSeed       = 1
	DefaultNATSURL    = "nats://127.0.0.1:4222"
	DefaultAMQPURL    = "amqp://guest:guest@127.0.0.1:5672/"
)

// Config configures [Run].
type Config struct {
	// RedisURL is the Redis the scenarios use (redis://host:port/db).
	// Required. Keys go under a prefix of the run's own, deleted at the
	// end. Scenarios that restart, fail over, split or evict Redis start
	// redis-server processes of their own instead.
	RedisURL string
	// PostgresURL is the PostgreSQL database. Required. The run creates a
	// schema of its own and drops it at the end.
	PostgresURL string
	// NATSURL is the NATS server with JetStream of the nats-windows
	// scenario (a stream of the run's own, deleted at the end). Defaults
	// to DefaultNATSURL.
	NATSURL string
	// AMQPURL is the RabbitMQ of the amqp-windows scenario (a queue of
	// the run's own, deleted at the end). Defaults to DefaultAMQPURL.
	AMQPURL string
	// Scenarios selects scenarios by name ([Scenarios] lists them). Empty
	// runs every one.
	Scenarios []string
	// Iterations is the number of logical operations per scenario, each
	// retried concurrently by Clients clients. Defaults to 40.
	Iterations int
	// Clients is how many clients retry each operation concurrently, each
	// with a Claimer (and Redis client) of its own, like instances of one
	// service. Defaults to 3; at least 2.
	Clients int
	// Parallel is how many operations run at once. Defaults to 6.
	Parallel int
	// Seed draws the fault schedule: the same seed gives the same schedule.
	// Defaults to 1.
	Seed int64
	// Lease is the lease of every claim. Operators use it to try the lease
	// length they mean to run with; the pauses and timeouts of the
	// scenarios scale with it. Defaults to 300ms; at least 100ms, the
	// library's floor (claim.ErrInvalidLease).
	Lease time.Duration
	// Progress, when set, gets a line per scenario as it finishes.
	Progress io.Writer
	// Logger, when set, gets the library's logs. Defaults to none.
	Logger *slog.Logger
	// KeepSchema leaves the run's PostgreSQL schema in place, to look at.
	KeepSchema bool
	// Servers, when set, starts the own servers of redis-restart (a
	// Redis), redis-failover and split-brain (two Redis),
	// redis-sentinel (a Redis, a replica, three Sentinels), pg-crash and
	// pg-crash-async-commit (a PostgreSQL), pg-failover-sync and
	// pg-failover-async (a PostgreSQL and a streaming standby) instead of
	// processes from the machine's redis-server and PostgreSQL binaries;
	// those scenarios then need neither. The chaos runner's -containers
	// sets one that runs them in containers, restarted, killed and frozen
	// through the container API. See [Servers].
	Servers Servers

	// negative is the deliberately broken store of the negative control;
	// only the suite sets it (see negative_test.go and the runner's
	// -negative flag, through NegativeControl).
	negative broken.Mode
}

// NegativeControl returns cfg set up to run against a deliberately broken
// store: mode "complete-without-fence" accepts completions from stale
// tokens, "claim-trusts-redis" overwrites records on every claim,
// "release-after-start" gives a key back once work started under a lease
// (MarkUncertain releases, and so does a renewal or finish that could not
// be written), "no-reread-after-lost-ack" takes a COMMIT or fenced finish
// whose reply was lost as not applied, and "worker-clock-lease" measures
// leases with the worker's (skewed) clock; "one-attempt", "release-on-error"
// and "no-recover" break the settlement engine of every entry point
// instead (one try of the finishing write; a release for every outcome but
// a completion; a panic neither recovered nor its renewals stopped), and
// "retry-takes-lease" the Claimers' Redis clients (every lease claim.lua
// grants confirmed at once, so a retry that only replays holds a lease
// and the retries beside it are told "in progress"); "do-skips-lock" runs
// Do's function without the key's lock and the check for a record (a
// duplicate that reaches the database runs it beside the first). The
// checker must then report
// violations; a run that finds none means the suite cannot see the bug.
// It returns an error for an unknown mode, and [ErrNotBuilt] for the
// three settlement modes in a binary built without -tags
// oncekey_negative.
func NegativeControl(cfg Config, mode string) (Config, error) {
	for _, m := range broken.Modes() {
		if string(m) == mode {
			if err := negativeBuilt(m); err != nil {
				return cfg, err
			}
			cfg.negative = m
			return cfg, nil
		}
	}
	return cfg, fmt.Errorf("%w: negative control %q (want one of %v)", ErrConfig, mode, broken.Modes())
}

// negativeBuilt returns ErrNotBuilt for a mode this binary cannot run:
// one that breaks the settlement engine, without -tags oncekey_negative.
func negativeBuilt(m broken.Mode) error {
	if m.Settlement() && !broken.SettlementBuilt {
		return fmt.Errorf("%w: negative control %q breaks the library's settlement engine, which only a build with that tag can (go run -tags oncekey_negative ./chaos/cmd/chaos, go test -tags oncekey_negative)", ErrNotBuilt, m)
	}
	return nil
}

// NegativeModes lists the negative-control modes and the scenarios whose
// faults expose each; the three that break the settlement engine run only
// in a binary built with -tags oncekey_negative ([NegativeControl]).
func NegativeModes() map[string][]string {
	return map[string][]string{
		string(broken.CompleteWithoutFence):      {"stale-owner", "paused-owner", "clock-skew", "async-river", "pg-network", "nemesis"},
		string(broken.ClaimTrustsRedis):          {"redis-restart", "redis-down", "pgbouncer"},
		string(broken.ReleaseAfterStart):         {"http-renewals-fail", "http-panic-after-effect", "http-finish-outage-long", "reconcile-after-retention"},
		string(broken.NoRereadAfterLostAck):      {"db-cut-after-commit", "nemesis"},
		string(broken.WorkerClockLease):          {"clock-skew"},
		string(broken.CommitOverExisting):        {"redis-restart", "redis-failover", "redis-eviction"},
		string(broken.UnresolvedStaysProcessing): {"reconcile-unresolved"},
		string(broken.ExpiresInInflated):         {"replay-cache"},
		string(broken.ReplayIgnoresFingerprint):  {"mismatch", "no-redis"},
		string(broken.RetryTakesLease):           {"finished-bursts"},
		string(broken.DoSkipsLock):               {"do-duplicates", "no-redis"},
		string(broken.TrustLease):                {"split-brain"},
		string(broken.OneAttempt):                {"grpc-windows", "nats-windows", "amqp-windows", "kafka-windows", "river-windows"},
		string(broken.ReleaseOnError):            {"grpc-windows", "nats-windows", "amqp-windows", "kafka-windows", "river-windows"},
		string(broken.NoRecover):                 {"grpc-windows", "nats-windows", "amqp-windows", "kafka-windows", "river-windows"},
	}
}

// NegativeModeBreaks says, in a line, what the broken store of mode
// breaks; "" for an unknown mode.
func NegativeModeBreaks(mode string) string { return broken.Mode(mode).Breaks() }

func (c Config) normalized() (Config, error) {
	if c.RedisURL == "" {
		return c, fmt.Errorf("%w: RedisURL is required", ErrConfig)
	}
	if c.PostgresURL == "" {
		return c, fmt.Errorf("%w: PostgresURL is required", ErrConfig)
	}
	if c.Iterations == 0 {
		c.Iterations = DefaultIterations
	}
	if c.NATSURL == "" {
		c.NATSURL = DefaultNATSURL
	}
	if c.AMQPURL == "" {
		c.AMQPURL = DefaultAMQPURL
	}
	if c.Clients == 0 {
		c.Clients = DefaultClients
	}
	if c.Parallel == 0 {
		c.Parallel = DefaultParallel
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.Seed == 0 {
		c.Seed = DefaultSeed
	}
	switch {
	case c.Iterations < 1:
		return c, fmt.Errorf("%w: Iterations must be at least 1, got %d", ErrConfig, c.Iterations)
	case c.Clients < 2 || c.Clients > 16:
		return c, fmt.Errorf("%w: Clients must be 2 to 16, got %d", ErrConfig, c.Clients)
	case c.Parallel < 1 || c.Parallel > 64:
		return c, fmt.Errorf("%w: Parallel must be 1 to 64, got %d", ErrConfig, c.Parallel)
	case c.Lease < 100*time.Millisecond:
		return c, fmt.Errorf("%w: Lease must be at least 100ms (the library's floor), got %v", ErrConfig, c.Lease)
	}
	if err := negativeBuilt(c.negative); err != nil {
		return c, err
	}
	known := map[string]bool{}
	for _, s := range append(registry(), hazards()...) {
		known[s.name] = true
	}
	for _, n := range c.Scenarios {
		if !known[n] {
			return c, fmt.Errorf("%w: %q", ErrUnknownScenario, n)
		}
	}
	return c, nil
}

// Result is what one scenario came to.
type Result struct {
	Scenario string `json:"scenario"`
	// Forces is what the scenario forces, in a sentence.
	Forces string `json:"forces"`
	// Iterations is the number of logical operations.
	Iterations int `json:"iterations"`
	// Operations is the number of calls the clients made (claims, Do,
	// completions, replays), all recorded in the history.
	Operations int `json:"operations"`
	// Faults counts the faults that fired, by kind.
	Faults map[string]int64 `json:"faults"`
	// FaultsTotal is their sum. Zero means the scenario proved nothing.
	FaultsTotal int64 `json:"faults_total"`
	// Observed counts outcomes (replays, fenced completions, takeovers,
	// mismatches, ...), for reading the run, not for judging it.
	Observed map[string]int64 `json:"observed"`
	// Violations are the broken invariants the checker found.
	Violations []Violation `json:"violations"`
	// Acknowledged is how many operations a client got a result for.
	Acknowledged int `json:"acknowledged"`
	// Inconclusive counts operations whose linearizability search timed
	// out (not counted as violations).
	Inconclusive int `json:"inconclusive"`
	// Schedule is the digest of the fault schedule drawn from the seed.
	Schedule string `json:"schedule"`
	// Duration is how long the scenario ran.
	Duration time.Duration `json:"duration_ns"`
	// Skipped says why the scenario did not run (redis-server missing).
	Skipped string `json:"skipped,omitempty"`
	// Error is set when the scenario could not run to the end; it counts
	// as a failure.
	Error string `json:"error,omitempty"`
	// Repeated is, for a scenario that cycles an infrastructure fault for
	// the whole run, how often its main fault fired and how often it must
	// ([RepeatedFaultsRequired]); fewer fails the run.
	Repeated *Repeated `json:"repeated,omitempty"`
	// Timeline is when each infrastructure fault of the scenario was put
	// in place and healed (the runner's -html draws it).
	Timeline []FaultSpan `json:"timeline,omitempty"`
}

// Failed reports whether the result fails the run: a violation, an error,
// a scenario with a kind of fault that never fired (it proved nothing
// about that fault), or a repeated scenario whose main fault fired fewer
// times than required at its size.
func (r Result) Failed() bool {
	return len(r.Violations) > 0 || r.Error != "" || (r.Skipped == "" && (len(r.Unfired()) > 0 || r.TooFew()))
}

// TooFew reports whether a repeated scenario fired its main fault fewer
// times than required at its size (see [Result.Repeated]).
func (r Result) TooFew() bool {
	return r.Repeated != nil && r.Repeated.Fired < int64(r.Repeated.Required)
}

// Unfired lists the kinds of fault the scenario injects that never fired;
// every kind when none did.
func (r Result) Unfired() []string {
	var out []string
	for k, v := range r.Faults {
		if v == 0 {
			out = append(out, k)
		}
	}
	if r.FaultsTotal == 0 && len(out) == 0 {
		out = append(out, "all")
	}
	sort.Strings(out)
	return out
}

// Violation is one broken invariant the checker found.
type Violation struct {
	// Invariant names the rule, for example "at-most-one-effect",
	// "acked-has-one-effect", "replays-identical", "generation-monotonic",
	// "one-owner-per-generation", "no-stale-completion", "linearizable",
	// "acked-result-durable", "stuck-reported-not-deleted",
	// "retention-new-operation", "finished-never-in-progress" or
	// "one-fn-run-at-a-time"; a scenario may name one of its own.
	Invariant string `json:"invariant"`
	// Op is the logical operation concerned (key and epoch), when one is.
	Op string `json:"op,omitempty"`
	// Detail says what was seen.
	Detail string `json:"detail"`
}

// String returns "invariant [op]: detail".
func (v Violation) String() string {
	if v.Op == "" {
		return v.Invariant + ": " + v.Detail
	}
	return v.Invariant + " [" + v.Op + "]: " + v.Detail
}

// Report is the result of [Run].
type Report struct {
	Seed            int64         `json:"seed"`
	Lease           time.Duration `json:"lease_ns"`
	Iterations      int           `json:"iterations"`
	Clients         int           `json:"clients"`
	NegativeControl string        `json:"negative_control,omitempty"`
	Results         []Result      `json:"results"`
	Violations      int           `json:"violations"`
	Duration        time.Duration `json:"duration_ns"`
}

// Failed reports whether any scenario failed.
func (r Report) Failed() bool {
	for _, x := range r.Results {
		if x.Failed() {
			return true
		}
	}
	return false
}
