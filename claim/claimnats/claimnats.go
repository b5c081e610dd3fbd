// Package claimnats runs a NATS JetStream message handler at most once per
// message identity within the retention, with the claim protocol of package
// claim (Redis fast path, durable arbitration, fencing).
//
// It is its own module, so users of the library do not get the NATS client.
//
// # Identity, operation, tenant, fingerprint
//
// The identity of a message is its Nats-Msg-Id header (the one JetStream
// deduplicates publishes by, within its own, short window), or what
// WithIdentity returns. The operation is the message's subject
// (WithOperation), the tenant "default" (WithTenant). The fingerprint is the
// payload: its RFC 8785 form when it is JSON (member order and spacing do not
// matter), its bytes otherwise. So the same identity with another payload is
// a mismatch, never run.
//
// # Two modes
//
// Consumer.Do runs the handler with claim.Claimer.Do: the effect is a write in
// the claim's database transaction, committed with the result or not at all.
// Consumer.Run is workflow mode for external effects: claim, then the
// handler under the settlement engine every entry point of oncekey shares
// (the lease renewed while it runs, detached from ctx), then Complete (nil
// error), Fail (an error made by claim.Reject), Release (an error wrapping
// ErrNothingHappened: the application says nothing happened) or
// MarkUncertain (any other error). Once the handler started the library
// never releases the key on its own: only complete, fail or mark uncertain.
// Pass Op.ID downstream as that system's idempotency key, so a takeover
// after a crash is deduplicated there.
//
// Run acknowledges nothing before the outcome is recorded: when the store
// is unreachable at the settlement, the write is retried with backoff for
// as long as the lease lasts, so a short outage does not hand the message
// to a redelivery that would take the record over and run it again. Until
// Run settles, it tells JetStream every second that the message is in
// progress (msg.InProgress restarts AckWait), so neither long work nor a
// long settlement is redelivered by AckWait; with an AckWait under about 2
// seconds a redelivery may still come, and is answered in progress. If the
// lease runs out before the outcome is recorded, the message is
// negatively acknowledged (Retry) and the record, still processing, decides
// the redelivery: a takeover after the lease, as after a crash.
//
// A handler that panics does not crash the process: the engine records the
// operation uncertain, Run recovers the panic, logs it at Error with its
// value and stack, and holds the message (Hold, ErrPanicked). A handler
// that calls runtime.Goexit is recorded the same way, but ends the calling
// goroutine. In Do, a panic rolls the transaction back (nothing happened):
// it is logged at Error and the message retried (Retry, ErrPanicked).
//
// # What the broker sees
//
//   - executed or replayed: Ack.
//   - in progress under another consumer: NakWithDelay of the holder's
//     remaining lease (at least WithRetryDelay); the redelivery replays or
//     takes over an abandoned lease.
//   - the handler's error meant nothing happened (Do: any non-Reject error,
//     rolled back; Run: ErrNothingHappened), the store is down, or the
//     settlement could not be written (fenced by a takeover, or the lease
//     ran out with the store down): NakWithDelay(WithRetryDelay). The
//     redelivery is answered from the record.
//   - uncertain (a handler error, a panic): NOT acked.
//     NakWithDelay(WithUncertainDelay, default 1 minute): the message stays
//     in the stream and is redelivered until a claim.Reconciler resolved
//     the record, then acked as a replay.
//   - mismatch, no identity, invalid scope: Term (never redelivered; a
//     terminated-message advisory), and an error log line naming the
//     scope hashed (as package claim logs it), the stream and its
//     sequence, never the raw message id, tenant or subject. The handler
//     never runs.
//
// # Messages given up
//
// A terminated message is gone from the consumer: JetStream keeps no
// dead-letter copy of it (only the advisory). And with MaxDeliver set on
// the JetStream consumer, a message negatively acknowledged on its last
// delivery is not redelivered (a max-deliveries advisory): a held
// uncertain message, nak'd every WithUncertainDelay, is given up after
// MaxDeliver deliveries (the record stays uncertain for the Reconciler
// either way). The Consumer makes both visible: the error Do and Run return
// matches ErrDeadLetter (and ErrDeliveryLimit for the second), WithDeadLetter
// gets the message before its Term or its last nak (to keep it somewhere),
// and the counter oncekey.messages.dead_lettered (WithMeterProvider) counts
// them by reason. The Consumer learns MaxDeliver from WithDeliveryLimit
// only: set it to the JetStream consumer's MaxDeliver.
package claimnats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/driver/consume"
	"github.com/oncekey/oncekey/durable"
)

// Action is what a Consumer did with a message.
type Action = consume.Action

