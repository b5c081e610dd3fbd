// Package claimkafka runs a Kafka record handler at most once per record
// identity within the retention, with the claim protocol of package claim
// (Redis fast path, durable arbitration, fencing), on the franz-go client
// (kgo).
//
// It is its own module, so users of the library do not get the Kafka
// client.
//
// # What "once" means here
//
// Kafka delivers a record again when a consumer stops before its offset is
// committed, or when a rebalance hands its partition to another member
// mid-work. The Consumer runs the effect once per record identity, not
// once per offset: a redelivery, and a duplicate published with the same
// identity, are answered from the record of the first run (replayed, in
// progress, or taken over after the lease when the first run's consumer
// died). Kafka's own transactions give exactly-once from a topic to a
// topic, inside Kafka only; an effect outside Kafka (a payment, an email, a
// row in PostgreSQL) is what this package is for.
//
// # Identity, operation, tenant, fingerprint
//
// The identity of a record is its Idempotency-Key header (WithHeader names
// another), set by the producer: the same header on a record published
// twice makes the second a replay. A record without that header is
// identified by "topic/partition/offset": stable across redeliveries of
// that record, but a record published again is a new record at another
// offset, so it runs again. WithHeaderRequired refuses records without the
// header instead, and WithIdentity replaces both. An identity that is not
// 1 to 255 bytes of printable ASCII is an invalid scope: the record is
// given up, never run, and nothing is reserved. The operation is the
// record's topic (WithOperation), the tenant "default" (WithTenant). The
// fingerprint is the value: its RFC 8785 form when it is JSON (member order
// and spacing do not matter), its bytes otherwise. So the same identity
// with another value is a mismatch, never run.
//
// # Two modes
//
// Consumer.Do runs the handler with claim.Claimer.Do: the effect is a write
// in the claim's database transaction, committed with the result or not at
// all. Consumer.Run is workflow mode for external effects: claim, then the
// handler under the settlement engine every entry point of oncekey shares
// (the lease renewed while it runs, detached from ctx), then Complete (nil
// error), Fail (an error made by claim.Reject), Release (an error wrapping
// ErrNothingHappened) or MarkUncertain (any other error, or a panic). Once
// the handler started the library never releases the key on its own: only
// complete, fail or mark uncertain. Pass Op.ID downstream as that system's
// idempotency key, so a takeover after a crash is deduplicated there.
//
// # Offsets
//
// The client given to New must be a consumer group client with
// kgo.AutoCommitMarks: the Consumer marks a record for commit only once it
// is settled, so a partition's committed offset never passes a record that
// is not. Settled is: executed or replayed (Ack); given up (Terminate, and
// Hold, see below) once passed on. Anything else (in progress under
// another member, the store down, a settlement not written, a handler
// error that meant nothing happened) is handled again in place, after
// WithRetryDelay (in progress: after the holder's remaining lease), as
// Kafka's redelivery of it: Do and Run return only once the record is
// settled, or when ctx ends first (Retry, not marked).
//
// A partition's records are handled in order, one at a time: call Do or
// Run for them one after the other (Poll does). After a Retry the
// Consumer runs no later record of that partition (ErrOutOfOrder) until
// the unsettled record itself comes again: from the committed offset, to
// this member or, after a rebalance, to another.
//
// # Uncertain records do not block their partition
//
// An uncertain outcome (a handler error in Run, a panic) cannot wait in the
// partition for a Reconciler: every record after it would wait too. It is
// given up at once: reported (the error matches ErrUncertain and
// ErrDeadLetter, the WithDeadLetter callback, the counter
// oncekey.messages.dead_lettered with reason uncertain), copied to the
// WithDeadLetterTopic topic when one is set, then marked, and the
// partition goes on. So the records after it in the partition may run
// before its outcome is known: a consumer that needs a partition's order
// across an uncertain record must hold that order itself (in the
// dead-letter topic's consumer). The record stays uncertain in the store
// for the Reconciler; a redelivery of it is answered uncertain, never run.
//
// # What the broker sees
//
//   - executed or replayed: the record marked for commit (Ack).
//   - in progress under another member (a rebalance moved the partition
//     mid-work), the store down, the settlement not written: handled again
//     in place (Retry); the record decides (replay, in progress, takeover
//     after the lease).
//   - uncertain: passed on and marked (Hold), as above.
//   - mismatch, no identity, invalid scope: never run; passed on (the
//     callback, the dead-letter topic, the counter) and marked
//     (Terminate), with an error log line naming the scope hashed, the
//     topic, partition and offset, never the identity.
//   - WithDeliveryLimit(n): a record still unsettled after n attempts (a
//     Do handler that panics every time) is given up the same way
//     (ErrDeliveryLimit).
//
// If the dead-letter topic cannot be written, the record is not marked: it
// is handled again in place, answered from its record (uncertain, or
// refused), until the copy is written.
package claimkafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/driver/consume"
	"github.com/oncekey/oncekey/durable"
)

