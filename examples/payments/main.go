package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/oncekey/oncekey/examples/internal/backend"
)

// options are the command line.
type options struct {
	backend        backend.Config
	addr           string
	demo           bool
	verbose        bool
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
	o := options{backend: backend.Config{Name: "payments"}}
	fs := flag.NewFlagSet("payments", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.backend.RegisterFlags(fs, getenv)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8081", "listen address (the demo listens on 127.0.0.1:0)")
	fs.BoolVar(&o.verbose, "v", false, "log at debug level to stderr (every Redis fallback, every uncertain payment); by default warnings and errors")
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

// run opens the services, starts the fake gateway, the service, its
// reconciler and its sweeper, and serves until ctx is done, or, with -demo, runs the demo
// against them and returns its verdict.
func run(ctx context.Context, o options, out io.Writer) error {
	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if o.demo {
		o.addr, o.gatewayMode = "127.0.0.1:0", modeNormal
		o.gatewayTimeout, o.reconcileEvery = demoGatewayTimeout, demoReconcileEvery
	}
	if o.backend.Logger == nil {
		o.backend.Logger = log // a named Redis that does not answer is a warning
	}
	b, err := backend.Open(ctx, o.backend)
	if err != nil {
		return err
	}
	defer b.Close()
	for _, line := range b.Describe() {
		fmt.Fprintln(out, "payments:", line)
	}

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
	bgCtx, stopBg := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = a.reconcile(bgCtx) })
	wg.Go(func() { _ = a.sweep(bgCtx) })
	defer func() {
		stopBg()
		wg.Wait()
	}()

	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: a.handler, ReadHeaderTimeout: 10 * time.Second}
	var serveErr error
	served := make(chan struct{})
	go func() {
		defer close(served)
		serveErr = srv.Serve(ln)
	}()
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-served
	}()
	url := "http://" + ln.Addr().String()
	if o.demo {
		fmt.Fprintf(out, "payments: demo against %s (reconciler every %v)\n", url, o.reconcileEvery)
		return runDemo(ctx, url, gw, out)
	}
	fmt.Fprintf(out, "payments: listening on %s (reconciler every %v)\n", url, o.reconcileEvery)
	select {
	case <-ctx.Done():
		return nil
	case <-served:
		return serveErr
	}
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