// The actions.
const (
	// Ack: executed or replayed.
	Ack = consume.Ack
	// Retry: negatively acknowledged with a delay; nothing ran here, or the
	// settlement could not be written.
	Retry = consume.Retry
	// Hold: uncertain; negatively acknowledged with the uncertain delay.
	Hold = consume.Hold
	// Terminate: terminated (never redelivered) and never run.
	Terminate = consume.Terminate
)

var (
	// ErrNothingHappened, wrapped by a Run handler's error, states that the
	// handler had no effect: the key is released and the message redelivered.
	ErrNothingHappened = consume.ErrNothingHappened
	// ErrPanicked is matched by the error of a Do or Run whose handler
	// panicked: the panic was recovered and logged at Error. Run recorded
	// the operation uncertain and held the message (Hold); Do's
	// transaction rolled back, so nothing happened, and the message is
	// retried (Retry).
	ErrPanicked = consume.ErrPanicked
	// ErrNoIdentity: the message has no identity (no Nats-Msg-Id header, or
	// WithIdentity returned ""); it is terminated.
	ErrNoIdentity = consume.ErrNoIdentity
	// ErrConfig is matched by every configuration error of New.
	ErrConfig = errors.New("claimnats: invalid configuration")
	// ErrDeadLetter is matched by the error of every message the Consumer
	// gives up on: terminated without running (its error also matches
	// claim.ErrMismatch, ErrNoIdentity or claim.ErrInvalidScope), or
	// negatively acknowledged on its last delivery (ErrDeliveryLimit).
	ErrDeadLetter = consume.ErrDeadLetter
	// ErrDeliveryLimit is matched by the error of a message negatively
	// acknowledged (Retry, Hold) on the last delivery JetStream makes of it
	// (NumDelivered reached WithDeliveryLimit, the consumer's MaxDeliver):
	// JetStream will not redeliver it. It matches ErrDeadLetter.
	ErrDeliveryLimit = consume.ErrDeliveryLimit
)

// Consumer runs handlers once per message identity. Safe for concurrent use.
type Consumer[TTx any] struct {
	c *consume.Consumer[TTx, jetstream.Msg]
}

type config struct {
	consume.Config[jetstream.Msg]
}

// Option configures a Consumer.
type Option func(*config) error

// WithIdentity sets the identity of a message. Defaults to its Nats-Msg-Id
// header. "" means none: the message is terminated.
func WithIdentity(f func(jetstream.Msg) string) Option {
	return func(c *config) error { return c.SetIdentity(f) }
}

// WithOperation sets the operation of a message. Defaults to its subject.
func WithOperation(f func(jetstream.Msg) string) Option {
	return func(c *config) error { return c.SetOperation(f) }
}

// WithTenant sets the tenant of a message. Defaults to "default".
// An empty tenant is an invalid scope: the message is terminated.
func WithTenant(f func(jetstream.Msg) string) Option {
	return func(c *config) error { return c.SetTenant(f) }
}

// WithLogger logs with l. Defaults to discarding logs.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error { return c.SetLogger(l) }
}

// WithRetryDelay sets the redelivery delay after nothing happened, a store
// outage or a settlement not written, and the least delay for in-progress
// duplicates. Defaults to 1s. Positive.
func WithRetryDelay(d time.Duration) Option {
	return func(c *config) error { return c.SetRetryDelay(d) }
}

// WithUncertainDelay sets the redelivery delay of an uncertain message.
// Defaults to 1 minute. Positive.
func WithUncertainDelay(d time.Duration) Option {
	return func(c *config) error { return c.SetUncertainDelay(d) }
}

// WithDeadLetter calls f with each message the Consumer gives up on, before
// it terminates it (Term) or negatively acknowledges its last delivery; err
// matches ErrDeadLetter (see ErrDeliveryLimit). f runs on the goroutine
// that called Do or Run, before the acknowledgement: keep it short (keep
// the message somewhere, alert). Without it, a given-up message is still
// reported by an Error log line, the error Do and Run return, and the
// counter oncekey.messages.dead_lettered (WithMeterProvider).
func WithDeadLetter(f func(ctx context.Context, msg jetstream.Msg, err error)) Option {
	return func(c *config) error { return c.SetDeadLetter(f) }
}

// WithDeliveryLimit tells the Consumer the JetStream consumer's MaxDeliver
// (n > 0): a delivery negatively acknowledged (Retry, Hold) when its
// NumDelivered has reached n is the last, so it is reported as given up
// (ErrDeliveryLimit, WithDeadLetter, the metric). 0, the default, is no
// limit, as JetStream's default MaxDeliver (-1) is.
func WithDeliveryLimit(n int) Option {
	return func(c *config) error { return c.SetDeliveryLimit(n) }
}

