// Package consume holds what the message-consumer adapters (claim/claimnats,
// claim/claimamqp) share: how a message becomes a claim request (identity,
// fingerprint), how the claim and the handler run (workflow mode through
// the one settlement engine, claim/driver/settle), which broker action
// each outcome calls for, and how a message given up is reported (Drops).
// Consumer puts these together; the adapters only configure it (Config)
// and tell it their broker (Broker): a message's payload and delivery
// count, and how an Action becomes their broker's ack, negative ack or
// termination.
//
// It is part of oncekey's unstable module seam (package driver): not for
// applications, no compatibility promise between versions.
package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/oncekey/oncekey/canon"
	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/driver/settle"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/internal/logkeys"
)

// Action is what the adapter does with the message.
type Action int

const (
	// Ack: the operation finished (executed now or replayed); acknowledge.
	Ack Action = iota + 1
	// Retry: nothing ran here (in progress under another consumer, the
	// store is down, the lease was lost); redeliver after Decision.Delay.
	Retry
	// Hold: the outcome is uncertain; not acknowledged as success, redelivered
	// after Decision.Delay, and replayed once a Reconciler resolved it.
	Hold
	// Terminate: the message can never run (its id was used for another
	// payload, or it has no usable identity); dead-letter it, never redeliver.
	// Its Decision.Err matches ErrDeadLetter.
	Terminate
)

func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	case Hold:
		return "hold"
	case Terminate:
		return "terminate"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// ErrNothingHappened, wrapped by a workflow handler's error, states that the
// handler had no effect: the lease is released and the message redelivered,
// to run again. Any other handler error marks the operation uncertain.
var ErrNothingHappened = errors.New("consume: handler had no effect")

// ErrNoIdentity is the cause of a Terminate for a message without an identity.
var ErrNoIdentity = errors.New("consume: message has no identity")

// Message is the broker-independent view of one delivery.
type Message struct {
	// ID is the message identity (header or user function); "" is none.
	ID        string
	Tenant    string
	Operation string
	Payload   []byte
	// Where names the delivery for a log line (stream sequence, delivery
	// tag), as slog attributes; never the identity.
	Where []any
}

// Delays configures how long a message waits before its redelivery.
type Delays struct {
	// Retry is used after a handler error that meant nothing happened, after
	// a store outage and after a lost lease. InProgress uses the holder's
	// remaining lease (Outcome.RetryAfter) instead, bounded below by Retry.
	Retry time.Duration
	// Uncertain is used while the outcome is uncertain.
	Uncertain time.Duration
}

// DefaultDelays are the delays when none are configured.
var DefaultDelays = Delays{Retry: time.Second, Uncertain: time.Minute}

// Decision is the action for one delivery, with its delay and cause.
type Decision struct {
	Action Action
	// Delay is set for Retry and Hold.
	Delay time.Duration
	// Kind is the claim outcome, when the claim answered.
	Kind claim.Kind
	// Err is the cause of a Retry, Hold or Terminate; nil for Ack.
	Err error
}

// Fingerprint is the fingerprint of a payload: the RFC 8785 form of a JSON
// payload (so member order and spacing do not matter), otherwise the raw
// bytes; the two are domain-separated.
func Fingerprint(payload []byte) string {
	if c, err := canon.JSONStrict(payload); err == nil {
		return string(canon.Sum([]byte("oncekey/msg/v1/json"), c))
	}
	return string(canon.Sum([]byte("oncekey/msg/v1/raw"), payload))
}

func request(m Message) (claim.Request, error) {
	if m.ID == "" {
		return claim.Request{}, ErrNoIdentity
	}
	return claim.Request{
		Scope:       durable.Scope{Tenant: m.Tenant, Operation: m.Operation, Key: m.ID},
		Fingerprint: Fingerprint(m.Payload),
	}, nil
}

// Do runs fn once per message identity with claim.Claimer.Do: the effect is
// a database write in the claim's transaction. A panic of fn rolls the
// transaction back (claim.Do) and is recovered here: logged at Error, and
// the message retried (an error matching ErrPanicked), since nothing
// happened.
func Do[TTx any](ctx context.Context, c *claim.Claimer[TTx], m Message, d Delays, log *slog.Logger,
	fn func(ctx context.Context, tx TTx, op claim.Op) (durable.Result, error)) Decision {
	req, err := request(m)
	if err != nil {
		return terminate(log, m, err)
	}
	out, pv, err := doRecovering(ctx, c, req, fn)
	if pv != nil {
		// fn panicked: claim.Do rolled its transaction back, so nothing
		// happened and the key is free. The message is retried (a panic
		// on every delivery is reported at the broker's delivery limit).
		log.ErrorContext(ctx, "oncekey: message handler panicked; rolled back, redelivering",
			append([]any{logkeys.Panic, pv.v, logkeys.Stack, pv.stack}, m.Where...)...)
		return Decision{Action: Retry, Delay: d.Retry, Err: fmt.Errorf("%w: %v", ErrPanicked, pv.v)}
	}
	if err != nil {
		if pre := claimError(log, m, err, d); pre != nil {
			return *pre
		}
		// fn's own transient error: rolled back, the key is free.
		return Decision{Action: Retry, Delay: d.Retry, Err: err}
	}
	return fromOutcome(out, d)
}

