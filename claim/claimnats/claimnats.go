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
// Consumer.Run is workflow mode for external effects: claim, keep the lease
// alive while the handler runs, then Complete (nil error), Fail (an error made
// by claim.Reject), Release (an error wrapping ErrNothingHappened: the
// application says nothing happened) or MarkUncertain (any other error). Once
// the handler started the library never releases the key on its own: only
// complete, fail or mark uncertain. Pass Op.ID downstream as that system's
// idempotency key, so a takeover after a crash is deduplicated there.
//
// # What the broker sees
//
//   - executed or replayed: Ack.
//   - in progress under another consumer: NakWithDelay of the holder's
//     remaining lease (at least WithRetryDelay); the redelivery replays or
//     takes over an abandoned lease.
//   - the handler's error meant nothing happened (Do: any non-Reject error,
//     rolled back; Run: ErrNothingHappened), the store is down, or the
//     settlement could not be written (fenced by a takeover, or the store
//     is down): NakWithDelay(WithRetryDelay). The redelivery is answered from
//     the record.
//   - uncertain: NOT acked. NakWithDelay(WithUncertainDelay, default 1
//     minute): the message stays in the stream and is redelivered until a
//     claim.Reconciler resolved the record, then acked as a replay. With
//     MaxDeliver set on the consumer, JetStream gives up after that many
//     deliveries (a max-deliveries advisory); the record stays uncertain
//     for the Reconciler either way.
//   - mismatch, no identity, invalid scope: Term (never redelivered; a
//     terminated-message advisory), and an error log line naming the
//     scope hashed (as package claim logs it), the stream and its
//     sequence, never the raw message id, tenant or subject. The handler
//     never runs.
package claimnats

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/internal/consume"
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
	// ErrPanicked is matched by the error of a Run whose handler panicked:
	// the panic was recovered and logged at Error, the operation recorded
	// as uncertain, and the message held (Hold).
	ErrPanicked = consume.ErrPanicked
	// ErrNoIdentity: the message has no identity (no Nats-Msg-Id header, or
	// WithIdentity returned ""); it is terminated.
	ErrNoIdentity = consume.ErrNoIdentity
	// ErrConfig is matched by every configuration error of New.
	ErrConfig = errors.New("claimnats: invalid configuration")
)

// Consumer runs handlers once per message identity. Safe for concurrent use.
type Consumer[TTx any] struct {
	c   *claim.Claimer[TTx]
	cfg config
}

type config struct {
	identity  func(jetstream.Msg) string
	operation func(jetstream.Msg) string
	tenant    func(jetstream.Msg) string
	log       *slog.Logger
	delays    consume.Delays
}

// Option configures a Consumer.
type Option func(*config) error

// WithIdentity sets the identity of a message. Defaults to its Nats-Msg-Id
// header. "" means none: the message is terminated.
func WithIdentity(f func(jetstream.Msg) string) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: WithIdentity: nil function", ErrConfig)
		}
		c.identity = f
		return nil
	}
}

// WithOperation sets the operation of a message. Defaults to its subject.
func WithOperation(f func(jetstream.Msg) string) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: WithOperation: nil function", ErrConfig)
		}
		c.operation = f
		return nil
	}
}

// WithTenant sets the tenant of a message. Defaults to "default".
// An empty tenant is an invalid scope: the message is terminated.
func WithTenant(f func(jetstream.Msg) string) Option {
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

// WithRetryDelay sets the redelivery delay after nothing happened, a store
// outage or a settlement not written, and the least delay for in-progress
// duplicates. Defaults to 1s. Positive.
func WithRetryDelay(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: WithRetryDelay: %v is not positive", ErrConfig, d)
		}
		c.delays.Retry = d
		return nil
	}
}

// WithUncertainDelay sets the redelivery delay of an uncertain message.
// Defaults to 1 minute. Positive.
func WithUncertainDelay(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: WithUncertainDelay: %v is not positive", ErrConfig, d)
		}
		c.delays.Uncertain = d
		return nil
	}
}

// New returns a Consumer claiming with c.
func New[TTx any](c *claim.Claimer[TTx], opts ...Option) (*Consumer[TTx], error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil Claimer", ErrConfig)
	}
	cfg := config{
		identity:  func(m jetstream.Msg) string { return m.Headers().Get(nats.MsgIdHdr) },
		operation: jetstream.Msg.Subject,
		tenant:    func(jetstream.Msg) string { return "default" },
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

func (c *Consumer[TTx]) message(m jetstream.Msg) consume.Message {
	cm := consume.Message{ID: c.cfg.identity(m), Tenant: c.cfg.tenant(m), Operation: c.cfg.operation(m), Payload: m.Data()}
	if md, err := m.Metadata(); err == nil {
		cm.Where = []any{"stream", md.Stream, "stream_seq", md.Sequence.Stream, "consumer", md.Consumer}
	}
	return cm
}

// Do runs fn once per message identity in the claim's transaction
// (claim.Claimer.Do), then acknowledges msg as the package doc says. It
// returns what it did and why (nil for Ack), or the broker's error.
func (c *Consumer[TTx]) Do(ctx context.Context, msg jetstream.Msg,
	fn func(ctx context.Context, tx TTx, msg jetstream.Msg, op claim.Op) (durable.Result, error)) (Action, error) {
	d := consume.Do(ctx, c.c, c.message(msg), c.cfg.delays, c.cfg.log, func(ctx context.Context, tx TTx, op claim.Op) (durable.Result, error) {
		return fn(ctx, tx, msg, op)
	})
	return settle(msg, d)
}

// Run runs fn once per message identity in workflow mode, then acknowledges
// msg as the package doc says. fn's context ends when the lease is lost
// (context.Cause: claim.ErrFenced or claim.ErrLeaseExpired), not when ctx
// does. A redelivery while fn runs (the consumer's AckWait passed) is
// answered in progress.
func (c *Consumer[TTx]) Run(ctx context.Context, msg jetstream.Msg,
	fn func(ctx context.Context, msg jetstream.Msg, op claim.Op) (durable.Result, error)) (Action, error) {
	d := consume.Run(ctx, c.c, c.message(msg), c.cfg.delays, c.cfg.log, func(ctx context.Context, op claim.Op) (durable.Result, error) {
		return fn(ctx, msg, op)
	})
	return settle(msg, d)
}

func settle(msg jetstream.Msg, d consume.Decision) (Action, error) {
	var err error
	switch d.Action {
	case Ack:
		err = msg.Ack()
	case Retry, Hold:
		err = msg.NakWithDelay(d.Delay)
	case Terminate:
		// Term, not TermWithReason: servers before 2.10.4 ignore the latter
		// and would redeliver. The reason is in the log line.
		err = msg.Term()
	}
	if err != nil {
		return d.Action, fmt.Errorf("claimnats: %v: %w", d.Action, err)
	}
	return d.Action, d.Err
}
