// Package program is the plumbing the example programs share: the life of a
// command (the flags they all have, parse the flags, run until interrupted,
// exit with a status), the logger, opening the backend and saying which one
// it is, serving HTTP with a graceful shutdown, and running background
// loops (a sweeper, a reconciler) that stop before the stores close.
//
// It holds nothing about oncekey: each example builds its Claimer, its
// middleware and its handlers itself, in its own service.go. The flags
// every program has are [Flags]; each defines its own in its own main.go
// (examples/internal/readmecheck reads them from there and from here). It
// is an internal package because it is scaffolding for the examples, not
// part of the library.
package program

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

// Main runs a program: parse reads the command line (os.Args, os.Getenv,
// usage and errors to stderr), run runs it until SIGINT or SIGTERM. The
// exit status is 0 for -help and for a run that returns nil, 2 for a bad
// command line, 1 for a run that returns an error (printed to stderr).
func Main[O any](parse func(args []string, getenv func(string) string, stderr io.Writer) (O, error), run func(ctx context.Context, o O, out io.Writer) error) {
	o, err := parse(os.Args[1:], os.Getenv, os.Stderr)
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

// Flags are the flags every example program has: -postgres, -redis and
// -data, which name the services it runs on (backend.Config.RegisterFlags),
// and -v. A program's options embed them beside its own flags.
type Flags struct {
	Backend backend.Config
	Verbose bool
}

// FlagSet returns the flag set of the program name, which reports its
// errors (and -help) to stderr instead of exiting, with f's flags on it,
// and names the program in f.Backend. getenv supplies the defaults of
// -postgres and -redis (DATABASE_URL and REDIS_URL); verbose is the help
// text of -v, which says what the program logs. The program defines its
// own flags on the returned set.
func (f *Flags) FlagSet(name string, stderr io.Writer, getenv func(string) string, verbose string) *flag.FlagSet {
	f.Backend.Name = name
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.Backend.RegisterFlags(fs, getenv)
	fs.BoolVar(&f.Verbose, "v", false, verbose)
	return fs
}

// Parse parses args with fs and refuses positional arguments: the
// programs take flags only.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}

// Logger returns a text logger writing to w at level, or at debug level
// when verbose (-v).
func Logger(w io.Writer, verbose bool, level slog.Level) *slog.Logger {
	if verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// Start begins a program's run: its logger (to stderr at warning level, at
// debug level with -v) and the backend f names, opened with that logger as
// [OpenBackend] opens it (which prints which stores it runs on). The
// caller closes the backend.
func Start(ctx context.Context, f Flags, out io.Writer) (*slog.Logger, *backend.Backend, error) {
	log := Logger(os.Stderr, f.Verbose, slog.LevelWarn)
	b, err := OpenBackend(ctx, f.Backend, log, out)
	return log, b, err
}

// OpenBackend opens what cfg names (backend.Open) and prints, each line
// prefixed with cfg.Name (the program's name), which durable store and
// which Redis it runs on and why. log, unless nil or cfg has a Logger already, gets the
// warning about a named Redis that does not answer. The caller closes the
// backend.
func OpenBackend(ctx context.Context, cfg backend.Config, log *slog.Logger, out io.Writer) (*backend.Backend, error) {
	if cfg.Logger == nil && log != nil {
		cfg.Logger = log
	}
	b, err := backend.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	for _, line := range b.Describe() {
		fmt.Fprintln(out, cfg.Name+":", line)
	}
	return b, nil
}

// Server is an HTTP server started by [Listen].
type Server struct {
	// URL is the server's base URL, http://host:port.
	URL string

	srv    *http.Server
	served chan struct{}
	err    error // Serve's error, set before served is closed
}

// Listen listens on addr ("127.0.0.1:0" for a free port) and serves h
// until [Server.Shutdown].
func Listen(addr string, h http.Handler) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{
		URL:    "http://" + ln.Addr().String(),
		srv:    &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second},
		served: make(chan struct{}),
	}
	go func() {
		defer close(s.served)
		s.err = s.srv.Serve(ln)
	}()
	return s, nil
}

// Serve listens on addr and serves h until ctx is done, printing, after
// name, where it listens. With demo not nil it runs demo against the
// server's URL instead, printing what it runs against, and returns its
// verdict. note follows the URL in what it prints. The server shuts down
// before Serve returns.
func Serve(ctx context.Context, out io.Writer, name, addr string, h http.Handler, note string, demo func(url string) error) error {
	srv, err := Listen(addr, h)
	if err != nil {
		return err
	}
	defer srv.Shutdown(ctx)
	if demo != nil {
		fmt.Fprintf(out, "%s: demo against %s%s\n", name, srv.URL, note)
		return demo(srv.URL)
	}
	fmt.Fprintf(out, "%s: listening on %s%s\n", name, srv.URL, note)
	return srv.Wait(ctx)
}

// Wait returns nil when ctx is done, or the server's error if it stops
// serving first.
func (s *Server) Wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case <-s.served:
		return s.err
	}
}

// Shutdown stops the server gracefully, giving the requests in flight up
// to 10 seconds (also when ctx is already done), and waits until it has
// stopped.
func (s *Server) Shutdown(ctx context.Context) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(sctx)
	<-s.served
}

// Go runs each loop in a goroutine of its own on a context derived from
// ctx (a sweeper, a reconciler: loops that run until their context is
// done). The returned stop cancels that context and waits for every loop
// to return. Defer it after the stores' Close and before the server's
// Shutdown, so that (deferred calls running last first) the loops stop
// after the server and before the stores close.
func Go(ctx context.Context, loops ...func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, loop := range loops {
		wg.Go(func() { _ = loop(ctx) })
	}
	return func() {
		cancel()
		wg.Wait()
	}
}