// Action is what a Consumer did with a record.
type Action = consume.Action

// The actions.
const (
	// Ack: executed or replayed; marked for commit.
	Ack = consume.Ack
	// Retry: not settled when ctx ended (or refused: ErrOutOfOrder); not
	// marked, so the record comes again from the committed offset.
	Retry = consume.Retry
	// Hold: uncertain; passed on (ErrUncertain) and marked.
	Hold = consume.Hold
	// Terminate: never run (a mismatch, no identity, an invalid scope), or
	// given up unsettled at WithDeliveryLimit; passed on and marked.
	Terminate = consume.Terminate
)

// DefaultHeader is the header a record's identity is read from by default.
const DefaultHeader = "Idempotency-Key"

var (
	// ErrNothingHappened, wrapped by a Run handler's error, states that the
	// handler had no effect: the key is released and the record handled
	// again.
	ErrNothingHappened = consume.ErrNothingHappened
	// ErrPanicked is matched by the error of a Do or Run whose handler
	// panicked: the panic was recovered and logged at Error. Run recorded
	// the operation uncertain (Hold); Do's transaction rolled back, so
	// nothing happened, and the record is handled again.
	ErrPanicked = consume.ErrPanicked
	// ErrNoIdentity: the record has no identity (WithHeaderRequired and no
	// header, an empty header, or WithIdentity returned ""); never run.
	ErrNoIdentity = consume.ErrNoIdentity
	// ErrConfig is matched by every configuration error of New.
	ErrConfig = errors.New("claimkafka: invalid configuration")
	// ErrDeadLetter is matched by the error of every record the Consumer
	// gives up on and moves past: never run (its error also matches
	// claim.ErrMismatch, ErrNoIdentity or claim.ErrInvalidScope), uncertain
	// (ErrUncertain), or unsettled at WithDeliveryLimit (ErrDeliveryLimit).
	ErrDeadLetter = consume.ErrDeadLetter
	// ErrUncertain is matched by the error of a record whose outcome is
	// uncertain: passed on and moved past, left uncertain in the store for
	// the Reconciler. It matches ErrDeadLetter.
	ErrUncertain = consume.ErrHeldGivenUp
	// ErrDeliveryLimit is matched by the error of a record still unsettled
	// after WithDeliveryLimit attempts: given up. It matches ErrDeadLetter.
	ErrDeliveryLimit = consume.ErrDeliveryLimit
	// ErrOutOfOrder is matched by the error of a Do or Run refused, not
	// run, because its partition is not free: a record of the same
	// partition is being handled, or an earlier one returned unsettled
	// (Retry) and has not come again.
	ErrOutOfOrder = errors.New("claimkafka: record out of its partition's order")
)

// Consumer runs handlers once per record identity and marks each record
// for commit once it is settled. Safe for concurrent use by one goroutine
// per partition.
type Consumer[TTx any] struct {
	c     *consume.Consumer[TTx, *delivery]
	cl    *kgo.Client
	dlt   string
	retry time.Duration

	mu    sync.Mutex
	parts map[partition]*partState
}

type partition struct {
	topic string
	part  int32
}

type partState struct {
	busy    bool
	stopped bool  // a record returned unsettled: at
	at      int64 // its offset
}