// WithMeterProvider records the Consumer's metric with mp: the counter
// oncekey.messages.dead_lettered of messages given up, with the attributes
// adapter ("claimnats") and reason (mismatch, no_identity, invalid_scope,
// config, delivery_limit, other), never a message id. The Claimer's own
// metrics are configured on the Claimer. Defaults to none.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) error { return c.SetMeterProvider(mp) }
}

// Step runs one step of the workflow of a [Consumer.Run] handler, at most
// once per operation across redeliveries and takeovers (see
// [claim.Lease.Step]): a step an earlier delivery finished returns its
// recorded result without running, so the redelivery after a crash resumes
// where the work stopped. fn gets the step's downstream idempotency key. A
// step that turns the operation uncertain ([claim.ErrStepUncertain]) makes
// the message's outcome uncertain whatever the handler returns. Outside a
// Run handler it returns an error matching [ErrConfig].
func Step(ctx context.Context, name string, fn func(ctx context.Context, key string) ([]byte, error), opts ...claim.StepOption) ([]byte, error) {
	return consume.Step(ctx, errStepOutsideRun, name, fn, opts...)
}

var errStepOutsideRun = fmt.Errorf("claimnats: Step outside a Run handler: %w", ErrConfig)

// New returns a Consumer claiming with c.
func New[TTx any](c *claim.Claimer[TTx], opts ...Option) (*Consumer[TTx], error) {
	cfg := config{consume.NewConfig(
		func(m jetstream.Msg) string { return m.Headers().Get(nats.MsgIdHdr) },
		jetstream.Msg.Subject,
		func(jetstream.Msg) string { return "default" })}
	cc, err := consume.New(ErrConfig, c, &cfg, &cfg.Config, opts, broker)
	if err != nil {
		return nil, err
	}
	return &Consumer[TTx]{c: cc}, nil
}

// broker is what is JetStream's in a Consumer.
var broker = consume.Broker[jetstream.Msg]{
	Name:    "claimnats",
	Payload: jetstream.Msg.Data,
	Where: func(m jetstream.Msg) []any {
		if md, err := m.Metadata(); err == nil {
			return []any{"stream", md.Stream, "stream_seq", md.Sequence.Stream, "consumer", md.Consumer}
		}
		return nil
	},
	Last: func(m jetstream.Msg, limit int) bool {
		md, err := m.Metadata()
		return err == nil && md.NumDelivered >= uint64(limit)
	},
	Running: inProgress,
	Settle:  settle,
}

// Do runs fn once per message identity in the claim's transaction
// (claim.Claimer.Do), then acknowledges msg as the package doc says. It
// returns what it did and why (nil for Ack), or the broker's error.
func (c *Consumer[TTx]) Do(ctx context.Context, msg jetstream.Msg,
	fn func(ctx context.Context, tx TTx, msg jetstream.Msg, op claim.Op) (durable.Result, error)) (Action, error) {
	return c.c.Do(ctx, msg, fn)
}

// Run runs fn once per message identity in workflow mode, then acknowledges
// msg as the package doc says, once the outcome is recorded (or the lease
// ran out trying). fn's context ends when the lease is lost (context.Cause:
// claim.ErrFenced or claim.ErrLeaseExpired), not when ctx does. Until then
// msg is kept in progress every second (msg.InProgress); a redelivery that
// comes anyway (AckWait under about 2 seconds) is answered in progress. A
// panic of fn is recovered: the operation is recorded uncertain and msg
// held (Hold, an error matching ErrPanicked).
func (c *Consumer[TTx]) Run(ctx context.Context, msg jetstream.Msg,
	fn func(ctx context.Context, msg jetstream.Msg, op claim.Op) (durable.Result, error)) (Action, error) {
	return c.c.Run(ctx, msg, fn) // kept in progress by inProgress (broker.Running)
}

// progressEvery is how often Run tells JetStream that its message is in
// progress (nanoseconds; a variable for the tests).
var progressEvery atomic.Int64

func init() { progressEvery.Store(int64(time.Second)) }

// inProgress tells JetStream every progressEvery that msg is in progress
// (msg.InProgress restarts its AckWait), until stop, which returns once
// the last of them was sent: long work, or a completion retried through a
// store outage, is not redelivered by AckWait meanwhile.
func inProgress(msg jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Duration(progressEvery.Load()))
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = msg.InProgress() // a failure leaves AckWait to redeliver: answered from the record
			}
		}
	}()
	return func() { close(done); <-finished }
}

// settle is JetStream's action for d.
func settle(msg jetstream.Msg, d consume.Decision, _ *slog.Logger) error {
	switch d.Action {
	case Ack:
		return msg.Ack()
	case Retry, Hold:
		return msg.NakWithDelay(d.Delay)
	case Terminate:
		// Term, not TermWithReason: servers before 2.10.4 ignore the latter
		// and would redeliver. The reason is in the log line.
		return msg.Term()
	}
	return nil
}
