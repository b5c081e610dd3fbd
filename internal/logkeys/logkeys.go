// Package logkeys is the library's vocabulary: the keys of the attributes
// of every log line it writes, and the prefixes of its error texts. This
// comment is the one place both are written down. A test in this package
// reads every log call and every errors.New and fmt.Errorf of the library's
// modules (this one, durable/sqlite, claim/claimgrpc, claim/claimnats,
// claim/claimamqp, claim/claimkafka and claim/claimriver) and fails on a key not listed here
// or an error text that breaks the rule below.
//
// # Log keys
//
// The packages of this module use the constants. The adapter modules, which
// may not import another module's internal packages (go run
// ./internal/cmd/seams), write the same strings, and the test holds them to
// this list. One key holds one thing everywhere:
//
//   - op: the operation the line is about: a
//     [github.com/oncekey/oncekey/durable.Ref], logged as its operation
//     identity, or that identity itself ("op_" and 43 base64url characters
//     of a hash).
//   - err: the error.
//   - scope: a [github.com/oncekey/oncekey/durable.Scope] without its key,
//     logged as its LogValue ("scope:" and the hash of tenant and
//     operation), where no operation identity can be computed (a message
//     given up before its claim).
//   - generation: the fencing generation of the lease the line is about.
//   - step: the settlement being recorded ("complete", "fail", "release",
//     "mark uncertain").
//   - method: the full gRPC method of the call (claimgrpc).
//   - panic, stack: the value a handler panicked with, and the stack of its
//     goroutine.
//   - action: what a consumer tells its broker to do with a message ("ack",
//     "retry", "hold", "terminate").
//   - state, claims, suppressed: the Redis breaker's state ("closed",
//     "open", "half-open"), where claims go from then on, and how many
//     openings were not logged since the last line.
//   - deleted: how many expired records a sweep deleted.
//   - settings: the database settings that need changing (durability, the
//     pool's session timeouts).
//   - policy: Redis's maxmemory-policy.
//   - stream, stream_seq, consumer: where JetStream holds a message
//     (claimnats).
//   - delivery_tag, redelivered: where RabbitMQ holds a delivery
//     (claimamqp).
//   - topic, partition, offset: where Kafka holds a record (claimkafka).
//
// No value is a raw idempotency key, a tenant, or request data (a body, an
// email, an account number): records are named by op or scope, which are
// hashes, and messages by where the broker holds them. err and panic hold the library's own errors, which follow the same
// rule, or what the application's code returned or panicked with, logged as
// it is.
//
// # Error prefixes
//
// The text of every error a library package makes starts with the name of
// that package, a colon and a space: "claim: ", "durable: ", "canon: ", "fence: ",
// "settle: ", "consume: ", "claimhttp: ", "claimgrpc: ", "wire: ", and so
// on. The two stores, whose package names say less than their paths, use
// the path: "durable/postgres: ", "durable/sqlite: ". Besides:
//
//   - An error that wraps another first (fmt.Errorf("%w: nil pool",
//     ErrConfig)) starts with the wrapped error, which carries its own
//     prefix.
//   - A sentinel shared across packages keeps the prefix of the package
//     that defines it: claim.ErrMismatch is durable.ErrMismatch, "durable:
//     ...", and claimnats's ErrDeadLetter is consume's, "consume: ...".
//   - The setters of settle.Settings and consume.Config, which every
//     adapter wraps in its own ErrConfig, start with the adapter option
//     they check ("WithRetryAfter: must be positive"), and consume's errors
//     about a broker start with its adapter's name (Broker.Name, "%s: ").
//
// The test keeps a map from package path to the prefixes it allows; a
// package missing from it is held to its name.
package logkeys

// The keys of the library's log lines; see the package documentation for
// what each holds.
const (
	Op          = "op"
	Err         = "err"
	Scope       = "scope"
	Generation  = "generation"
	Step        = "step"
	Method      = "method"
	Panic       = "panic"
	Stack       = "stack"
	Action      = "action"
	State       = "state"
	Claims      = "claims"
	Suppressed  = "suppressed"
	Deleted     = "deleted"
	Settings    = "settings"
	Policy      = "policy"
	Stream      = "stream"
	StreamSeq   = "stream_seq"
	Consumer    = "consumer"
	DeliveryTag = "delivery_tag"
	Redelivered = "redelivered"
	Topic       = "topic"
	Partition   = "partition"
	Offset      = "offset"
)