// delivery is one attempt at a record.
type delivery struct {
	ctx     context.Context
	rec     *kgo.Record
	attempt int
	marked  bool          // settled: marked for commit
	again   time.Duration // not settled: the delay before the next attempt
}

type config struct {
	consume.Config[*delivery]
	header   string
	required bool
	dlt      string
}

// Option configures a Consumer.
type Option func(*config) error

// WithHeader sets the header a record's identity is read from. Defaults to
// DefaultHeader. Not empty.
func WithHeader(name string) Option {
	return func(c *config) error {
		if name == "" {
			return errors.New("claimkafka: WithHeader: empty header name")
		}
		c.header = name
		return nil
	}
}

// WithHeaderRequired refuses a record without the identity header (never
// run, passed on as ErrNoIdentity) instead of identifying it by
// topic/partition/offset.
func WithHeaderRequired() Option {
	return func(c *config) error { c.required = true; return nil }
}

// WithIdentity sets the identity of a record, replacing the header and the
// offset. "" means none: the record is never run (ErrNoIdentity).
func WithIdentity(f func(*kgo.Record) string) Option {
	return func(c *config) error {
		if f == nil {
			return c.SetIdentity(nil)
		}
		return c.SetIdentity(func(d *delivery) string { return f(d.rec) })
	}
}

// WithOperation sets the operation of a record. Defaults to its topic.
func WithOperation(f func(*kgo.Record) string) Option {
	return func(c *config) error {
		if f == nil {
			return c.SetOperation(nil)
		}
		return c.SetOperation(func(d *delivery) string { return f(d.rec) })
	}
}

// WithTenant sets the tenant of a record. Defaults to "default". An empty
// tenant is an invalid scope: the record is never run.
func WithTenant(f func(*kgo.Record) string) Option {
	return func(c *config) error {
		if f == nil {
			return c.SetTenant(nil)
		}
		return c.SetTenant(func(d *delivery) string { return f(d.rec) })
	}
}

// WithLogger logs with l. Defaults to discarding logs.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error { return c.SetLogger(l) }
}

// WithRetryDelay sets the delay before a record not settled is handled
// again (nothing happened, the store is down, a settlement not written),
// and the least delay for one in progress under another member. Defaults
// to 1s. Positive.
func WithRetryDelay(d time.Duration) Option {
	return func(c *config) error { return c.SetRetryDelay(d) }
}

// WithDeadLetter calls f with each record the Consumer gives up on and
// moves past (err matches ErrDeadLetter: ErrUncertain, ErrDeliveryLimit,
// or a cause for never running it), before the dead-letter topic's copy
// and the mark. f runs on the goroutine that called Do or Run: keep it
// short.
func WithDeadLetter(f func(ctx context.Context, rec *kgo.Record, err error)) Option {
	return func(c *config) error {
		if f == nil {
			return c.SetDeadLetter(nil)
		}
		return c.SetDeadLetter(func(ctx context.Context, d *delivery, err error) { f(ctx, d.rec, err) })
	}
}

// WithDeadLetterTopic copies each record the Consumer gives up on to topic,
// with its key, value and headers and the headers oncekey-topic,
// oncekey-partition, oncekey-offset and oncekey-reason (the metric's
// reason), through the Consumer's client, before marking it. Not written,
// the record is not marked: it is handled again until the copy is written.
// Defaults to none.
func WithDeadLetterTopic(topic string) Option {
	return func(c *config) error {
		if topic == "" {
			return errors.New("claimkafka: WithDeadLetterTopic: empty topic")
		}
		c.dlt = topic
		return nil
	}
}

// WithDeliveryLimit gives a record up after n attempts (n > 0) in one call
// of Do or Run that left it unsettled (ErrDeliveryLimit): a Do handler
// that panics, or fails, every time would otherwise hold its partition.
// Every unsettled attempt counts, a store outage's and a wait for another
// member's work too, so keep n well above what those take. 0, the default,
// is no limit: a record is handled again for as long as it is not settled
// (the store down: waiting is right).
func WithDeliveryLimit(n int) Option {
	return func(c *config) error { return c.SetDeliveryLimit(n) }
}

