package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/chaos/internal/broken"
	"github.com/oncekey/oncekey/chaos/internal/check"
	"github.com/oncekey/oncekey/chaos/internal/fault"
	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/testkit/redisproc"
)

// ScenarioInfo describes a scenario.
type ScenarioInfo struct {
	Name string
	// Forces says what it forces.
	Forces string
	// OwnRedis reports that it starts redis-server processes of its own.
	OwnRedis bool
	// OwnPostgres reports that it starts PostgreSQL clusters of its own.
	OwnPostgres bool
	// OnServers reports that its own servers come from [Config.Servers]
	// when set (containers, under the runner's -containers).
	OnServers bool
	// Repeats is, for a scenario that cycles an infrastructure fault for
	// the whole run, its main fault ([Result.Repeated]).
	Repeats string
}

// Scenarios lists every scenario, in the order [Run] runs them.
func Scenarios() []ScenarioInfo {
	var out []ScenarioInfo
	for _, s := range registry() {
		out = append(out, ScenarioInfo{Name: s.name, Forces: s.forces, OwnRedis: s.ownRedis, OwnPostgres: s.ownPostgres, OnServers: s.onServers, Repeats: s.repeats})
	}
	return out
}

// Run runs the selected scenarios one after another against the Redis and
// PostgreSQL of cfg and checks each with the suite's checker. It returns an
// error only when the run cannot start (a bad config, a service that does
// not answer); a scenario that fails is reported in its [Result] (see
// [Report.Failed]). ctx bounds the whole run.
func Run(ctx context.Context, cfg Config) (Report, error) {
	cfg, err := cfg.normalized()
	if err != nil {
		return Report{}, err
	}
	started := time.Now()
	run, err := newRun(ctx, cfg)
	if err != nil {
		return Report{}, err
	}
	defer run.close()
	// A broken settlement is the library's engine, for the whole process:
	// every entry point settles through it.
	defer broken.BreakSettlement(cfg.negative)()
	rep := Report{Seed: cfg.Seed, Lease: cfg.Lease, Iterations: cfg.Iterations, Clients: cfg.Clients, NegativeControl: string(cfg.negative)}
	want := map[string]bool{}
	for _, n := range cfg.Scenarios {
		want[n] = true
	}
	all := registry()
	if len(want) > 0 {
		all = append(all, hazards()...)
	}
	for _, s := range all {
		if len(want) > 0 && !want[s.name] {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		res := run.scenario(ctx, s)
		rep.Results = append(rep.Results, res)
		rep.Violations += len(res.Violations)
		if cfg.Progress != nil {
			fmt.Fprintln(cfg.Progress, progressLine(res))
		}
	}
	rep.Duration = time.Since(started)
	return rep, nil
}

func progressLine(r Result) string {
	switch {
	case r.Skipped != "":
		return fmt.Sprintf("chaos: %-22s skipped: %s", r.Scenario, r.Skipped)
	case r.Error != "":
		return fmt.Sprintf("chaos: %-22s ERROR: %s", r.Scenario, r.Error)
	}
	verdict := "ok"
	if r.Failed() {
		verdict = "FAIL"
	}
	repeated := ""
	if r.Repeated != nil {
		repeated = fmt.Sprintf(", %s %d times (%d required)", r.Repeated.Fault, r.Repeated.Fired, r.Repeated.Required)
		if r.Repeated.Note != "" {
			repeated += " (" + r.Repeated.Note + ")"
		}
	}
	return fmt.Sprintf("chaos: %-22s %4s  %d ops, %d calls, %d faults (%s)%s, %d violations, %v",
		r.Scenario, verdict, r.Iterations, r.Operations, r.FaultsTotal, faultList(r.Faults), repeated, len(r.Violations), r.Duration.Round(time.Millisecond))
}

func faultList(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s=%d", k, m[k])
	}
	return b.String()
}

// runEnv is what every scenario of one run shares.
type runEnv struct {
	cfg      Config
	id       string
	schema   string
	admin    *pgxpool.Pool
	redisOpt *redis.Options
	tables   history.Tables
	log      *slog.Logger
}

func newRun(ctx context.Context, cfg Config) (*runEnv, error) {
	var b [5]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	r := &runEnv{cfg: cfg, id: id, schema: "chaos_" + id, log: cfg.Logger}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	ropt, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("%w: redis URL: %w", ErrSetup, err)
	}
	r.redisOpt = ropt
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	probe := redis.NewClient(ropt)
	err = probe.Ping(pctx).Err()
	probe.Close()
	if err != nil {
		return nil, fmt.Errorf("%w: redis at %s: %w", ErrSetup, ropt.Addr, err)
	}
	pcfg, err := pgxpool.ParseConfig(cfg.PostgresURL)
	if err != nil {
		return nil, fmt.Errorf("%w: postgres URL: %w", ErrSetup, err)
	}
	pcfg.MaxConns = 8
	pcfg.ConnConfig.RuntimeParams["application_name"] = "oncekey-chaos-admin"
	admin, err := pgxpool.NewWithConfig(pctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("%w: postgres: %w", ErrSetup, err)
	}
	r.admin = admin
	if _, err := admin.Exec(pctx, "CREATE SCHEMA "+r.schema); err != nil {
		admin.Close()
		return nil, fmt.Errorf("%w: create schema: %w", ErrSetup, err)
	}
	if r.tables, err = history.NewTables(r.schema); err == nil {
		err = r.tables.Create(pctx, admin)
	}
	if err == nil {
		err = postgres.Migrate(pctx, admin, postgres.WithSchema(r.schema))
	}
	if err != nil {
		r.close()
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	return r, nil
}

