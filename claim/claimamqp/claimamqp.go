// Package claimamqp runs a RabbitMQ (AMQP 0-9-1) message handler at most once
// per message identity within the retention, with the claim protocol of
// package claim (Redis fast path, durable arbitration, fencing).
//
// It is its own module, so users of the library do not get the AMQP client.
//
// # Identity, operation, tenant, fingerprint
//
// The identity of a message is its message-id property, or what WithIdentity
// returns. The operation is the queue name given to New (WithOperation), the
// tenant "default" (WithTenant). The fingerprint is the body: its RFC 8785 form when
// it is JSON (member order and spacing do not matter), its bytes otherwise.
// So the same identity with another body is a mismatch, never run.
//
// # Two modes
//
// Consumer.Do runs the handler with claim.Claimer.Do: the effect is a write in
// the claim's database transaction. Consumer.Run is workflow mode for external
// effects: claim, then the handler under the settlement engine every entry
// point of oncekey shares (the lease renewed while it runs, detached from
// ctx), then Complete (nil error), Fail (an error made by claim.Reject),
// Release (an error wrapping ErrNothingHappened: the application says
// nothing happened) or MarkUncertain (any other error). Once the handler
// started the library never releases the key on its own. Pass Op.ID
// downstream as that system's idempotency key.
//
// Run acknowledges nothing before the outcome is recorded: when the store
// is unreachable at the settlement, the write is retried with backoff for
// as long as the lease lasts, so a short outage does not hand the message
// to a redelivery that would take the record over and run it again. The
// delivery stays unacknowledged meanwhile, which RabbitMQ needs nothing
// for: it has no acknowledgement timer but consumer_timeout (30 minutes by
// default), which must exceed the longest work plus the lease. If the
// lease runs out before the outcome is recorded, the delivery is requeued
// (Retry) and the record, still processing, decides the redelivery: a
// takeover after the lease, as after a crash.
//
// A handler that panics does not crash the process: the engine records the
// operation uncertain, Run recovers the panic, logs it at Error with its
// value and stack, and holds the delivery (Hold, ErrPanicked). A handler
// that calls runtime.Goexit is recorded the same way, but ends the calling
// goroutine. In Do, a panic rolls the transaction back (nothing happened):
// it is logged at Error and the delivery retried (Retry, ErrPanicked).
//
// # What the broker sees
//
// AMQP 0-9-1 has no delayed negative acknowledgement, so a delayed
// redelivery is done this way: the delivery stays unacknowledged for the
// delay (it counts toward the channel's prefetch, and no other consumer gets
// it), then is rejected with requeue. RabbitMQ's consumer_timeout (30
// minutes by default) must exceed the delays, and the channel must stay open
// meanwhile (if it closes, RabbitMQ requeues the delivery at once, which is
// safe: the redelivery is answered from the record).
//
//   - executed or replayed: Ack.
//   - in progress under another consumer: held for the holder's remaining
//     lease (at least WithRetryDelay), then requeued.
//   - the handler's error meant nothing happened (Do: any non-Reject error,
//     rolled back; Run: ErrNothingHappened), the store is down, or the
//     settlement could not be written (fenced, or the lease ran out with
//     the store down): held WithRetryDelay, then requeued.
//   - uncertain (a handler error, a panic): NOT acked. Held
//     WithUncertainDelay (default 1 minute), then requeued; redelivered so
//     until a claim.Reconciler resolved the record, then acked as a replay.
//   - mismatch, no identity, invalid scope: rejected without requeue, so the
//     queue's dead-letter exchange (x-dead-letter-exchange) gets it, or
//     RabbitMQ drops it when the queue has none; an error log line names the
//     scope hashed (as package claim logs it) and the delivery tag, never
//     the raw message id, tenant or queue. The handler never runs.
//
// # Messages given up
//
// A rejected delivery is dropped when its queue has no dead-letter
// exchange. And a quorum queue has a delivery limit (x-delivery-limit; 20
// by default since RabbitMQ 4.0, none before): a delivery requeued once its
// x-delivery-count reached the limit is dead-lettered, or dropped. A held
// uncertain message, requeued every WithUncertainDelay, is so given up
// after about 20 deliveries on RabbitMQ 4 (the record stays uncertain for
// the Reconciler either way); raise the limit, or give the queue a
// dead-letter exchange, for messages held longer. The Consumer makes both
// visible: the error Do and Run return matches ErrDeadLetter (and
// ErrDeliveryLimit for the second), WithDeadLetter gets the delivery before
// its rejection or its last requeue (to keep it somewhere), and the counter
// oncekey.messages.dead_lettered (WithMeterProvider) counts them by reason.
// The Consumer cannot read a queue's limit: it assumes RabbitMQ 4's default
// (DefaultDeliveryLimit) for deliveries that carry x-delivery-count (quorum
// queues); WithDeliveryLimit sets the queue's own, 0 none.
package claimamqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/metric"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/driver/consume"
	"github.com/oncekey/oncekey/durable"
)

