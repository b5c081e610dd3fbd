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
	backend backend.Config
	addr    string
	demo    bool
	verbose bool
}

// parseOptions reads the command line; getenv supplies DATABASE_URL and
// REDIS_URL (os.Getenv; tests pass their own).
func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	o := options{backend: backend.Config{Name: "orders"}}
	fs := flag.NewFlagSet("orders", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.backend.RegisterFlags(fs, getenv)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "listen address (the demo listens on 127.0.0.1:0)")
	fs.BoolVar(&o.verbose, "v", false, "log at debug level to stderr (every Redis fallback, for one); by default warnings and errors")
	fs.BoolVar(&o.demo, "demo", false, "start on a free port, fire the demo requests at itself, print what happened and exit")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("orders: unexpected argument %q", fs.Arg(0))
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

// run opens the services, builds the service, starts its sweeper and
// serves it until ctx is done, or, with -demo, runs the demo against it and
// returns its verdict. The sweeper stops after the server, before the
// stores close.
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
		fmt.Fprintln(out, "orders:", line)
	}
	a, err := newService(ctx, b, log)
	if err != nil {
		return err
	}
	sweepCtx, stopSweep := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = a.sweep(sweepCtx) })
	defer func() {
		stopSweep()
		wg.Wait()
	}()
	h := a.handler
	addr := o.addr
	var cut *cutter
	if o.demo {
		addr = "127.0.0.1:0"
		cut = &cutter{next: h}
		h = cut // the demo cuts one response after its commit
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
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
		fmt.Fprintln(out, "orders: demo against", url)
		return runDemo(ctx, url, cut, out)
	}
	fmt.Fprintln(out, "orders: listening on", url)
	select {
	case <-ctx.Done():
		return nil
	case <-served:
		return serveErr
	}
}