// WithMeterProvider records the Consumer's metric with mp: the counter
// oncekey.messages.dead_lettered of records given up, with the attributes
// adapter ("claimkafka") and reason (mismatch, no_identity, invalid_scope,
// config, delivery_limit, uncertain, other), never a record's identity.
// The Claimer's own metrics are configured on the Claimer. Defaults to
// none.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) error { return c.SetMeterProvider(mp) }
}

// Step runs one step of the workflow of a [Consumer.Run] handler, at most
// once per operation across redeliveries and takeovers (see
// [claim.Lease.Step]): a step an earlier delivery finished returns its
// recorded result without running, so the redelivery after a crash resumes
// where the work stopped. fn gets the step's downstream idempotency key. A
// step that turns the operation uncertain ([claim.ErrStepUncertain]) makes
// the record's outcome uncertain whatever the handler returns. Outside a
// Run handler it returns an error matching [ErrConfig].
func Step(ctx context.Context, name string, fn func(ctx context.Context, key string) ([]byte, error), opts ...claim.StepOption) ([]byte, error) {
	return consume.Step(ctx, errStepOutsideRun, name, fn, opts...)
}

var errStepOutsideRun = fmt.Errorf("claimkafka: Step outside a Run handler: %w", ErrConfig)

// New returns a Consumer claiming with c and marking records for commit on
// cl: a consumer group client (kgo.ConsumerGroup) with kgo.AutoCommitMarks,
// or an error matching ErrConfig.
func New[TTx any](c *claim.Claimer[TTx], cl *kgo.Client, opts ...Option) (*Consumer[TTx], error) {
	if cl == nil {
		return nil, fmt.Errorf("%w: nil Client", ErrConfig)
	}
	if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g == "" {
		return nil, fmt.Errorf("%w: the Client is not in a consumer group (kgo.ConsumerGroup)", ErrConfig)
	}
	if marks, _ := cl.OptValue(kgo.AutoCommitMarks).(bool); !marks {
		return nil, fmt.Errorf("%w: the Client does not commit marked offsets only (kgo.AutoCommitMarks)", ErrConfig)
	}
	cfg := config{header: DefaultHeader}
	cfg.Config = consume.NewConfig(func(d *delivery) string { return cfg.identity(d) }, // after the options: cfg's header
		func(d *delivery) string { return d.rec.Topic },
		func(*delivery) string { return "default" })
	k := &Consumer[TTx]{cl: cl, parts: map[partition]*partState{}}
	cc, err := consume.New(ErrConfig, c, &cfg, &cfg.Config, opts, consume.Broker[*delivery]{
		Name:    "claimkafka",
		Payload: func(d *delivery) []byte { return d.rec.Value },
		// Where a record is, for a log line: never its identity.
		Where: func(d *delivery) []any {
			return []any{"topic", d.rec.Topic, "partition", d.rec.Partition, "offset", d.rec.Offset}
		},
		Last:        func(d *delivery, limit int) bool { return d.attempt >= limit },
		Settle:      k.settle,
		HoldGivesUp: true,
	})
	if err != nil {
		return nil, err
	}
	k.c, k.dlt, k.retry = cc, cfg.dlt, cfg.Delays.Retry
	return k, nil
}

// identity is the default identity: the header, or topic/partition/offset.
func (c *config) identity(d *delivery) string {
	for _, h := range d.rec.Headers {
		if h.Key == c.header {
			return string(h.Value) // empty: no identity, never an offset's
		}
	}
	if c.required {
		return ""
	}
	return d.rec.Topic + "/" + strconv.FormatInt(int64(d.rec.Partition), 10) + "/" + strconv.FormatInt(d.rec.Offset, 10)
}

