package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/oncekey/oncekey/examples/internal/program"
)

// options are the command line: the flags every example has
// (program.Flags: -postgres, -redis, -data, -v) and its own.
type options struct {
	program.Flags
	broker  string
	natsURL string
	kafka   string
	demo    bool
}

func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	var o options
	fs := o.Flags.FlagSet("consumer", stderr, getenv, "log at debug level to stderr")
	fs.StringVar(&o.broker, "broker", "nats", "the broker: nats (claim/claimnats) or kafka (claim/claimkafka)")
	fs.StringVar(&o.kafka, "kafka", getenv("KAFKA_BROKERS"), "Kafka brokers, comma-separated (default $KAFKA_BROKERS); empty: an in-process broker (kfake)")
	fs.StringVar(&o.natsURL, "nats", getenv("NATS_URL"), "NATS URL, with JetStream (default $NATS_URL); empty: an in-process NATS server")
	fs.BoolVar(&o.demo, "demo", false, "publish duplicates and redeliveries, kill a consumer mid-charge, print the story and exit")
	err := program.Parse(fs, args)
	if err == nil && o.broker != "nats" && o.broker != "kafka" {
		err = fmt.Errorf("consumer: -broker %q: want nats or kafka", o.broker)
	}
	return o, err
}

func main() { program.Main(parseOptions, run) }

func run(ctx context.Context, o options, out io.Writer) error {
	log, b, err := program.Start(ctx, o.Flags, out) // prints which stores it runs on
	if err != nil {
		return err
	}
	defer b.Close()
	if o.broker == "kafka" {
		if b.Postgres != nil {
			w, err := newWorker(ctx, b.Postgres, b.ClaimOptions(), log, pgCharges{b.Pool})
			if err != nil {
				return err
			}
			return runKafka(ctx, w, o.kafka, o.demo, out)
		}
		w, err := newWorker(ctx, b.SQLite, b.ClaimOptions(), log, sqliteCharges{b.DB})
		if err != nil {
			return err
		}
		return runKafka(ctx, w, o.kafka, o.demo, out)
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
