// Command chaos runs oncekey's chaos scenarios against your Redis and
// PostgreSQL and checks every invariant of the guarantee.
//
//	go run ./chaos/cmd/chaos -redis redis://127.0.0.1:6379/0 \
//	    -postgres postgres://postgres@127.0.0.1:5432/test \
//	    [-scenario NAME[,NAME...]] [-iterations N] [-seed S] [-lease D] [-json FILE] [-html DIR]
//	go run ./chaos/cmd/chaos -containers [-scenario ...]
//
// -containers starts Redis and PostgreSQL (NATS for nats-windows, RabbitMQ
// for amqp-windows) in containers with testcontainers-go instead (Docker is
// all it needs; see testkit/containers for the images and
// ONCEKEY_CONTAINERS_NETWORK=host) and removes them at the end. The own
// servers of redis-restart, redis-sentinel, pg-crash and pg-failover-sync
// (and the hazards pg-crash-async-commit and pg-failover-async) are
// containers too, their faults made through the container API: the Redis
// restarted (stop, start); the Sentinels' primary killed with SIGKILL; the
// PostgreSQL killed with SIGKILL and started again on its data; the
// standby a container made with pg_basebackup -R from the primary's,
// disconnected and promoted with SQL, the primary killed with SIGKILL.
// Sentinels need ONCEKEY_CONTAINERS_NETWORK=host (on Docker's bridge
// network redis-sentinel is skipped, saying why). The other scenarios that
// start servers of their own (-list says which) still start them from the
// machine's redis-server and PostgreSQL binaries.
//
// It prints a line per scenario as it finishes, then a table, writes a JSON
// report when asked, and exits 1 when any scenario found a violation, could
// not run, or injected a kind of fault that never fired. It uses a schema
// and a key prefix of its own (removed at the end) and starts redis-server
// processes of its own for the restart, failover, split-brain and eviction
// scenarios (and says so when redis-server is not installed; under
// -containers the restart and Sentinel scenarios' Redis are containers).
//
// -html DIR writes an HTML report to DIR: index.html, the scenarios with
// the faults that fired and the violations, each linked to a page of its
// operation (named as in the JSON report, "<scenario>/<n>#<epoch>", the
// suite's own keys) with porcupine's visualization of that operation's
// calls: each client's calls on a time line, the longest sequential
// executions of the record the checker's model finds, the record's state
// after each step and, for a history none explains, where they stop. A
// clean run writes index.html alone.
//
// The message-consumer scenarios use the NATS server (-nats) and RabbitMQ
// (-amqp), the local ones by default (containers under -containers); one
// that does not answer fails its scenario.
//
// -negative MODE runs the negative control instead: the scenarios that
// expose MODE against a deliberately broken store (or settlement engine,
// for one-attempt, release-on-error and no-recover, which only a binary
// built with -tags oncekey_negative can run; or the Claimers' Redis
// clients, for retry-takes-lease); it exits 1 when the
// checker does NOT catch the bug. -list shows the scenarios, what each
// forces, and the modes with the scenarios that catch each.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/chaos"
	"github.com/oncekey/oncekey/chaos/internal/check"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// quiet silences go-redis's own log lines (dial failures are the point of