// Do runs fn once per record identity in the claim's transaction
// (claim.Claimer.Do), then marks rec for commit as the package doc says.
// It returns once rec is settled, with what it did and why (nil for Ack),
// or Retry when ctx ended first (rec not marked).
func (c *Consumer[TTx]) Do(ctx context.Context, rec *kgo.Record,
	fn func(ctx context.Context, tx TTx, rec *kgo.Record, op claim.Op) (durable.Result, error)) (Action, error) {
	return c.handle(ctx, rec, func(d *delivery) (Action, error) {
		return c.c.Do(ctx, d, func(ctx context.Context, tx TTx, d *delivery, op claim.Op) (durable.Result, error) {
			return fn(ctx, tx, d.rec, op)
		})
	})
}

// Run runs fn once per record identity in workflow mode, then marks rec for
// commit as the package doc says, once the outcome is recorded. fn's
// context ends when the lease is lost (context.Cause: claim.ErrFenced or
// claim.ErrLeaseExpired), not when ctx does. A panic of fn is recovered:
// the operation is recorded uncertain and rec passed on (Hold, an error
// matching ErrPanicked and ErrUncertain). It returns once rec is settled,
// or Retry when ctx ended first (rec not marked).
func (c *Consumer[TTx]) Run(ctx context.Context, rec *kgo.Record,
	fn func(ctx context.Context, rec *kgo.Record, op claim.Op) (durable.Result, error)) (Action, error) {
	return c.handle(ctx, rec, func(d *delivery) (Action, error) {
		return c.c.Run(ctx, d, func(ctx context.Context, d *delivery, op claim.Op) (durable.Result, error) {
			return fn(ctx, d.rec, op)
		})
	})
}

// handle runs attempt on rec until rec is settled or ctx ends, holding
// rec's partition meanwhile.
func (c *Consumer[TTx]) handle(ctx context.Context, rec *kgo.Record, attempt func(*delivery) (Action, error)) (Action, error) {
	if rec == nil {
		return Retry, errors.New("claimkafka: nil record")
	}
	p := partition{rec.Topic, rec.Partition}
	if err := c.enter(p, rec.Offset); err != nil {
		return Retry, err
	}
	settled := false
	defer func() { c.leave(p, rec.Offset, settled) }()
	for n := 1; ; n++ {
		d := &delivery{ctx: ctx, rec: rec, attempt: n}
		act, err := attempt(d)
		if d.marked {
			settled = true
			if act == Retry {
				// Given up at WithDeliveryLimit and moved past: Retry is
				// only ever a record not settled.
				act = Terminate
			}
			return act, err
		}
		// Not settled: handled again in place, as Kafka's redelivery of it.
		if d.again <= 0 {
			d.again = c.retry
		}
		t := time.NewTimer(d.again)
		select {
		case <-ctx.Done():
			t.Stop()
			if err == nil {
				err = context.Cause(ctx)
			}
			return Retry, fmt.Errorf("claimkafka: record not settled when ctx ended: %w", err)
		case <-t.C:
		}
	}
}

// enter takes partition p for the record at offset: refused when another
// record of p is being handled, or when p stopped at an earlier unsettled
// record that has not come again.
func (c *Consumer[TTx]) enter(p partition, offset int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.parts[p]
	if s == nil {
		s = &partState{}
		c.parts[p] = s
	}
	switch {
	case s.busy:
		return fmt.Errorf("%w: another record of partition %s/%d is being handled", ErrOutOfOrder, p.topic, p.part)
	case s.stopped && offset > s.at:
		return fmt.Errorf("%w: partition %s/%d stopped at offset %d, not settled", ErrOutOfOrder, p.topic, p.part, s.at)
	}
	s.busy, s.stopped = true, false
	return nil
}

func (c *Consumer[TTx]) leave(p partition, offset int64, settled bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.parts[p]
	s.busy = false
	if !settled {
		s.stopped, s.at = true, offset
		return
	}
	delete(c.parts, p) // nothing to remember: keeps the map to the partitions in flight
}

