// Package entrytest is the conformance suite of oncekey's entry points
// (claimhttp, claimgrpc, claimnats, claimamqp, claimriver), as
// testkit/storetest is that of its stores: one table of windows, each
// forced through every adapter by a small [Driver], with the effects
// counted downstream of the adapter and every replay checked in the
// adapter's own format.
//
// Every window checks the rule after start (docs/DESIGN.md 6.3) from the
// outside: per operation at most one effect (or, where the design allows a
// second after a store outage longer than the lease, exactly what it
// allows); every replay equal to the answer of the execution that was
// recorded; every retry of a finished operation replayed, never told it is
// in progress, whatever Redis holds of it; no key held forever. A window
// reports what it saw as [Violation] values, so a negative control can
// assert that a broken settlement is caught ([Catch]).
//
// The suite owns the store's connection: a [pgproxy.Cutter] between the
// adapter's Claimer and PostgreSQL, which it takes down to force outages;
// Redis comes from testkit/testenv under a prefix of the window's own, and
// the Claimer's Redis client dials through a gate the suite takes down
// too.
//
// Only tests import this package (the adapters' conformance_test.go), so
// nothing of it enters a user's module graph.
//
// It is part of oncekey's unstable module seam (package testkit): not for
// applications, no compatibility promise between versions.
package entrytest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// Outcome is an adapter's answer to one request or delivery, normalized.
type Outcome int

const (
	// Executed: the work ran for this request, and the answer is its
	// result (as published: Answer.Result).
	Executed Outcome = iota + 1
	// Accepted: the work was queued (asynchronous adapters); its result
	// comes back on a later request with the same key, as a replay.
	Accepted
	// Replayed: nothing ran; the answer is the stored result.
	Replayed
	// InProgress: another request of the operation holds the key, or the
	// result is not recorded yet; retry.
	InProgress
	// Uncertain: the outcome is unknown and left to a reconciler; it will
	// not run again.
	Uncertain
	// Rejected: the key was used for another request; nothing ran.
	Rejected
	// Error: anything else (the store unreachable, the caller gone, the
	// process's own failure); nothing is known from it.
	Error
)

func (o Outcome) String() string {
	switch o {
	case Executed:
		return "executed"
	case Accepted:
		return "accepted"
	case Replayed:
		return "replayed"
	case InProgress:
		return "in-progress"
	case Uncertain:
		return "uncertain"
	case Rejected:
		return "rejected"
	case Error:
		return "error"
	}
	return "outcome(?)"
}

// final reports whether a request that got o need not be retried.
func (o Outcome) final() bool {
	switch o {
	case Executed, Replayed, Uncertain, Rejected:
		return true
	}
	return false
}

// Result is a stored or published result, decoded from the adapter's own
// format back to what the suite's handler gave.
type Result struct {
	// Failed: the handler's answer was a business failure (HTTP status
	// 402, a gRPC FailedPrecondition of the suite's domain, a
	// claim.Reject from a consumer or River work).
	Failed bool
	// Body is the handler's body as the adapter carries it back.
	Body []byte
	// Omitted: the adapter stored and answered the result without its
	// body, because it was over the adapter's limit.
	Omitted bool
}

func (r Result) equal(o Result) bool {
	return r.Failed == o.Failed && r.Omitted == o.Omitted && string(r.Body) == string(o.Body)
}

// Answer is one request's answer.
type Answer struct {
	Outcome Outcome
	// Result is set for Executed and Replayed.
	Result Result
	// Detail says more for a log line (a status, a problem type, a gRPC
	// code, a broker action).
	Detail string
}

// ResponseKind is what the suite's handler answers.
type ResponseKind int

const (
	// Success: store and publish Body as a success.
	Success ResponseKind = iota + 1
	// Failure: a final business failure with Body (stored as failed).
	Failure
	// Unknown: the handler does not know what became of its effect: the
	// adapter's way of marking the operation uncertain (claimhttp and
	// claimgrpc MarkUncertain, a consumer's error, River work's error on
	// its last attempt).
	Unknown
)

// Response is the suite's handler's answer, for the driver to give its
// adapter in the adapter's terms.
type Response struct {
	Kind ResponseKind
	Body []byte
}

// Handler is the work the suite gives a driver: the driver's adapter calls
// it with the operation identity the adapter hands its handlers and the
// request's payload (the HTTP body, the gRPC request's "payload" field, the
// message body, the job's payload), and gives its answer back to the
// adapter. It may panic (after its effect): the driver lets the panic go
// through the adapter.
type Handler func(ctx context.Context, opID string, payload []byte) Response

// Env is what the suite gives Driver.Start for one window.
type Env struct {
	T *testing.T
	// Claimer reaches PostgreSQL through the suite's proxy (which the
	// windows take down) and has Redis in front; the adapter must use it.
	Claimer *claim.Claimer[pgx.Tx]
	// Schema is the window's own schema, reached directly (for tables the
	// driver's transport needs, such as River's).
	Schema testenv.Schema
	// Lease is the Claimer's lease.
	Lease time.Duration
	// Handler is the work.
	Handler Handler
	// Record reads the durable record of scope directly (not through the
	// proxy): for a driver whose adapter answers no result of its own (a
	// consumer acknowledges; the stored result is the handler's), to
	// decode what it stored ([StoredResult]).
	Record func(ctx context.Context, scope durable.Scope) (durable.Record, error)
}

// StoredResult decodes a finished record whose result is the handler's
// own durable.Result (the message consumers and River store what the
// handler returned): its body, and whether it is failed. Any other state
// has no result.
func StoredResult(rec durable.Record) (Result, bool) {
	if (rec.State != durable.Completed && rec.State != durable.Failed) || rec.Result == nil {
		return Result{}, false
	}
	return Result{Failed: rec.State == durable.Failed, Body: rec.Result.Body}, true
}

// Caps is what a driver tells the suite about its adapter.
type Caps struct {
	// Tenant is the tenant the adapter's records are claimed under.
	Tenant string
	// NotApplicable names the windows that do not apply to the adapter,
	// each with the reason.
	NotApplicable map[string]string
	// MaxResult is the largest result body the adapter keeps whole; the
	// oversized window produces one four times as large. Zero when the
	// adapter has no limit of its own (the window must then be declared
	// not applicable).
	MaxResult int
	// Timer is the transport's own timer that the long-work window outlasts
	// (NATS AckWait, River's job timeout); zero when it has none (the
	// window then outlasts the lease alone).
	Timer time.Duration
}

// Driver runs one adapter for the suite.
type Driver interface {
	// Caps describes the adapter.
	Caps() Caps
	// Start starts the adapter over env.Claimer with env.Handler as its
	// handler, and returns its client side. Whatever it starts is stopped
	// by env.T's cleanups.
	Start(env Env) Adapter
	// Encode returns the durable result that the adapter replays as r: what
	// an operator or a Reconciler stores to resolve an operation of this
	// adapter. r.Kind is Success or Failure.
	Encode(r Response) durable.Result
}

// Adapter is a started adapter's client side.
type Adapter interface {
	// Send delivers one request (publishes one message, enqueues one job)
	// with key as its idempotency key and payload as its body, and returns
	// the answer. A synchronous adapter returns when it answered; ctx
	// ending is the caller going away (the answer is then Error). A
	// consumer's driver waits until the message was acknowledged,
	// terminated or held (redeliveries are the broker's), or a bounded
	// time passed (the answer is then the last one seen, InProgress).
	Send(ctx context.Context, key string, payload []byte) Answer
}
