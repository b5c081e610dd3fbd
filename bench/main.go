package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// config is the run's configuration, from the flags.
type config struct {
	redis, postgres string
	workloads       []string
	concurrency     int
	duration        time.Duration // measured time per workload, shared by its variants
	round           time.Duration // length of one round of one variant
	jsonPath        string
	htmlPath        string
	smoke           bool
	dups, keys      int // storm: duplicates per key, keys per variant
	replayKeys      int
	backlog         int // sweep: expired records per round
	records         int // -records: measure a record's size on disk instead
	pgConns         int
	redisTimeout    time.Duration
	cpuProfile      string
	memProfile      string

	// Open loop: -rate runs the open-loop variants of fresh and replay at
	// rate requests per second; -knee sweeps them through kneeRates.
	rate        float64
	maxInflight int
	openRound   time.Duration // length of one open-loop round of one variant
	knee        bool
	kneeP99     time.Duration
	kneeRates   []float64
	kneeStep    time.Duration // open-loop time per variant and rate

	closed bool     // run the closed-loop workloads (not when only -rate or -knee asks otherwise)
	open   []string // the workloads of the open-loop runs and knee sweeps
}

// openWorkloads are the workloads that have open-loop variants.
var openWorkloads = []string{"fresh", "replay"}

// defaultKneeRates is the knee sweep's default: 250/s doubling to 64000/s.
const defaultKneeRates = "250,500,1000,2000,4000,8000,16000,32000,64000"

var allWorkloads = []string{"fresh", "storm", "replay", "redis-down", "sweep", "finished-burst", "wake"}

