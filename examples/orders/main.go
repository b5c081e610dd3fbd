package main

import (
	"context"
	"io"

	"github.com/oncekey/oncekey/examples/internal/program"
)

// options are the command line: the flags every example has
// (program.Flags: -postgres, -redis, -data, -v) and its own.
type options struct {
	program.Flags
	addr string
	demo bool
}

// parseOptions reads the command line; getenv supplies DATABASE_URL and
// REDIS_URL (os.Getenv; tests pass their own).
func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	var o options
	fs := o.Flags.FlagSet("orders", stderr, getenv, "log at debug level to stderr (every Redis fallback, for one); by default warnings and errors")
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "listen address (the demo listens on 127.0.0.1:0)")
	fs.BoolVar(&o.demo, "demo", false, "start on a free port, fire the demo requests at itself, print what happened and exit")
	err := program.Parse(fs, args)
	return o, err
}

func main() { program.Main(parseOptions, run) }

// run opens the services, builds the service, starts its sweeper and
// serves it until ctx is done, or, with -demo, runs the demo against it and
// returns its verdict. The sweeper stops after the server, before the
// stores close.
func run(ctx context.Context, o options, out io.Writer) error {
	log, b, err := program.Start(ctx, o.Flags, out) // prints which stores it runs on
	if err != nil {
		return err
	}
	defer b.Close()
	a, err := newService(ctx, b, log)
	if err != nil {
		return err
	}
	stopSweep := program.Go(ctx, a.sweep)
	defer stopSweep() // deferred first, so it runs after the server's shutdown
	h := a.handler
	addr := o.addr
	var demo func(url string) error
	if o.demo {
		addr = "127.0.0.1:0"
		cut := &cutter{next: h}
		h = cut // the demo cuts one response after its commit
		demo = func(url string) error { return runDemo(ctx, url, cut, out) }
	}
	return program.Serve(ctx, out, "orders", addr, h, "", demo)
}
