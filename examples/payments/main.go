package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/oncekey/oncekey/examples/internal/program"
)

// options are the command line: the flags every example has
// (program.Flags: -postgres, -redis, -data, -v) and its own.
type options struct {
	program.Flags
	addr           string
	demo           bool
	gatewayMode    gatewayMode
	gatewayTimeout time.Duration
	reconcileEvery time.Duration
}

// Settings of the demo: short, so that the story takes a second or two.
// The gateway answers at once; the wait for it is a second all the same,
// since under load (the tests run with -race beside other packages) a
// shorter one made a normal charge look timed out, hence uncertain.
const (
	demoGatewayTimeout = time.Second
	demoReconcileEvery = 250 * time.Millisecond
)

// parseOptions reads the command line; getenv supplies DATABASE_URL and
// REDIS_URL (os.Getenv; tests pass their own).
func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	var o options
	fs := o.Flags.FlagSet("payments", stderr, getenv, "log at debug level to stderr (every Redis fallback, every uncertain payment); by default warnings and errors")
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8081", "listen address (the demo listens on 127.0.0.1:0)")
	fs.BoolVar(&o.demo, "demo", false, "start on a free port, fire the demo requests at itself, print what happened and exit")
	mode := fs.String("gateway-mode", "normal", "what the fake gateway does with charges: normal, timeout-after-charge or timeout-before-charge")
	fs.DurationVar(&o.gatewayTimeout, "gateway-timeout", 2*time.Second, "how long the service waits for the gateway")
	fs.DurationVar(&o.reconcileEvery, "reconcile-every", 5*time.Second, "interval between reconciliation passes")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	var err error
	if o.gatewayMode, err = parseMode(*mode); err != nil {
		return o, err
	}
	if o.gatewayTimeout <= 0 || o.reconcileEvery <= 0 {
		return o, fmt.Errorf("%w: -gateway-timeout and -reconcile-every must be positive", errUsage)
	}
	return o, nil
}

func main() { program.Main(parseOptions, run) }

// run opens the services, starts the fake gateway, the service, its
// reconciler and its sweeper, and serves until ctx is done, or, with -demo, runs the demo
// against them and returns its verdict.
func run(ctx context.Context, o options, out io.Writer) error {
	if o.demo {
		o.addr, o.gatewayMode = "127.0.0.1:0", modeNormal
		o.gatewayTimeout, o.reconcileEvery = demoGatewayTimeout, demoReconcileEvery
	}
	log, b, err := program.Start(ctx, o.Flags, out) // prints which stores it runs on
	if err != nil {
		return err
	}
	defer b.Close()

	gw, err := startGateway()
	if err != nil {
		return err
	}
	defer gw.close()
	gw.setMode(o.gatewayMode)
	fmt.Fprintf(out, "payments: fake gateway on %s (mode %s; the service waits %v for it)\n", gw.url, modeName(o.gatewayMode), o.gatewayTimeout)

	a, err := newService(b, newGatewayClient(gw.url, o.gatewayTimeout), log, o.reconcileEvery)
	if err != nil {
		return err
	}
	stopLoops := program.Go(ctx, a.reconcile, a.sweep)
	defer stopLoops() // deferred first, so it runs after the server's shutdown

	var demo func(url string) error
	if o.demo {
		demo = func(url string) error { return runDemo(ctx, url, gw, out) }
	}
	return program.Serve(ctx, out, "payments", o.addr, a.handler, fmt.Sprintf(" (reconciler every %v)", o.reconcileEvery), demo)
}

func modeName(m gatewayMode) string {
	switch m {
	case modeTimeoutAfterCharge:
		return "timeout-after-charge"
	case modeTimeoutBeforeCharge:
		return "timeout-before-charge"
	}
	return "normal"
}
