// Telemetry is an example program that wires a Claimer to the
// OpenTelemetry SDK and to log/slog, runs a few claims and prints the
// spans, metrics and logs the library emits.
//
//	go run ./telemetry          # from examples/ (./examples/telemetry from the root); embedded: nothing to install
//	DATABASE_URL=postgres://... REDIS_URL=redis://... go run ./telemetry
//	go run ./telemetry -v       # the library's debug logs too
//
// The Claimer gets three options: claim.WithTracerProvider with an SDK
// TracerProvider, claim.WithMeterProvider with an SDK MeterProvider, and
// claim.WithLogger with a slog text logger. Here the spans go to an
// in-memory recorder (sdk/trace/tracetest) and the metrics to a manual
// reader, so the program can print them when it is done; a service
// registers its exporters (OTLP, Prometheus, ...) on the same providers
// instead, and the Claimer does not change. The SDK is a dependency of
// this example module only: the library itself needs the OpenTelemetry
// API alone, and records nothing without the options.
//
// The program runs four requests of one operation through Claimer.Do:
//
//  1. the first request, which runs the business function (executed);
//  2. a duplicate sent while that function runs, answered in progress
//     (by Redis, which holds the lease);
//  3. a retry after the first finished, which replays the stored result;
//  4. the key reused for another order, refused with claim.ErrMismatch;
//
// then another operation in the workflow mode (Claimer.Claim, then the
// lease's Complete), with a worker that stalls:
//
//  5. a worker claims it with a 300ms lease and stalls past the lease;
//  6. another worker claims it: a takeover, which the library logs;
//  7. that worker completes it;
//  8. the stalled worker wakes up and completes too: fenced off
//     (claim.ErrFenced), nothing written.
//
// It then prints each span as a tree (oncekey.claim with its children
// oncekey.redis.claim, oncekey.durable.transaction, oncekey.durable.claim;
// oncekey.finish with oncekey.durable.finish; their oncekey.* attributes
// and events) and each metric with its data points (oncekey.claims by
// outcome, oncekey.claim.duration, oncekey.replays by source,
// oncekey.mismatches, oncekey.takeovers, oncekey.fenced, and the gauges
// read from the store and Redis, such as oncekey.records by state). The
// library's log lines (the takeover, the fenced completion) come through
// the slog logger, between the numbered lines. The claim package
// documentation lists the spans and metrics (# Traces, # Metrics).
//
// Neither the spans, the metrics nor the logs hold the idempotency key, the
// tenant or a body: an operation is named by its identity, a hash (the
// oncekey.operation_id attribute). The program prints that, never the key.
//
// # Services
//
// -postgres (default $DATABASE_URL) and -redis (default $REDIS_URL) name
// the servers to use; each one not named is replaced by its embedded
// stand-in (a SQLite file under the OS temporary directory, or -data DIR,
// and an in-process Redis), as in the other examples. The program prints
// which it runs on. The in-process Redis does not expire keys with time,
// so on it steps 5 to 8 run on a second Claimer without Redis (the program
// says so): a Redis lease that never runs out would answer the takeover
// "in progress".
package main