// settle is Kafka's action for d: mark the record for commit once it is
// settled (after its dead-letter copy when it was given up), or schedule
// the next attempt.
func (c *Consumer[TTx]) settle(d *delivery, dec consume.Decision, _ *slog.Logger) error {
	switch dec.Action {
	case Ack:
	case Retry, Hold:
		if !errors.Is(dec.Err, ErrDeadLetter) {
			// Not settled (a Hold is always given up: HoldGivesUp).
			d.again = dec.Delay
			return nil
		}
		if err := c.deadLetter(d, dec.Err); err != nil {
			return err
		}
	case Terminate:
		if err := c.deadLetter(d, dec.Err); err != nil {
			return err
		}
	}
	c.cl.MarkCommitRecords(d.rec)
	d.marked = true
	return nil
}

// deadLetter copies d's record to the dead-letter topic, if any. Not
// written, the record is handled again after the retry delay.
func (c *Consumer[TTx]) deadLetter(d *delivery, cause error) error {
	if c.dlt == "" {
		return nil
	}
	rec := &kgo.Record{Topic: c.dlt, Key: d.rec.Key, Value: d.rec.Value,
		Headers: append(append([]kgo.RecordHeader(nil), d.rec.Headers...),
			kgo.RecordHeader{Key: "oncekey-topic", Value: []byte(d.rec.Topic)},
			kgo.RecordHeader{Key: "oncekey-partition", Value: strconv.AppendInt(nil, int64(d.rec.Partition), 10)},
			kgo.RecordHeader{Key: "oncekey-offset", Value: strconv.AppendInt(nil, d.rec.Offset, 10)},
			kgo.RecordHeader{Key: "oncekey-reason", Value: []byte(consume.Reason(cause))})}
	if err := c.cl.ProduceSync(d.ctx, rec).FirstErr(); err != nil {
		d.again = c.retry
		return fmt.Errorf("claimkafka: dead-letter topic: %w", err)
	}
	return nil
}

// Poll consumes the Consumer's client until ctx ends or the client is
// closed, handing each record to handle (which calls Do or Run and returns
// what it returned): the records of a partition one after the other, in
// order, the partitions of a batch side by side, each on a goroutine of
// its own; it polls again once the batch is done (then
// kgo.Client.AllowRebalance). A record left unsettled (Retry: ctx ended)
// stops its partition for the batch and rewinds the client to it, so it
// comes again. A partition whose record waits (in progress under another
// member, the store down) holds the next poll, so the member's other
// partitions wait too. It returns nil once the client is closed, or ctx's
// error.
//
// With kgo.BlockRebalanceOnPoll on the client, a rebalance waits for the
// batch: no record of a revoked partition is in flight, but a batch that
// takes longer than the group's rebalance timeout puts the member out of
// the group (keep kgo.MaxPollRecords small enough). Without it, a
// partition may be revoked mid-work: the client drops the marks of a
// partition it no longer owns, and the new owner's delivery of an
// unsettled record is answered by the record (in progress until the work
// here settles, then a replay; a takeover after the lease if it never
// does).
func (c *Consumer[TTx]) Poll(ctx context.Context, handle func(ctx context.Context, rec *kgo.Record) (Action, error)) error {
	if handle == nil {
		return errors.New("claimkafka: nil handler")
	}
	// A poll blocks rebalances (kgo.BlockRebalanceOnPoll) until allowed,
	// the last one too: without this, the client's Close would wait for
	// ever to leave the group.
	defer c.cl.AllowRebalance()
	for {
		fs := c.cl.PollFetches(ctx)
		if fs.IsClientClosed() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		var wg sync.WaitGroup
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			wg.Go(func() {
				for _, rec := range p.Records {
					_, _ = handle(ctx, rec) // the answer is handle's to report
					if c.rewind(partition{rec.Topic, rec.Partition}) {
						return
					}
				}
			})
		})
		wg.Wait()
		c.cl.AllowRebalance()
	}
}

// rewind sets the client's fetch position of p back to the record p
// stopped at, if it did, and reports whether it did.
func (c *Consumer[TTx]) rewind(p partition) bool {
	c.mu.Lock()
	s := c.parts[p]
	stopped := s != nil && s.stopped && !s.busy
	var at int64
	if stopped {
		at = s.at
	}
	c.mu.Unlock()
	if stopped {
		c.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{p.topic: {p.part: {Epoch: -1, Offset: at}}})
	}
	return stopped
}