// several scenarios).
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		redisURL   = fs.String("redis", os.Getenv("REDIS_URL"), "Redis URL (default $REDIS_URL)")
		pgURL      = fs.String("postgres", os.Getenv("DATABASE_URL"), "PostgreSQL URL (default $DATABASE_URL)")
		natsURL    = fs.String("nats", envOr("NATS_URL", chaos.DefaultNATSURL), "NATS server with JetStream, for nats-windows (default $NATS_URL, or the local one)")
		amqpURL    = fs.String("amqp", envOr("AMQP_URL", chaos.DefaultAMQPURL), "RabbitMQ, for amqp-windows (default $AMQP_URL, or the local one)")
		scenario   = fs.String("scenario", "", "comma-separated scenarios to run (default all; -list shows them)")
		iterations = fs.Int("iterations", chaos.DefaultIterations, "logical operations per scenario")
		clients    = fs.Int("clients", chaos.DefaultClients, "clients retrying each operation concurrently")
		parallel   = fs.Int("parallel", chaos.DefaultParallel, "operations in flight at once")
		seed       = fs.Int64("seed", chaos.DefaultSeed, "seed of the fault schedule (same seed, same schedule)")
		lease      = fs.Duration("lease", chaos.DefaultLease, "lease of every claim (pauses and timeouts scale with it)")
		jsonFile   = fs.String("json", "", "write the JSON report to this file")
		htmlDir    = fs.String("html", "", "write an HTML report to this directory: index.html, and porcupine's visualization of each operation with a violation")
		negative   = fs.String("negative", "", "run the negative control for this broken mode: "+strings.Join(modes(), ", "))
		list       = fs.Bool("list", false, "list the scenarios and exit")
		keep       = fs.Bool("keep-schema", false, "keep the run's PostgreSQL schema for inspection")
		budget     = fs.Duration("budget", 0, "wall-clock budget of the whole run (0: none); scenarios not started within it are left out")
		useCtrs    = fs.Bool("containers", false, "start Redis and PostgreSQL (NATS for nats-windows, RabbitMQ for amqp-windows; the own servers of redis-restart, redis-sentinel, pg-crash and pg-failover-sync) in containers (Docker, testcontainers-go) instead of -redis and -postgres, removed at the end")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *list {
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		for _, s := range chaos.Scenarios() {
			var own string
			switch {
			case s.OnServers && s.OwnRedis:
				own = " (starts its own redis-server; containers under -containers)"
			case s.OnServers && s.OwnPostgres:
				own = " (starts its own PostgreSQL; containers under -containers)"
			case s.OwnRedis && s.OwnPostgres:
				own = " (starts its own redis-server and PostgreSQL, even under -containers)"
			case s.OwnRedis:
				own = " (starts its own redis-server, even under -containers)"
			case s.OwnPostgres:
				own = " (starts its own PostgreSQL, even under -containers)"
			}
			if s.Repeats != "" {
				own += fmt.Sprintf("; repeats %s, at least %d times at 1000 operations", s.Repeats, chaos.RepeatedFaultsRequired(1000))
			}
			fmt.Fprintf(w, "%s\t%s%s\n", s.Name, s.Forces, own)
		}
		fmt.Fprintln(w, "\nnegative control (-negative MODE): a broken store the checker must catch")
		for _, m := range modes() {
			fmt.Fprintf(w, "%s\t%s; caught by %s\n", m, chaos.NegativeModeBreaks(m), strings.Join(chaos.NegativeModes()[m], ", "))
		}
		w.Flush()
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var cs *ctrs
	if *useCtrs {
		var err error
		cs, err = startContainers(ctx, stdout, stderr, *scenario)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		defer cs.close()
		*redisURL, *pgURL = cs.redisURL, cs.pgURL
		if cs.natsURL != "" {
			*natsURL = cs.natsURL
		}
		if cs.amqpURL != "" {
			*amqpURL = cs.amqpURL
		}
	}
	if *redisURL == "" || *pgURL == "" {
		fmt.Fprintln(stderr, "chaos: -redis and -postgres are required (or REDIS_URL and DATABASE_URL, or -containers)")
		fs.Usage()
		return 2
	}
	redis.SetLogger(quiet{})
	cfg := chaos.Config{
		RedisURL: *redisURL, PostgresURL: *pgURL, NATSURL: *natsURL, AMQPURL: *amqpURL, Iterations: *iterations, Clients: *clients, Parallel: *parallel,
		Seed: *seed, Lease: *lease, Progress: stdout, KeepSchema: *keep,
	}
	if *scenario != "" {
		cfg.Scenarios = strings.Split(*scenario, ",")
	}
	if cs != nil {
		cfg.Servers = servers{cs.set}
	}
	if *negative != "" {
		var err error
		if cfg, err = chaos.NegativeControl(cfg, *negative); err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
		if *scenario == "" {
			cfg.Scenarios = chaos.NegativeModes()[*negative]
		}
	}
	if *budget > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *budget)
		defer cancel()
	}
	fmt.Fprintf(stdout, "chaos: seed %d, lease %v, %d operations per scenario, %d clients each\n", cfg.Seed, cfg.Lease, cfg.Iterations, cfg.Clients)
	var hist *histories
	if *htmlDir != "" {
		hist = newHistories()
		defer check.SetObserver(hist.observe)()
	}
	rep, err := chaos.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, err)
		if errors.Is(err, chaos.ErrConfig) || errors.Is(err, chaos.ErrUnknownScenario) {
			return 2
		}
		return 1
	}
	table(stdout, rep)
	if *jsonFile != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err == nil {
			err = os.WriteFile(*jsonFile, append(b, '\n'), 0o644)
		}
		if err != nil {
			log.New(stderr, "", 0).Printf("chaos: write %s: %v", *jsonFile, err)
			return 1
		}
	}
	if *htmlDir != "" {
		pages, err := writeHTML(*htmlDir, rep, hist, *negative)
		if err != nil {
			log.New(stderr, "", 0).Printf("chaos: write %s: %v", *htmlDir, err)
			return 1
		}
		fmt.Fprintf(stdout, "chaos: HTML report in %s (and %d operation pages beside it)\n", filepath.Join(*htmlDir, "index.html"), pages)
	}
	if *negative != "" {
		missed := 0
		for _, r := range rep.Results {
			if len(r.Violations) == 0 {
				missed++
				fmt.Fprintf(stdout, "NEGATIVE CONTROL MISSED: %s ran against the broken store (%s) and found nothing\n", r.Scenario, *negative)
			}
		}
		if missed > 0 {
			return 1
		}
		fmt.Fprintf(stdout, "negative control: the checker caught the broken store (%s) in every scenario\n", *negative)
		return 0
	}
	if rep.Failed() {
		printFailures(stdout, rep)
		return 1
	}
	fmt.Fprintln(stdout, "chaos: no violations")
	return 0
}

