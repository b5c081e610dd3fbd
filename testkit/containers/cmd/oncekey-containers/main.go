// Command oncekey-containers starts disposable PostgreSQL and Redis (and,
// asked for, NATS and RabbitMQ) in containers and runs a command with
// DATABASE_URL, REDIS_URL (and NATS_URL, AMQP_URL) pointing at them; the
// containers are removed when the command ends:
//
//	go run ./testkit/containers/cmd/oncekey-containers -- go test ./...
//	go run ./testkit/containers/cmd/oncekey-containers -nats -- go test ./claim/claimnats/...
//	go run ./testkit/containers/cmd/oncekey-containers -amqp -- go test ./claim/claimamqp/...
//
// Every package of that test run shares the one PostgreSQL and Redis
// (testkit/testenv isolates tests by schema and key prefix).
//
// With -serve it is the other half of testkit/testenv: it reads a service
// name per line on stdin ("postgres", "redis", "nats", "rabbitmq"), starts
// that service's container the first time, and answers a line "url URL"
// or "error MESSAGE" on stdout. When stdin ends (the test binary exited, for
// whatever reason) or on SIGINT/SIGTERM it removes its containers and
// exits. testenv runs it so when no URL is set and Docker answers: one set
// of containers per test binary, started on first use.
//
// The environment chooses images and network (see package containers):
// ONCEKEY_POSTGRES_IMAGE, ONCEKEY_REDIS_IMAGE, ONCEKEY_NATS_IMAGE,
// ONCEKEY_RABBITMQ_IMAGE, ONCEKEY_CONTAINERS_NETWORK=host; testcontainers' own (DOCKER_HOST,
// TESTCONTAINERS_RYUK_DISABLED, TESTCONTAINERS_HOST_OVERRIDE).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"github.com/oncekey/oncekey/testkit/containers"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("oncekey-containers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	serve := fs.Bool("serve", false, "answer service names on stdin with URLs (testkit/testenv's protocol) until stdin ends")
	withNATS := fs.Bool("nats", false, "start NATS (with JetStream) too and set NATS_URL")
	withAMQP := fs.Bool("amqp", false, "start RabbitMQ too and set AMQP_URL")
	quiet := fs.Bool("q", false, "no progress lines on stderr")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: oncekey-containers [-nats] [-amqp] [-q] -- COMMAND [ARG...]\n       oncekey-containers -serve")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	opts := containers.FromEnv()
	opts.Log = stderr
	if *quiet {
		opts.Log = io.Discard
	}
	set := containers.New(opts)
	defer func() {
		if err := set.Close(); err != nil {
			fmt.Fprintln(stderr, err)
		}
	}()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *serve {
		if fs.NArg() > 0 {
			fs.Usage()
			return 2
		}
		return serveLines(ctx, set, stdin, stdout)
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	svcs := []containers.Service{containers.Postgres, containers.Redis}
	if *withNATS {
		svcs = append(svcs, containers.NATS)
	}
	if *withAMQP {
		svcs = append(svcs, containers.RabbitMQ)
	}
	env := os.Environ()
	for _, svc := range svcs {
		u, err := set.URL(ctx, svc)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		env = append(env, svc.Env()+"="+u)
	}
	cmd := exec.Command(fs.Arg(0), fs.Args()[1:]...)
	cmd.Env, cmd.Stdin, cmd.Stdout, cmd.Stderr = env, os.Stdin, stdout, stderr
	// The command gets SIGINT from the terminal as we do; wait for it
	// either way, then remove the containers.
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		if ee.ExitCode() >= 0 {
			return ee.ExitCode()
		}
		return 1
	default:
		fmt.Fprintln(stderr, err)
		return 1
	}
}

// serveLines answers service names with URLs until in ends or ctx does.
func serveLines(ctx context.Context, set *containers.Set, in io.Reader, out io.Writer) int {
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return 0
		case l, ok := <-lines:
			if !ok {
				return 0
			}
			if strings.TrimSpace(l) == "" {
				continue
			}
			svc, err := containers.ParseService(l)
			var u string
			if err == nil {
				u, err = set.URL(ctx, svc)
			}
			if err != nil {
				fmt.Fprintf(out, "error %s\n", strings.ReplaceAll(err.Error(), "\n", " | "))
				continue
			}
			fmt.Fprintf(out, "url %s\n", u)
		}
	}
}