// Action is what a Consumer did with a delivery.
type Action = consume.Action

// The actions.
const (
	// Ack: executed or replayed.
	Ack = consume.Ack
	// Retry: requeued after a delay; nothing ran here, or the settlement
	// could not be written.
	Retry = consume.Retry
	// Hold: uncertain; requeued after the uncertain delay.
	Hold = consume.Hold
	// Terminate: rejected without requeue (dead-lettered) and never run.
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
	// ErrNoIdentity: the delivery has no identity (no message-id, or
	// WithIdentity returned ""); it is dead-lettered.
	ErrNoIdentity = consume.ErrNoIdentity
	// ErrConfig is matched by every configuration error of New.
	ErrConfig = errors.New("claimamqp: invalid configuration")
	// ErrDeadLetter is matched by the error of every delivery the Consumer
	// gives up on: rejected without requeue and never run (its error also
	// matches claim.ErrMismatch, ErrNoIdentity or claim.ErrInvalidScope),
	// or requeued on its last delivery (ErrDeliveryLimit).
	ErrDeadLetter = consume.ErrDeadLetter
	// ErrDeliveryLimit is matched by the error of a delivery requeued
	// (Retry, Hold) that RabbitMQ will not deliver again: its
	// x-delivery-count reached the quorum queue's x-delivery-limit
	// (WithDeliveryLimit), so the requeue dead-letters it, or drops it
	// without a dead-letter exchange. It matches ErrDeadLetter.
	ErrDeliveryLimit = consume.ErrDeliveryLimit
)

// Consumer runs handlers once per message identity. Safe for concurrent use.
type Consumer[TTx any] struct {
	c *consume.Consumer[TTx, *amqp.Delivery]
}

type config struct {
	consume.Config[*amqp.Delivery]
}

// Option configures a Consumer.
type Option func(*config) error

// WithIdentity sets the identity of a delivery. Defaults to its message-id.
// "" means none: the delivery is dead-lettered.
func WithIdentity(f func(*amqp.Delivery) string) Option {
	return func(c *config) error { return c.SetIdentity(f) }
}

// WithOperation sets the operation of a delivery. Defaults to the queue name
// given to New.
func WithOperation(f func(*amqp.Delivery) string) Option {
	return func(c *config) error { return c.SetOperation(f) }
}

// WithTenant sets the tenant of a delivery. Defaults to "default".
// An empty tenant is an invalid scope: the message is terminated.
func WithTenant(f func(*amqp.Delivery) string) Option {
	return func(c *config) error { return c.SetTenant(f) }
}

// WithLogger logs with l. Defaults to discarding logs.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error { return c.SetLogger(l) }
}

// WithRetryDelay sets how long a delivery is held before it is requeued after
// nothing happened, a store outage or a settlement not written, and the least
// hold for in-progress duplicates. Defaults to 1s. Positive.
func WithRetryDelay(d time.Duration) Option {
	return func(c *config) error { return c.SetRetryDelay(d) }
}

// WithUncertainDelay sets how long an uncertain delivery is held before it is
// requeued. Defaults to 1 minute. Positive.
func WithUncertainDelay(d time.Duration) Option {
	return func(c *config) error { return c.SetUncertainDelay(d) }
}

// WithDeadLetter calls f with each delivery the Consumer gives up on, before
// it rejects it without requeue or requeues its last delivery; err matches
// ErrDeadLetter (see ErrDeliveryLimit). f runs on the goroutine that called
// Do or Run, before the acknowledgement: keep it short (keep the message
// somewhere, alert). Without it, a given-up delivery is still reported by
// an Error log line, the error Do and Run return, and the counter
// oncekey.messages.dead_lettered (WithMeterProvider).
func WithDeadLetter(f func(ctx context.Context, d *amqp.Delivery, err error)) Option {
	return func(c *config) error { return c.SetDeadLetter(f) }
}

// WithDeliveryLimit tells the Consumer the quorum queue's x-delivery-limit
// (n > 0): a delivery requeued (Retry, Hold) whose x-delivery-count header
// has reached n is the last, so it is reported as given up
// (ErrDeliveryLimit, WithDeadLetter, the metric). Defaults to 20, the
// default limit of quorum queues since RabbitMQ 4.0; 0 is no limit (a
// queue declared with x-delivery-limit -1, or a quorum queue without one
// before 4.0). Deliveries of classic queues carry no count and are never
// reported so.
func WithDeliveryLimit(n int) Option {
	return func(c *config) error { return c.SetDeliveryLimit(n) }
}