type panicValue struct {
	v     any
	stack string
}

// doRecovering is c.Do, with a panic of fn (re-panicked by c.Do once it
// rolled the transaction back) recovered into pv.
func doRecovering[TTx any](ctx context.Context, c *claim.Claimer[TTx], req claim.Request,
	fn func(ctx context.Context, tx TTx, op claim.Op) (durable.Result, error)) (out claim.Outcome, pv *panicValue, err error) {
	returned := false
	defer func() {
		if !returned {
			pv = &panicValue{v: recover(), stack: string(debug.Stack())}
		}
	}()
	out, err = c.Do(ctx, req, fn)
	returned = true
	return out, pv, err
}

// Run runs fn once per message identity in workflow mode: Claim, then fn
// under the one settlement engine of started work (claim/driver/settle),
// which renews the lease detached from ctx and records fn's answer: Complete
// (nil error), Fail (an error made by claim.Reject), Release (fn's error
// wraps ErrNothingHappened, the application's word) or MarkUncertain (any
// other error). Once fn started, the key is never released unless fn said
// nothing happened.
//
// The engine runs with no handoff: Run returns only once the outcome is
// recorded, or the lease ran out trying (the store stayed unreachable), so
// a message is never acknowledged for an outcome that is not recorded. The
// report becomes the action: recorded, Ack (completed or failed), Hold
// (uncertain) or Retry (released); the lease lost to another consumer, the
// write fenced, the lease run out or any other store error, Retry: the
// record is left to decide the redelivery (a replay, in progress, or a
// takeover after the lease, as after a crash).
//
// A panic of fn is recorded as uncertain by the engine, then recovered here
// (a consumer's process must not crash on one message, nor hold it
// forever): it is logged at Error with its value and stack and the message
// is held (Hold), never run again until a Reconciler resolved it.
func Run[TTx any](ctx context.Context, c *claim.Claimer[TTx], m Message, d Delays, log *slog.Logger,
	fn func(ctx context.Context, op claim.Op) (durable.Result, error)) Decision {
	req, err := request(m)
	if err != nil {
		return terminate(log, m, err)
	}
	out, err := c.Claim(ctx, req)
	if err != nil {
		if pre := claimError(log, m, err, d); pre != nil {
			return *pre
		}
		return Decision{Action: Retry, Delay: d.Retry, Err: err}
	}
	if out.Kind != claim.Acquired {
		return fromOutcome(out, d)
	}
	return work(ctx, out.Lease, m, d, log, fn)
}

// work runs fn under l with the engine; see Run.
func work(ctx context.Context, l *claim.Lease, m Message, d Delays, log *slog.Logger,
	fn func(ctx context.Context, op claim.Op) (durable.Result, error)) (dec Decision) {
	op := settle.NewOp(l)
	eng := settle.Engine{Name: "oncekey: consumer", Logger: log}
	var herr error
	returned := false
	defer func() {
		if returned {
			return
		}
		// fn panicked; the engine recorded the outcome (uncertain) before
		// the panic reached here. recover is nil for runtime.Goexit, which
		// cannot be stopped: the goroutine ends after this.
		v := recover()
		log.ErrorContext(ctx, "oncekey: message handler panicked; outcome recorded as uncertain, message held for the reconciler",
			append([]any{logkeys.Op, op.ID, logkeys.Panic, v, logkeys.Stack, string(debug.Stack())}, m.Where...)...)
		dec = Decision{Action: Hold, Delay: d.Uncertain, Kind: claim.Uncertain, Err: fmt.Errorf("%w: %v", ErrPanicked, v)}
	}()
	r := eng.Run(ctx, l, op, func(ctx context.Context) settle.Settlement {
		res, err := fn(ctx, claim.Op{ID: op.ID, Token: op.Token})
		herr = err
		return settlementOf(res, err)
	})
	returned = true
	return decide(ctx, log, op.ID, r, herr, d)
}

