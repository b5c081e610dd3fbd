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
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/oncekey/oncekey/examples/internal/backend"
)

type options struct {
	backend backend.Config
	natsURL string
	demo    bool
	verbose bool
}

func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	o := options{backend: backend.Config{Name: "consumer"}}
	fs := flag.NewFlagSet("consumer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.backend.RegisterFlags(fs, getenv)
	fs.StringVar(&o.natsURL, "nats", getenv("NATS_URL"), "NATS URL, with JetStream (default $NATS_URL); empty: an in-process NATS server")
	fs.BoolVar(&o.verbose, "v", false, "log at debug level to stderr")
	fs.BoolVar(&o.demo, "demo", false, "publish duplicates and redeliveries, kill a consumer mid-charge, print the story and exit")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("consumer: unexpected argument %q", fs.Arg(0))
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
		fmt.Fprintln(out, "consumer:", line)
	}
	url := o.natsURL
	if url == "" {
		dir, err := os.MkdirTemp("", "oncekey-consumer-nats-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true})
		if err != nil {
			return err
		}
		go ns.Start()
		defer ns.Shutdown()
		if !ns.ReadyForConnections(10 * time.Second) {
			return errors.New("consumer: the in-process NATS server did not start")
		}
		url = ns.ClientURL()
		fmt.Fprintln(out, "consumer: NATS: in-process server with JetStream (no -nats or NATS_URL)")
	} else {
		fmt.Fprintln(out, "consumer: NATS:", "the server named by -nats/NATS_URL")
	}
	if b.Postgres != nil {
		w, err := newWorker(ctx, b.Postgres, b.ClaimOptions(), log, pgCharges{b.Pool})
		if err != nil {
			return err
		}
		return w.run(ctx, url, o.demo, out)
	}
	w, err := newWorker(ctx, b.SQLite, b.ClaimOptions(), log, sqliteCharges{b.DB})
	if err != nil {
		return err
	}
	return w.run(ctx, url, o.demo, out)
}
