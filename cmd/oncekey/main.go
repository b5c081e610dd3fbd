// Command oncekey is the operator tool of oncekey: it migrates the
// PostgreSQL store, reports its statistics, inspects, lists and settles
// operations, sweeps expired records and checks a Redis server, through the
// library's own store (durable/postgres), never SQL of its own for the
// records.
//
//	go run github.com/oncekey/oncekey/cmd/oncekey@latest -h
//
// Subcommands:
//
//	migrate up|status|contract|down   apply (printing each version applied), report, apply the next contract step or roll back one step of the schema
//	stats                    records by state, stale, expired, takeovers, durability of acknowledged commits
//	inspect                  one operation, by tenant + operation + key, or by operation id, with its workflow's steps
//	pending                  uncertain and stale processing operations, fewest takeovers first, then oldest, and the step each stopped at
//	resolve                  settle an uncertain (or stale) operation as completed or failed, or (-step) the step it stopped at
//	sweep                    delete expired records in bounded batches
//	redis check              maxmemory-policy, cluster slots, version, latency (and PostgreSQL durability with -database-url)
//
// After the command's name, its flags and words go in any order
// ("migrate down -yes", "migrate -yes down"); "--" ends the flags; -h
// anywhere after the name prints that command's usage.
//
// The database comes from -database-url or DATABASE_URL, Redis from
// -redis-url or REDIS_URL; -schema and -table name the store's table as
// durable/postgres.WithSchema and WithTable do. A URL that cannot be parsed
// is refused naming the part that failed, never printed (it holds the
// password). A command on a schema without the store's table says so and
// names the migrate up command that creates it. A raw idempotency key is
// hashed locally, the way the store derives its record key (with the secret
// of ONCEKEY_KEY_SECRET, as postgres.WithKeySecret), and is never printed
// nor sent; -key also takes it as the Idempotency-Key header carries it (an
// RFC 8941 string in double quotes, unquoted as claimhttp does). No tenant
// is printed either (pending shows a digest of it), nor the result of a
// workflow's step unless inspect -step-results asks (then quoted, or in
// hex when not UTF-8, and bounded).
//
// pending and resolve share one staleness rule: a processing operation
// whose lease expired at least -stale ago (5m) is listed and may be
// settled; -stale 0 settles one as soon as its lease expired. resolve
// records the operator (-operator, default $USER, required when that is
// empty) and the reason in <table>_resolutions, which migration 005
// creates. resolve -step NAME -happened|-not-happened settles only the step
// of a workflow the operation stopped at (<table>_steps, migration 008):
// the next retry of the request resumes from it. Its resolution is
// recorded with the state step-happened:NAME or step-not-happened:NAME.
//
// Exit status: 0 on success, 1 when the operation failed (a service
// unreachable, a record not found, a check that did not pass), 2 for bad
// usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := runCtx(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// errUsage marks bad input: the command prints it with the usage hint and
// exits 2.
var errUsage = errors.New("usage")

func usagef(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, a...))
}

// env is what a subcommand runs with.
type env struct {
	ctx    context.Context
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
}

type command struct {
	name    string // "migrate", "redis check"
	summary string
	run     func(e *env, args []string) error
}

func commands() []command {
	return []command{
		{"migrate", "apply (up), report (status), contract (contract -yes) or roll back one step (down -yes) of the schema", runMigrate},
		{"stats", "records by state, oldest unexpired, stale, expired awaiting sweep, takeovers, durability", runStats},
		{"inspect", "one operation, by -tenant -operation -key or by -tenant -id, with its workflow's steps", runInspect},
		{"pending", "uncertain and stale processing operations, fewest takeovers first, then oldest, and their step", runPending},
		{"resolve", "settle an uncertain operation as completed or failed, or the step it stopped at (-step), with a reason", runResolve},
		{"sweep", "delete expired records in bounded batches (-dry-run to count)", runSweep},
		{"redis", "redis check: maxmemory-policy, cluster slots, version, latency (-database-url: durability)", runRedis},
	}
}

// run is main without the process: it returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	return runCtx(context.Background(), args, strings.NewReader(""), stdout, stderr)
}

func runCtx(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := &env{ctx: ctx, stdin: stdin, stdout: stdout, stderr: stderr, getenv: os.Getenv}
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return exitOK
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(e, args[1:])
		switch {
		case err == nil:
			return exitOK
		case errors.Is(err, flag.ErrHelp):
			return exitOK
		case errors.Is(err, errUsage):
			fmt.Fprintf(stderr, "oncekey %s: %s\n(see oncekey %s -h)\n", c.name, strings.TrimPrefix(err.Error(), "usage: "), c.name)
			return exitUsage
		default:
			fmt.Fprintf(stderr, "oncekey %s: %v\n", c.name, err)
			return exitFail
		}
	}
	fmt.Fprintf(stderr, "oncekey: unknown command %q\n\n", args[0])
	usage(stderr)
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "oncekey: the operator tool of oncekey (PostgreSQL store and Redis).")
	fmt.Fprintln(w, "\nUsage: oncekey <command> [its words and flags, in any order]\n\nCommands:")
	cs := commands()
	for _, c := range cs {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun oncekey <command> -h for its flags. The database comes from -database-url or")
	fmt.Fprintln(w, "DATABASE_URL, Redis from -redis-url or REDIS_URL. Exit status: 0 ok, 1 failed, 2 bad usage.")
}

// newFlags returns a FlagSet for a subcommand whose -h prints to stdout and
// whose errors come back as usage errors.
func newFlags(e *env, name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("oncekey "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fs.SetOutput(e.stdout)
		fmt.Fprintf(e.stdout, "Usage: oncekey %s\n\n", synopsis)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return fs
}

// parse parses args, flags and positional words in any order, as people
// type them: "migrate down -yes" is "migrate -yes down"; "--" ends the
// flags. -h anywhere prints the usage and returns flag.ErrHelp; other
// errors are usage errors. It returns the positional words, refusing more
// than max of them (max < 0: any number).
func parse(fs *flag.FlagSet, args []string, max int) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usagef("%v", err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		// A positional word: the flags after it are parsed too.
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	if max >= 0 && len(pos) > max {
		return nil, usagef("unexpected argument %q", pos[max])
	}
	return pos, nil
}