// ErrPanicked is the cause of the Hold of a message whose workflow handler
// panicked (Run: recorded uncertain), or of the Retry of one whose
// transaction handler panicked (Do: rolled back).
var ErrPanicked = errors.New("consume: message handler panicked")

// settlementOf is what a workflow handler's answer records.
func settlementOf(res durable.Result, err error) settle.Settlement {
	switch {
	case err == nil:
		return settle.Settlement{Kind: settle.Complete, Result: res}
	case errors.Is(err, ErrNothingHappened):
		return settle.Settlement{Kind: settle.Release}
	}
	if rres, ok := claim.RejectedResult(err); ok {
		return settle.Settlement{Kind: settle.Fail, Result: rres}
	}
	return settle.Settlement{Kind: settle.Uncertain}
}

// decide turns the engine's report into the broker's action.
func decide(ctx context.Context, log *slog.Logger, opID string, r settle.Report, herr error, d Delays) Decision {
	switch r.Verdict() {
	case settle.Recorded:
		return Decision{Action: Ack, Kind: claim.Executed}
	case settle.RecordedUncertain:
		log.WarnContext(ctx, "oncekey: message outcome uncertain; held for the reconciler",
			logkeys.Op, opID, logkeys.Err, herr)
		if herr == nil {
			herr = errUncertain
		}
		return Decision{Action: Hold, Delay: d.Uncertain, Kind: claim.Uncertain, Err: herr}
	case settle.RecordedRelease:
		return Decision{Action: Retry, Delay: d.Retry, Err: herr}
	case settle.Lost, settle.Pending, settle.ReleasePending, settle.RanOut, settle.Unrecorded:
		// Not recorded by this consumer: the lease was lost to another
		// one (whose outcome is the operation's), the write was fenced,
		// the lease ran out while the store was unreachable (the record
		// stays processing; after the lease a takeover or the Reconciler
		// decides), or another store error. The next delivery is
		// answered from the record.
	}
	serr := r.Cause()
	log.WarnContext(ctx, "oncekey: message settlement not written; redelivering",
		logkeys.Op, opID, logkeys.Step, r.Settlement.Kind.String(), logkeys.Err, serr)
	return Decision{Action: Retry, Delay: d.Retry, Err: serr}
}

// claimError maps an error of the claim itself (nothing ran); nil for an
// error of the handler.
func claimError(log *slog.Logger, m Message, err error, d Delays) *Decision {
	switch {
	case errors.Is(err, claim.ErrMismatch), errors.Is(err, claim.ErrInvalidScope), errors.Is(err, claim.ErrConfig):
		dec := terminate(log, m, err)
		return &dec
	case errors.Is(err, claim.ErrUnavailable), errors.Is(err, claim.ErrLeaseExpired):
		return &Decision{Action: Retry, Delay: d.Retry, Err: err}
	}
	return nil
}

func terminate(log *slog.Logger, m Message, err error) Decision {
	// Never the raw id, nor a hash of it (a store configured with a key
	// secret names records by an HMAC this package cannot compute): the
	// scope as the library logs it (tenant and operation hashed, no key),
	// the cause, and where the broker holds the message.
	attrs := append([]any{logkeys.Scope, durable.Scope{Tenant: m.Tenant, Operation: m.Operation}, logkeys.Err, err}, m.Where...)
	log.Error("oncekey: message dead-lettered, never run", attrs...)
	return Decision{Action: Terminate, Err: fmt.Errorf("%w: %w", ErrDeadLetter, err)}
}

func fromOutcome(out claim.Outcome, d Delays) Decision {
	switch out.Kind {
	case claim.Executed, claim.Replayed:
		return Decision{Action: Ack, Kind: out.Kind}
	case claim.InProgress:
		return Decision{Action: Retry, Kind: out.Kind, Delay: max(out.RetryAfter, d.Retry), Err: errInProgress}
	case claim.Uncertain:
		return Decision{Action: Hold, Kind: out.Kind, Delay: d.Uncertain, Err: errUncertain}
	}
	return Decision{Action: Retry, Kind: out.Kind, Delay: d.Retry, Err: fmt.Errorf("consume: unexpected outcome %v", out.Kind)}
}

var (
	errInProgress = errors.New("consume: in progress under another consumer")
	errUncertain  = errors.New("consume: outcome uncertain, awaiting the reconciler")
)

// Step runs a step of the workflow of the Run handler of ctx (settle.Step),
// or returns notInRun outside one.
func Step(ctx context.Context, notInRun error, name string, fn func(ctx context.Context, key string) ([]byte, error), opts ...claim.StepOption) ([]byte, error) {
	return settle.Step(ctx, notInRun, name, fn, opts...)
}
