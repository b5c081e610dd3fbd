package consume

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

// Broker is what an adapter tells a Consumer of its broker and of the
// broker's message type M: all that differs between claimnats and
// claimamqp.
type Broker[M any] struct {
	// Name is the adapter's ("claimnats"): the adapter attribute of the
	// metric, and the prefix of the broker's errors.
	Name string
	// Payload is the message's payload: its fingerprint.
	Payload func(M) []byte
	// Where names the delivery for a log line (stream sequence, delivery
	// tag), as slog attributes whose keys are in the library's vocabulary
	// (internal/logkeys); never the identity. It may return nil.
	Where func(M) []any
	// Last reports whether the broker will not deliver m again once it is
	// requeued (Retry, Hold): its delivery count reached limit (> 0).
	Last func(m M, limit int) bool
	// Running, when set, is called as Run starts on m; its stop is called
	// once the outcome is decided, before m is settled (NATS: the
	// in-progress signals that keep AckWait from redelivering m).
	Running func(m M) (stop func())
	// Settle does the broker's action for d: acknowledge, requeue after
	// d.Delay, or terminate. log is the Consumer's.
	Settle func(m M, d Decision, log *slog.Logger) error
	// HoldGivesUp, set for a broker that cannot hold a message without
	// holding every later one (a Kafka partition is a log, committed in
	// order): a Hold is given up at once. Its error matches
	// ErrHeldGivenUp (and ErrDeadLetter), it is counted with reason
	// uncertain, logged at Error and handed to DeadLetter; Settle then
	// passes it on (a dead-letter topic) and moves past it. The record
	// stays uncertain for the Reconciler.
	HoldGivesUp bool
}

// Consumer is the broker-independent part of an adapter's Consumer: the
// claim and the handler (Do, Run), the report of a message given up
// (Drops, the DeadLetter callback), then the broker's action (Broker).
// Safe for concurrent use.
type Consumer[TTx, M any] struct {
	c      *claim.Claimer[TTx]
	cfg    Config[M]
	broker Broker[M]
	drops  *Drops
}

// configure applies the adapter's options to cfg (its config, which
// embeds a Config), wrapping a nil option and each option's error in
// errConfig, the adapter's ErrConfig.
func configure[C any, O ~func(*C) error](errConfig error, cfg *C, opts []O) error {
	for _, o := range opts {
		if o == nil {
			return fmt.Errorf("%w: nil Option", errConfig)
		}
		if err := o(cfg); err != nil {
			return fmt.Errorf("%w: %w", errConfig, err)
		}
	}
	return nil
}

// New is the shared part of an adapter's New: it checks c, applies opts to cfg (the adapter's config, its defaults set; base is
// the Config it embeds) as configure does, and returns the Consumer
// claiming with c for broker b. Every error but the metrics' matches
// errConfig, the adapter's ErrConfig.
func New[TTx, M, C any, O ~func(*C) error](errConfig error, c *claim.Claimer[TTx], cfg *C, base *Config[M], opts []O, b Broker[M]) (*Consumer[TTx, M], error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil Claimer", errConfig)
	}
	if err := configure(errConfig, cfg, opts); err != nil {
		return nil, err
	}
	return newConsumer(c, *base, b)
}

// newConsumer returns the Consumer claiming with c (not nil), configured
// with cfg (its options applied) for broker b.
func newConsumer[TTx, M any](c *claim.Claimer[TTx], cfg Config[M], b Broker[M]) (*Consumer[TTx, M], error) {
	drops, err := NewDrops(b.Name, cfg.Meter, cfg.Limit)
	if err != nil {
		return nil, fmt.Errorf("%s: metrics: %w", b.Name, err)
	}
	return &Consumer[TTx, M]{c: c, cfg: cfg, broker: b, drops: drops}, nil
}

func (c *Consumer[TTx, M]) message(m M) Message {
	return Message{ID: c.cfg.Identity(m), Tenant: c.cfg.Tenant(m), Operation: c.cfg.Operation(m),
		Payload: c.broker.Payload(m), Where: c.broker.Where(m)}
}

// Do runs fn once per message identity in the claim's transaction (the
// function Do), then settles m. It returns what it did and why (nil for
// Ack), or the broker's error.
func (c *Consumer[TTx, M]) Do(ctx context.Context, m M,
	fn func(ctx context.Context, tx TTx, m M, op claim.Op) (durable.Result, error)) (Action, error) {
	msg := c.message(m)
	d := Do(ctx, c.c, msg, c.cfg.Delays, c.cfg.Log, func(ctx context.Context, tx TTx, op claim.Op) (durable.Result, error) {
		return fn(ctx, tx, m, op)
	})
	return c.settle(ctx, m, msg, d)
}

// Run runs fn once per message identity in workflow mode (the function
// Run), with Broker.Running around it, then settles m once the outcome is
// recorded (or the lease ran out trying).
func (c *Consumer[TTx, M]) Run(ctx context.Context, m M,
	fn func(ctx context.Context, m M, op claim.Op) (durable.Result, error)) (Action, error) {
	msg := c.message(m)
	stop := func() {}
	if c.broker.Running != nil {
		// Once: stopped before m is settled, and by the defer if fn
		// called runtime.Goexit (Run recovers panics), so Running's
		// goroutine never outlives this one.
		stop = sync.OnceFunc(c.broker.Running(m))
	}
	defer stop()
	d := Run(ctx, c.c, msg, c.cfg.Delays, c.cfg.Log, func(ctx context.Context, op claim.Op) (durable.Result, error) {
		return fn(ctx, m, op)
	})
	stop()
	return c.settle(ctx, m, msg, d)
}

// settle reports d when m is given up (the error, the metric, the
// DeadLetter callback before the broker acts), then does the broker's
// action.
func (c *Consumer[TTx, M]) settle(ctx context.Context, m M, msg Message, d Decision) (Action, error) {
	last := c.drops.Limit() > 0 && c.broker.Last(m, c.drops.Limit())
	if c.broker.HoldGivesUp && d.Action == Hold {
		d = c.drops.GiveUpHeld(ctx, c.cfg.Log, msg.Where, d)
		last = false // given up already: not at the limit too
	}
	d, dead := c.drops.Check(ctx, c.cfg.Log, msg.Where, d, last)
	if dead && c.cfg.DeadLetter != nil {
		c.cfg.DeadLetter(ctx, m, d.Err)
	}
	if err := c.broker.Settle(m, d, c.cfg.Log); err != nil {
		return d.Action, fmt.Errorf("%s: %v: %w", c.broker.Name, d.Action, err)
	}
	return d.Action, d.Err
}