// WithMeterProvider records the Consumer's metric with mp: the counter
// oncekey.messages.dead_lettered of deliveries given up, with the
// attributes adapter ("claimamqp") and reason (mismatch, no_identity,
// invalid_scope, config, delivery_limit, other), never a message id. The
// Claimer's own metrics are configured on the Claimer. Defaults to none.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) error { return c.SetMeterProvider(mp) }
}

// DefaultDeliveryLimit is the delivery limit assumed without
// WithDeliveryLimit: quorum queues' default since RabbitMQ 4.0.
const DefaultDeliveryLimit = 20

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

var errStepOutsideRun = fmt.Errorf("claimamqp: Step outside a Run handler: %w", ErrConfig)

// New returns a Consumer of queue claiming with c.
func New[TTx any](c *claim.Claimer[TTx], queue string, opts ...Option) (*Consumer[TTx], error) {
	if queue == "" && c != nil { // a nil Claimer is reported first, by consume.New
		return nil, fmt.Errorf("%w: empty queue name", ErrConfig)
	}
	cfg := config{consume.NewConfig(
		func(d *amqp.Delivery) string { return d.MessageId },
		func(*amqp.Delivery) string { return queue },
		func(*amqp.Delivery) string { return "default" })}
	cfg.Limit = DefaultDeliveryLimit
	cc, err := consume.New(ErrConfig, c, &cfg, &cfg.Config, opts, broker)
	if err != nil {
		return nil, err
	}
	return &Consumer[TTx]{c: cc}, nil
}

// broker is what is RabbitMQ's in a Consumer.
var broker = consume.Broker[*amqp.Delivery]{
	Name:    "claimamqp",
	Payload: func(d *amqp.Delivery) []byte { return d.Body },
	Where: func(d *amqp.Delivery) []any {
		return []any{"delivery_tag", d.DeliveryTag, "redelivered", d.Redelivered}
	},
	// RabbitMQ dead-letters (or drops) a message returned when its
	// x-delivery-count already reached x-delivery-limit.
	Last:   func(d *amqp.Delivery, limit int) bool { return deliveryCount(d) >= int64(limit) },
	Settle: settle,
}

// Do runs fn once per message identity in the claim's transaction
// (claim.Claimer.Do), then settles d as the package doc says. It returns what
// it did and why (nil for Ack), or the broker's error. A delayed requeue
// happens after Do returned.
func (c *Consumer[TTx]) Do(ctx context.Context, d amqp.Delivery,
	fn func(ctx context.Context, tx TTx, d *amqp.Delivery, op claim.Op) (durable.Result, error)) (Action, error) {
	return c.c.Do(ctx, &d, fn)
}

// Run runs fn once per message identity in workflow mode, then settles d as
// the package doc says, once the outcome is recorded (or the lease ran out
// trying). fn's context ends when the lease is lost (context.Cause:
// claim.ErrFenced or claim.ErrLeaseExpired), not when ctx does. A panic of
// fn is recovered: the operation is recorded uncertain and d held (Hold, an
// error matching ErrPanicked).
func (c *Consumer[TTx]) Run(ctx context.Context, d amqp.Delivery,
	fn func(ctx context.Context, d *amqp.Delivery, op claim.Op) (durable.Result, error)) (Action, error) {
	return c.c.Run(ctx, &d, fn)
}

// deliveryCount returns d's x-delivery-count header (set by quorum queues
// on a redelivery: the deliveries before this one), 0 without one.
func deliveryCount(d *amqp.Delivery) int64 {
	switch v := d.Headers["x-delivery-count"].(type) {
	case int64:
		return v
	case int32:
		return int64(v)
	case int16:
		return int64(v)
	case int8:
		return int64(v)
	case int:
		return int64(v)
	case uint8:
		return int64(v)
	case uint16:
		return int64(v)
	case uint32:
		return int64(v)
	}
	return 0
}

// settle is RabbitMQ's action for dec: a delayed requeue is a rejection
// with requeue once the delivery was held for dec.Delay.
func settle(d *amqp.Delivery, dec consume.Decision, log *slog.Logger) error {
	switch dec.Action {
	case Ack:
		return d.Ack(false)
	case Retry, Hold:
		time.AfterFunc(dec.Delay, func() {
			if err := d.Reject(true); err != nil {
				// The channel closed: RabbitMQ requeued the delivery already.
				log.Warn("claimamqp: delayed requeue failed", "err", err)
			}
		})
	case Terminate:
		return d.Reject(false)
	}
	return nil
}