func (r *runEnv) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if !r.cfg.KeepSchema {
		if _, err := r.admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+r.schema+" CASCADE"); err != nil {
			r.log.Warn("chaos: drop schema", "schema", r.schema, "err", err)
		}
	}
	r.admin.Close()
}

// scenario runs one scenario in an env of its own and checks it.
func (r *runEnv) scenario(ctx context.Context, s scenario) (res Result) {
	res = Result{Scenario: s.name, Forces: s.forces, Iterations: r.cfg.Iterations}
	started := time.Now()
	defer func() { res.Duration = time.Since(started) }()
	onServers := s.onServers && r.cfg.Servers != nil
	if s.ownRedis && !onServers {
		if _, err := redisproc.Binary(); err != nil {
			res.Skipped = "redis-server is not installed; this scenario starts its own (install redis-server or set REDIS_SERVER)"
			return res
		}
	}
	if s.ownPostgres && !onServers {
		if _, err := fault.PostgresBin(); err != nil {
			res.Skipped = err.Error()
			return res
		}
	}
	if s.needs != nil {
		if err := s.needs(); err != nil {
			res.Skipped = err.Error()
			return res
		}
	}
	e, err := r.newEnv(ctx, s)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer e.close()
	in, err := e.execute(ctx, s)
	if errors.Is(err, ErrServersUnsupported) {
		// Config.Servers cannot start this scenario's servers (see
		// Servers): nothing ran.
		res.Skipped = err.Error()
		return res
	}
	res.Schedule = e.sched.digest()
	res.Faults = e.faultCounts()
	for _, v := range res.Faults {
		res.FaultsTotal += v
	}
	res.Observed = e.observed()
	res.Operations = len(in.Calls)
	res.Timeline = e.timeline()
	if s.repeats != "" {
		res.Repeated = &Repeated{Fault: s.repeats, Fired: res.Faults[s.repeats], Required: RepeatedFaultsRequired(r.cfg.Iterations)}
		e.mu.Lock()
		if e.onceWhy != "" {
			res.Repeated.Required, res.Repeated.Note = 1, e.onceWhy
		}
		e.mu.Unlock()
	}
	if err != nil {
		res.Error = err.Error()
		return res
	}
	rep := check.Check(in, check.Options{Timeout: 10 * time.Second})
	if rep.Violations != nil {
		res.Violations = make([]Violation, len(rep.Violations))
		for i, v := range rep.Violations {
			res.Violations[i] = Violation(v)
		}
	}
	res.Acknowledged = rep.Acknowledged
	res.Inconclusive = rep.Inconclusive
	return res
}

// env is one scenario's world.
type env struct {
	*runEnv
	name   string
	sched  *schedule
	rec    *history.Recorder
	prefix string
	tenant string

	pool *pgxpool.Pool // the library's
	app  string        // its application_name

	mu       sync.Mutex
	faults   map[string]*atomic.Int64
	obs      map[string]*atomic.Int64
	closers  []func()
	ops      map[string]*op // by operation identity
	byKey    map[string]*op // by idempotency key
	extra    []check.Violation
	swept    map[string]bool
	stuck    *check.Stuck
	keyspace map[[32]byte]string
	// brokenRedis: the Redis clients given the negative control's bug.
	brokenRedis map[redis.Scripter]bool
	// atCommit: the scenario's Claimers, each with whether it has
	// claim.WithWriteAtCommit (see env.locked).
	atCommit map[*claim.Claimer[pgxTx]]bool
	bgs      sync.WaitGroup
	bgMu     sync.Mutex // serializes infrastructure faults
	spans    []FaultSpan
	onceWhy  string // see repeatOnce

	httpc *http.Client
}

// bg runs an infrastructure fault in the background, one at a time;
// execute waits for them all before the verification pass.
func (e *env) bg(f func()) {
	e.bgs.Add(1)
	go func() {
		defer e.bgs.Done()
		e.bgMu.Lock()
		defer e.bgMu.Unlock()
		f()
	}()
}

func (e *env) bgWait() { e.bgs.Wait() }

func (r *runEnv) newEnv(ctx context.Context, s scenario) (*env, error) {
	e := &env{
		runEnv: r, name: s.name, sched: newSchedule(r.cfg.Seed, s.name), rec: history.NewRecorder(),
		prefix: "chaos-" + r.id + "-" + s.name, tenant: "chaos-" + r.id,
		app: "oncekey-chaos-" + r.id, faults: map[string]*atomic.Int64{}, obs: map[string]*atomic.Int64{},
		ops: map[string]*op{}, byKey: map[string]*op{}, swept: map[string]bool{}, keyspace: map[[32]byte]string{},
		httpc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
	}
	e.onClose(e.httpc.CloseIdleConnections)
	pool, err := e.newPool(ctx, "")
	if err != nil {
		return nil, err
	}
	e.pool = pool
	e.onClose(e.cleanRedis)
	return e, nil
}

