// Command deploys is an example service in async mode: POST /deploys
// starts a deploy that takes a few seconds and answers 202 with the
// operation's Location at once; GET /operations/{id} serves the
// operation's state (claimhttp.Operations); a River worker runs the deploy
// under the claim's lease, calling a fake downstream with the operation
// identity as its idempotency key; GET /deploys/{id} serves the finished
// deploy, the Location of its stored 201. A body without "service" and
// "version" is refused before the claim (claimriver.WithValidate): a 400
// that reserves nothing, so the corrected body runs with the same key.
// The Claimer's sweeper runs beside the server.
//
//	go run ./examples/deploys           # serve on 127.0.0.1:8082
//	go run ./examples/deploys -demo     # tell the story and exit 0 if it held
//
// It runs on the services it is given (-postgres or DATABASE_URL, -redis or
// REDIS_URL) and on embedded stand-ins otherwise (a SQLite file, an
// in-process Redis), like examples/orders. Authentication is the examples'
// demo scheme: "Authorization: Bearer <tenant>", believed as it is (never do
// that in a real service).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/oncekey/oncekey/examples/internal/backend"
)

// options are the command line.
type options struct {
	backend backend.Config
	addr    string
	demo    bool
	verbose bool
}

func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	o := options{backend: backend.Config{Name: "deploys"}}
	fs := flag.NewFlagSet("deploys", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.backend.RegisterFlags(fs, getenv)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8082", "listen address (the demo listens on 127.0.0.1:0)")
	fs.BoolVar(&o.verbose, "v", false, "log at debug level to stderr; by default warnings and errors")
	fs.BoolVar(&o.demo, "demo", false, "start on a free port, fire the demo requests at itself, print what happened and exit")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("deploys: unexpected argument %q", fs.Arg(0))
	}
	return o, nil
}

func main() {
	o, err := parseOptions(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, o, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// run opens the services and runs the service on the durable store they
// give (PostgreSQL or the embedded SQLite file).
func run(ctx context.Context, o options, out io.Writer) error {
	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if o.backend.Logger == nil {
		o.backend.Logger = log // a named Redis that does not answer is a warning
	}
	b, err := backend.Open(ctx, o.backend)
	if err != nil {
		return err
	}
	defer b.Close()
	for _, line := range b.Describe() {
		fmt.Fprintln(out, "deploys:", line)
	}
	if b.Embedded() {
		return serve(ctx, o, out, log, b, sqliteRiver(b))
	}
	return serve(ctx, o, out, log, b, postgresRiver(b))
}
