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
// effects: claim, keep the lease alive while the handler runs, then Complete
// (nil error), Fail (an error made by claim.Reject), Release (an error
// wrapping ErrNothingHappened: the application says nothing happened) or
// MarkUncertain (any other error). Once the handler started the library never
// releases the key on its own. Pass Op.ID downstream as that system's
// idempotency key.
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
//     settlement could not be written (fenced, or the store is down): held
//     WithRetryDelay, then requeued.
//   - uncertain: NOT acked. Held WithUncertainDelay (default 1 minute), then
//     requeued; redelivered so until a claim.Reconciler resolved the record,
//     then acked as a replay.
//   - mismatch, no identity, invalid scope: rejected without requeue, so the
//     queue's dead-letter exchange (x-dead-letter-exchange) gets it, or
//     RabbitMQ drops it when the queue has none; an error log line names the
//     scope hashed (as package claim logs it) and the delivery tag, never
//     the raw message id, tenant or queue. The handler never runs.
package claimamqp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/internal/consume"
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
	// ErrPanicked is matched by the error of a Run whose handler panicked:
	// the panic was recovered and logged at Error, the operation recorded
	// as uncertain, and the message held (Hold).
	ErrPanicked = consume.ErrPanicked
	// ErrNoIdentity: the delivery has no identity (no message-id, or
	// WithIdentity returned ""); it is dead-lettered.
	ErrNoIdentity = consume.ErrNoIdentity
	// ErrConfig is matched by every configuration error of New.
	ErrConfig = errors.New("claimamqp: invalid configuration")
)

// Consumer runs handlers once per message identity. Safe for concurrent use.
type Consumer[TTx any] struct {
	c   *claim.Claimer[TTx]
	cfg config
}

type config struct {
	identity  func(*amqp.Delivery) string
	operation func(*amqp.Delivery) string
	tenant    func(*amqp.Delivery) string
	log       *slog.Logger
	delays    consume.Delays
}

// Option configures a Consumer.
type Option func(*config) error

// WithIdentity sets the identity of a delivery. Defaults to its message-id.
// "" means none: the delivery is dead-lettered.
func WithIdentity(f func(*amqp.Delivery) string) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: WithIdentity: nil function", ErrConfig)
		}
		c.identity = f
		return nil
	}
}

// WithOperation sets the operation of a delivery. Defaults to the queue name
// given to New.
func WithOperation(f func(*amqp.Delivery) string) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: WithOperation: nil function", ErrConfig)
		}
		c.operation = f
		return nil
	}
}

// WithTenant sets the tenant of a delivery. Defaults to "default".
// An empty tenant is an invalid scope: the message is terminated.
func WithTenant(f func(*amqp.Delivery) string) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: WithTenant: nil function", ErrConfig)
		}
		c.tenant = f
		return nil
	}
}

// WithLogger logs with l. Defaults to discarding logs.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: WithLogger: nil logger", ErrConfig)
		}
		c.log = l
		return nil
	}
}

// WithRetryDelay sets how long a delivery is held before it is requeued after
// nothing happened, a store outage or a settlement not written, and the least
// hold for in-progress duplicates. Defaults to 1s. Positive.
func WithRetryDelay(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: WithRetryDelay: %v is not positive", ErrConfig, d)
		}
		c.delays.Retry = d
		return nil
	}
}

// WithUncertainDelay sets how long an uncertain delivery is held before it is
// requeued. Defaults to 1 minute. Positive.
func WithUncertainDelay(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: WithUncertainDelay: %v is not positive", ErrConfig, d)
		}
		c.delays.Uncertain = d
		return nil
	}
}

// New returns a Consumer of queue claiming with c.
func New[TTx any](c *claim.Claimer[TTx], queue string, opts ...Option) (*Consumer[TTx], error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil Claimer", ErrConfig)
	}
	if queue == "" {
		return nil, fmt.Errorf("%w: empty queue name", ErrConfig)
	}
	cfg := config{
		identity:  func(d *amqp.Delivery) string { return d.MessageId },
		operation: func(*amqp.Delivery) string { return queue },
		tenant:    func(*amqp.Delivery) string { return "default" },
		log:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		delays:    consume.DefaultDelays,
	}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil Option", ErrConfig)
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	return &Consumer[TTx]{c: c, cfg: cfg}, nil
}

func (c *Consumer[TTx]) message(d *amqp.Delivery) consume.Message {
	return consume.Message{ID: c.cfg.identity(d), Tenant: c.cfg.tenant(d), Operation: c.cfg.operation(d), Payload: d.Body,
		Where: []any{"delivery_tag", d.DeliveryTag, "redelivered", d.Redelivered}}
}

// Do runs fn once per message identity in the claim's transaction
// (claim.Claimer.Do), then settles d as the package doc says. It returns what
// it did and why (nil for Ack), or the broker's error. A delayed requeue
// happens after Do returned.
func (c *Consumer[TTx]) Do(ctx context.Context, d amqp.Delivery,
	fn func(ctx context.Context, tx TTx, d *amqp.Delivery, op claim.Op) (durable.Result, error)) (Action, error) {
	dec := consume.Do(ctx, c.c, c.message(&d), c.cfg.delays, c.cfg.log, func(ctx context.Context, tx TTx, op claim.Op) (durable.Result, error) {
		return fn(ctx, tx, &d, op)
	})
	return c.settle(d, dec)
}

// Run runs fn once per message identity in workflow mode, then settles d as
// the package doc says. fn's context ends when the lease is lost
// (context.Cause: claim.ErrFenced or claim.ErrLeaseExpired), not when ctx
// does.
func (c *Consumer[TTx]) Run(ctx context.Context, d amqp.Delivery,
	fn func(ctx context.Context, d *amqp.Delivery, op claim.Op) (durable.Result, error)) (Action, error) {
	dec := consume.Run(ctx, c.c, c.message(&d), c.cfg.delays, c.cfg.log, func(ctx context.Context, op claim.Op) (durable.Result, error) {
		return fn(ctx, &d, op)
	})
	return c.settle(d, dec)
}

func (c *Consumer[TTx]) settle(d amqp.Delivery, dec consume.Decision) (Action, error) {
	var err error
	switch dec.Action {
	case Ack:
		err = d.Ack(false)
	case Retry, Hold:
		time.AfterFunc(dec.Delay, func() {
			if err := d.Reject(true); err != nil {
				// The channel closed: RabbitMQ requeued the delivery already.
				c.cfg.log.Warn("claimamqp: delayed requeue failed", "error", err)
			}
		})
	case Terminate:
		err = d.Reject(false)
	}
	if err != nil {
		return dec.Action, fmt.Errorf("claimamqp: %v: %w", dec.Action, err)
	}
	return dec.Action, dec.Err
}