// newPool opens a library pool; host, when set, replaces the database's
// address (a fault proxy in front of it).
func (e *env) newPool(ctx context.Context, host string) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(e.cfg.PostgresURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	pcfg.MaxConns = int32(e.cfg.Parallel*e.cfg.Clients + 6)
	pcfg.ConnConfig.RuntimeParams["application_name"] = e.app
	if host != "" {
		h, p, err := splitHostPort(host)
		if err != nil {
			return nil, err
		}
		pcfg.ConnConfig.Host, pcfg.ConnConfig.Port = h, p
		pcfg.ConnConfig.TLSConfig, pcfg.ConnConfig.Fallbacks = nil, nil
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(pctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("%w: library pool: %w", ErrSetup, err)
	}
	e.onClose(pool.Close)
	return pool, nil
}

func (e *env) onClose(f func()) {
	e.mu.Lock()
	e.closers = append(e.closers, f)
	e.mu.Unlock()
}

func (e *env) close() {
	e.mu.Lock()
	cs := e.closers
	e.closers = nil
	e.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}

// cleanRedis deletes the scenario's keys from the user's Redis.
func (e *env) cleanRedis() {
	c := redis.NewClient(e.redisOpt)
	defer c.Close()
	flushPrefix(context.Background(), c, e.prefix, 10*time.Second)
}

// fault counts one fired fault of kind.
func (e *env) fault(kind string) { e.faultN(kind, 1) }

func (e *env) faultN(kind string, n int64) {
	if n <= 0 {
		e.counter(e.faults, kind)
		return
	}
	e.counter(e.faults, kind).Add(n)
}

// observe counts an outcome worth reading in the report.
func (e *env) observe(what string) { e.counter(e.obs, what).Add(1) }

func (e *env) counter(m map[string]*atomic.Int64, k string) *atomic.Int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	c, ok := m[k]
	if !ok {
		c = &atomic.Int64{}
		m[k] = c
	}
	return c
}

func (e *env) faultCounts() map[string]int64 { return e.snapshot(e.faults) }

func (e *env) observed() map[string]int64 {
	out := e.snapshot(e.obs)
	for k, v := range e.rec.Counts() {
		out["calls:"+string(k)] = int64(v)
	}
	return out
}

func (e *env) snapshot(m map[string]*atomic.Int64) map[string]int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]int64, len(m))
	for k, v := range m {
		out[k] = v.Load()
	}
	return out
}

// violation records a scenario's own finding.
func (e *env) violation(inv, op, format string, args ...any) {
	e.mu.Lock()
	e.extra = append(e.extra, check.Violation{Invariant: inv, Op: op, Detail: fmt.Sprintf(format, args...)})
	e.mu.Unlock()
}

// execute runs the scenario, the verification pass, and gathers the
// checker's input.
func (e *env) execute(ctx context.Context, s scenario) (check.Input, error) {
	w, err := s.setup(ctx, e)
	if err != nil {
		return check.Input{}, err
	}
	ops := e.newOps(e.cfg.Iterations, w)
	rs := e.records()
	sampler := history.StartSampler(rs, e.admin, e.rec, 25*time.Millisecond)
	runErr := e.runAll(ctx, w, ops)
	e.bgWait()
	if runErr == nil {
		e.verify(ctx, w, ops)
	}
	samples := sampler.Stop()
	if runErr == nil && w.after != nil {
		runErr = w.after(ctx, e, ops)
	}
	in := check.Input{Calls: e.rec.Calls(), Runs: e.rec.Runs(), Samples: samples}
	if runErr != nil {
		return in, runErr
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if in.Records, err = rs.Read(rctx, e.admin); err != nil {
		e.mu.Lock()
		for _, v := range e.extra {
			err = fmt.Errorf("%w (before it: %s)", err, v)
		}
		e.mu.Unlock()
		return in, err
	}
	if in.Effects, err = e.tables.ReadEffects(rctx, e.admin, e.name); err != nil {
		return in, err
	}
	if w.downstream != nil {
		in.DownstreamConflicts = w.downstream.Conflicts()
	}
	e.mu.Lock()
	in.Extra = append(in.Extra, e.extra...)
	in.Swept, in.Stuck = e.swept, e.stuck
	e.mu.Unlock()
	return in, nil
}

// storeTable is the durable store's table (postgres' default name).
const storeTable = "idempotency_requests"

func (e *env) records() history.Records {
	return history.Records{Table: e.schema + "." + storeTable, Tenant: e.tenant, Operation: e.name, Keys: e.keyspace}
}

var errCrash = errors.New("chaos: simulated crash")

// pgxTx names the transaction type of the PostgreSQL store.
type pgxTx = pgx.Tx