func modes() []string {
	var out []string
	for m := range chaos.NegativeModes() {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

func table(out io.Writer, rep chaos.Report) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "scenario\titerations\toperations\tfaults injected\tviolations\tduration\t")
	for _, r := range rep.Results {
		viol := fmt.Sprint(len(r.Violations))
		switch {
		case r.Skipped != "":
			viol = "skipped"
		case r.Error != "":
			viol = "error"
		case len(r.Unfired()) > 0:
			viol += " (unfired)"
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%s\t%v\t\n", r.Scenario, r.Iterations, r.Operations, r.FaultsTotal, viol, r.Duration.Round(time.Millisecond))
	}
	fmt.Fprintf(w, "total\t\t\t\t%d\t%v\t\n", rep.Violations, rep.Duration.Round(time.Millisecond))
	w.Flush()
}

func printFailures(out io.Writer, rep chaos.Report) {
	for _, r := range rep.Results {
		if r.Error != "" {
			fmt.Fprintf(out, "%s: could not run: %s\n", r.Scenario, r.Error)
		}
		if u := r.Unfired(); r.Skipped == "" && r.Error == "" && len(u) > 0 {
			fmt.Fprintf(out, "%s: faults that never fired: %v\n", r.Scenario, u)
		}
		for i, v := range r.Violations {
			if i == 20 {
				fmt.Fprintf(out, "%s: ... %d more violations\n", r.Scenario, len(r.Violations)-20)
				break
			}
			fmt.Fprintf(out, "%s: %s\n", r.Scenario, v)
		}
	}
}

// envOr returns the environment variable k, or def when it is unset.
func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