func (c config) describe() map[string]any {
	return map[string]any{
		"workloads": c.workloads, "concurrency": c.concurrency, "duration": c.duration.String(),
		"round": c.round.String(), "smoke": c.smoke, "dups": c.dups, "keys": c.keys, "replay_keys": c.replayKeys,
		"backlog": c.backlog, "pg_conns": c.pgConns, "redis_timeout": c.redisTimeout.String(),
		"closed_loop": c.closed, "open_loop_workloads": c.open, "rate": c.rate, "max_inflight": c.maxInflight,
		"open_round": c.openRound.String(), "knee": c.knee, "knee_p99": c.kneeP99.String(), "knee_rates": c.kneeRates,
		"knee_step": c.kneeStep.String(), "records": c.records,
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// parseFlags reads the command line. -smoke changes the defaults of the
// sizing flags not given explicitly.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.redis, "redis", envOr("REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis URL (default $REDIS_URL, else the local server)")
	fs.StringVar(&c.postgres, "postgres", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL URL (default $DATABASE_URL, else the local server)")
	workloads := fs.String("workload", "all", "workloads to run, comma-separated: all or "+strings.Join(allWorkloads, ","))
	fs.IntVar(&c.concurrency, "concurrency", 32, "concurrent workers")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "measured time per workload, shared by its variants")
	fs.DurationVar(&c.round, "round", 250*time.Millisecond, "length of one round of one variant")
	fs.StringVar(&c.jsonPath, "json", "", "write a JSON report to this file")
	fs.StringVar(&c.htmlPath, "html", "", "write an HTML page of latency percentile plots (and knee curves) to this file; no network needed to view it")
	fs.BoolVar(&c.smoke, "smoke", false, "short run of every workload (about 2s each) that checks correctness, not speed")
	fs.IntVar(&c.dups, "dups", 100, "storm: duplicates per key")
	fs.IntVar(&c.keys, "keys", 1000, "storm: keys per variant at most")
	fs.IntVar(&c.replayKeys, "replay-keys", 1000, "replay: completed keys retried")
	fs.IntVar(&c.backlog, "backlog", 100000, "sweep: expired records inserted before each sweep round")
	fs.IntVar(&c.records, "records", 0, "instead of the workloads, measure a record's size on disk: this many records (at least 1000), "+
		"1000 written through Do and the rest copied from them with new keys; bytes per record of the heap, TOAST and each index")
	fs.IntVar(&c.pgConns, "pg-conns", 16, "PostgreSQL pool size")
	fs.DurationVar(&c.redisTimeout, "redis-timeout", 50*time.Millisecond, "per-call Redis timeout of the library (lua.Options.Timeout)")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file")
	fs.StringVar(&c.memProfile, "memprofile", "", "write an allocation profile at the end to this file")
	fs.Float64Var(&c.rate, "rate", 0, "open loop: run fresh and replay at this many requests per second (0: off; -smoke: 100)")
	fs.IntVar(&c.maxInflight, "max-inflight", 10000, "open loop: requests in flight at most; a request due beyond it is dropped and counted")
	fs.DurationVar(&c.openRound, "open-round", time.Second, "open loop: length of one round of one variant")
	fs.BoolVar(&c.knee, "knee", false, "sweep fresh and replay open-loop through -knee-rates for the highest rate whose p99 stays within -knee-p99")
	fs.DurationVar(&c.kneeP99, "knee-p99", 50*time.Millisecond, "knee: the p99 bound")
	kneeRates := fs.String("knee-rates", defaultKneeRates, "knee: the rates to step through, ascending, comma-separated")
	fs.DurationVar(&c.kneeStep, "knee-step", 2*time.Second, "knee: open-loop time per variant and rate")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if fs.NArg() > 0 {
		return c, fmt.Errorf("%w: unexpected arguments %q", ErrConfig, fs.Args())
	}
	if c.smoke {
		for name, v := range map[string]string{"duration": "2s", "round": "100ms", "keys": "200", "replay-keys": "200", "backlog": "20000",
			"rate": "100", "open-round": "250ms"} {
			if !set[name] {
				_ = fs.Set(name, v)
			}
		}
	}
	if math.IsNaN(c.rate) || math.IsInf(c.rate, 0) || c.rate < 0 {
		return c, fmt.Errorf("%w: -rate must be a number of requests per second, 0 or more", ErrConfig)
	}
	// Without -smoke, -rate and -knee replace the closed-loop run; the
	// workloads then default to the open-loop ones.
	openMode := c.rate > 0 || c.knee
	c.closed = c.smoke || !openMode
	switch {
	case *workloads == "all" && !c.closed:
		c.workloads = openWorkloads
	case *workloads == "all":
		c.workloads = allWorkloads
	default:
		for _, w := range strings.Split(*workloads, ",") {
			if w = strings.TrimSpace(w); !slices.Contains(allWorkloads, w) {
				return c, fmt.Errorf("%w: unknown workload %q (have %s)", ErrConfig, w, strings.Join(allWorkloads, ", "))
			}
			c.workloads = append(c.workloads, w)
		}
	}
	if openMode {
		for _, w := range c.workloads {
			switch {
			case slices.Contains(openWorkloads, w):
				c.open = append(c.open, w)
			case !c.closed:
				return c, fmt.Errorf("%w: -rate and -knee run %s only, not %q", ErrConfig, strings.Join(openWorkloads, " and "), w)
			}
		}
	}
	if c.knee {
		rates, err := parseRates(*kneeRates)
		if err != nil {
			return c, err
		}
		c.kneeRates = rates
	}
	switch {
	case c.maxInflight < 1:
		return c, fmt.Errorf("%w: -max-inflight must be at least 1", ErrConfig)
	case c.openRound < time.Millisecond:
		return c, fmt.Errorf("%w: -open-round must be at least 1ms", ErrConfig)
	case c.kneeP99 <= 0:
		return c, fmt.Errorf("%w: -knee-p99 must be positive", ErrConfig)
	case c.kneeStep < 10*time.Millisecond:
		return c, fmt.Errorf("%w: -knee-step must be at least 10ms", ErrConfig)
	}
	switch {
	case c.concurrency < 1:
		return c, fmt.Errorf("%w: -concurrency must be at least 1", ErrConfig)
	case c.duration < 10*time.Millisecond || c.round < time.Millisecond:
		return c, fmt.Errorf("%w: -duration must be at least 10ms and -round at least 1ms", ErrConfig)
	case c.dups < 1 || c.keys < 1 || c.replayKeys < 1 || c.backlog < 1:
		return c, fmt.Errorf("%w: -dups, -keys, -replay-keys and -backlog must be at least 1", ErrConfig)
	case c.pgConns < 1:
		return c, fmt.Errorf("%w: -pg-conns must be at least 1", ErrConfig)
	case c.redisTimeout < time.Millisecond:
		return c, fmt.Errorf("%w: -redis-timeout must be at least 1ms", ErrConfig)
	}
	if c.records != 0 {
		switch {
		case c.records < sizeSeed:
			return c, fmt.Errorf("%w: -records must be at least %d", ErrConfig, sizeSeed)
		case set["workload"] || c.rate > 0 || c.knee || c.smoke:
			return c, fmt.Errorf("%w: -records measures sizes alone: no -workload, -rate, -knee or -smoke", ErrConfig)
		}
		c.workloads = nil
	}
	return c, nil
}

// parseRates parses -knee-rates: positive rates, strictly ascending.
func parseRates(list string) ([]float64, error) {
	var rates []float64
	for _, f := range strings.Split(list, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		switch {
		case err != nil || math.IsNaN(r) || math.IsInf(r, 0) || r <= 0:
			return nil, fmt.Errorf("%w: -knee-rates: %q is not a positive rate", ErrConfig, strings.TrimSpace(f))
		case len(rates) > 0 && r <= rates[len(rates)-1]:
			return nil, fmt.Errorf("%w: -knee-rates must ascend: %g after %g", ErrConfig, r, rates[len(rates)-1])
		}
		rates = append(rates, r)
	}
	return rates, nil
}

var (
	logMu  sync.Mutex
	logOut io.Writer = os.Stderr
)

// setLog sends the progress log to w.
func setLog(w io.Writer) {
	logMu.Lock()
	logOut = w
	logMu.Unlock()
}

func logf(format string, args ...any) {
	logMu.Lock()
	defer logMu.Unlock()
	fmt.Fprintf(logOut, "bench: "+format+"\n", args...)
}

// run runs the configured workloads and returns the report. A correctness
// failure is in the report (Failures) and returned as ErrCheck.
func run(ctx context.Context, cfg config) (*report, error) {
	rep := newReport(cfg)
	e, err := newEnv(ctx, cfg)
	defer e.close()
	rep.Schema, rep.Prefix = e.schema, e.prefix
	if err != nil {
		return rep, err
	}
	if cfg.records > 0 {
		w, extras, err := recordSize(ctx, e)
		if err == nil {
			rep.add(w, extras)
		}
		rep.Seconds = time.Since(rep.Started).Seconds()
		rep.LoadAvg[1] = loadAvg()
		return rep, err
	}
	f, err := newFloors(ctx, e)
	if err != nil {
		return rep, err
	}
	build := map[string]func() *workload{
		"fresh":      func() *workload { return freshWorkload(e, f) },
		"storm":      func() *workload { return stormWorkload(e, f) },
		"replay":     func() *workload { return replayWorkload(e, f) },
		"redis-down": func() *workload { return redisDownWorkload(e) },
		"sweep":      func() *workload { return sweepWorkload(e) },
		// issue 43
		"finished-burst": func() *workload { return finishedBurstWorkload(e, f) },
		"wake":           func() *workload { return wakeWorkload(e) },
	}
	// Each workload is built and prepared once: the closed-loop run, the
	// open-loop run and the knee sweep share it.
	built := map[string]*workload{}
	get := func(name string) (*workload, error) {
		if w := built[name]; w != nil {
			return w, nil
		}
		w := build[name]()
		built[name] = w
		if w.prepare != nil {
			if err := w.prepare(ctx); err != nil {
				return nil, err
			}
		}
		return w, nil
	}
	closed := cfg.workloads
	if !cfg.closed {
		closed = nil
	}
	for _, name := range closed {
		start := time.Now()
		w, err := get(name)
		if err != nil {
			return rep, err
		}
		if w.measure != nil {
			logf("%s: %d variants alternating in rounds for %s: %s", w.name, len(w.variants), fmtDur(cfg.duration), w.about)
			err = w.measure(ctx)
		} else {
			rounds, length := plan(cfg, len(w.variants))
			logf("%s: %d variants × %d rounds of %s, %d workers: %s", w.name, len(w.variants), rounds, fmtDur(length), cfg.concurrency, w.about)
			err = runRounds(ctx, e, w.variants)
		}
		if err != nil {
			return rep, fmt.Errorf("bench: %s: %w", w.name, err)
		}
		var extras []extra
		if w.finish != nil {
			if extras, err = w.finish(ctx); err != nil {
				return rep, err
			}
		}
		rep.add(w, extras)
		logf("%s: done in %s: %s", w.name, fmtDur(time.Since(start)), summary(rep.Workloads[len(rep.Workloads)-1]))
	}
	type openRun func(context.Context, *env, *report, *workload) error
	var openRuns []openRun
	if cfg.rate > 0 {
		openRuns = append(openRuns, openWorkload)
	}
	if cfg.knee {
		openRuns = append(openRuns, kneeWorkload)
	}
	for _, runOpen := range openRuns {
		for _, name := range cfg.open {
			w, err := get(name)
			if err != nil {
				return rep, err
			}
			if err := runOpen(ctx, e, rep, w); err != nil {
				return rep, err
			}
		}
	}
	rep.Seconds = time.Since(rep.Started).Seconds()
	rep.LoadAvg[1] = loadAvg()
	if len(rep.Failures) > 0 {
		return rep, fmt.Errorf("%w: %s", ErrCheck, strings.Join(rep.Failures, "; "))
	}
	return rep, nil
}

// summary is the progress line of a finished workload.
func summary(wr workloadReport) string {
	var parts []string
	for _, v := range wr.Variants {
		s := fmt.Sprintf("%s %.0f/s p99 %s", v.Name, v.PerSecond, fmtUs(v.P99us))
		if v.Vs != "" {
			s += fmt.Sprintf(" (%.2f of %s)", v.Ratio, v.Vs)
		}
		for _, c := range v.Costs {
			s += fmt.Sprintf(" (costs %.2f× %s)", c.Ratio, c.Vs)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	setLog(stderr)
	redis.SetLogger(redisLog)
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if cfg.cpuProfile != "" {
		pf, err := os.Create(cfg.cpuProfile)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, cfg)
	if len(rep.Workloads) > 0 || len(rep.OpenLoop) > 0 || len(rep.Knee) > 0 {
		fmt.Fprintln(stdout)
		rep.table(stdout)
	}
	if cfg.jsonPath != "" {
		if werr := writeJSON(cfg.jsonPath, rep); werr != nil && err == nil {
			err = werr
		}
	}
	if cfg.htmlPath != "" {
		if werr := writeHTML(cfg.htmlPath, rep); werr != nil && err == nil {
			err = werr
		}
	}
	if cfg.memProfile != "" {
		if werr := writeHeap(cfg.memProfile); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

func writeJSON(path string, rep *report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func writeHeap(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup("allocs").WriteTo(f, 0)
}
