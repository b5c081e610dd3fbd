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

func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	var o options
	fs := o.Flags.FlagSet("deploys", stderr, getenv, "log at debug level to stderr; by default warnings and errors")
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8082", "listen address (the demo listens on 127.0.0.1:0)")
	fs.BoolVar(&o.demo, "demo", false, "start on a free port, fire the demo requests at itself, print what happened and exit")
	err := program.Parse(fs, args)
	return o, err
}

func main() { program.Main(parseOptions, run) }

// run opens the services and runs the service on the durable store they
// give (PostgreSQL or the embedded SQLite file).
func run(ctx context.Context, o options, out io.Writer) error {
	log, b, err := program.Start(ctx, o.Flags, out) // prints which stores it runs on
	if err != nil {
		return err
	}
	defer b.Close()
	if b.Embedded() {
		return serve(ctx, o, out, log, b, sqliteRiver(b))
	}
	return serve(ctx, o, out, log, b, postgresRiver(b))
}
