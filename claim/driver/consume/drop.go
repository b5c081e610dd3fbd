package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/internal/logkeys"
)

// ErrDeadLetter is matched by the error of every delivery a consumer gives
// up on, so the broker will not deliver it again: terminated without
// running (a mismatch, no identity, an invalid scope: the queue's
// dead-letter target gets it, or it is dropped when there is none), or
// requeued on its last delivery ([ErrDeliveryLimit]).
var ErrDeadLetter = errors.New("consume: message given up (dead-lettered, or dropped without a dead-letter target)")

// ErrDeliveryLimit is matched by the error of a delivery requeued (Retry or
// Hold) that the broker will not deliver again: it reached the broker's
// delivery limit (NATS MaxDeliver, a RabbitMQ quorum queue's
// x-delivery-limit), so the requeue drops it or dead-letters it. It matches
// [ErrDeadLetter] too. The record is not changed by it: a held (uncertain)
// operation stays for the Reconciler.
var ErrDeliveryLimit = fmt.Errorf("%w: the broker's delivery limit is reached", ErrDeadLetter)

// ErrHeldGivenUp is matched by the error of a held (uncertain) delivery
// that a broker which cannot hold it (Broker.HoldGivesUp: Kafka) gives up
// at once, so the messages after it are not blocked. It matches
// [ErrDeadLetter] too. The record is not changed by it: the operation stays
// uncertain for the Reconciler.
var ErrHeldGivenUp = fmt.Errorf("%w: outcome uncertain, passed on so the messages after it are not blocked", ErrDeadLetter)

// MetricDeadLettered is the counter of messages given up, by adapter and
// reason (mismatch, no_identity, invalid_scope, config, delivery_limit,
// uncertain, other). No attribute names a message, its id, tenant or operation.
const MetricDeadLettered = "oncekey.messages.dead_lettered"

// Drops reports the messages an adapter gives up on.
type Drops struct {
	adapter attribute.KeyValue
	limit   int
	counter metric.Int64Counter
}

// NewDrops returns the reporting of adapter ("claimnats") with mp (nil: no
// metric) and the broker's delivery limit (0: none; see AtLimit).
func NewDrops(adapter string, mp metric.MeterProvider, limit int) (*Drops, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	ctr, err := mp.Meter("github.com/oncekey/oncekey/claim/"+adapter).Int64Counter(MetricDeadLettered,
		metric.WithDescription("Messages a consumer gave up on: terminated without running, or requeued at the broker's delivery limit, by reason."))
	if err != nil {
		return nil, err
	}
	return &Drops{adapter: attribute.String("adapter", adapter), limit: limit, counter: ctr}, nil
}

// Limit returns the broker's delivery limit the adapter was configured with
// (0: none).
func (x *Drops) Limit() int { return x.limit }

// Check returns d, its error wrapped in ErrDeliveryLimit when d requeues
// the message (Retry, Hold) and last says the broker will not deliver it
// again; and whether the message is given up (its error matches
// ErrDeadLetter), which it counts.
//
// A delivery at the limit is logged at Error with where (never the message
// id); a termination was logged when it was decided.
func (x *Drops) Check(ctx context.Context, log *slog.Logger, where []any, d Decision, last bool) (Decision, bool) {
	if last && (d.Action == Retry || d.Action == Hold) {
		log.ErrorContext(ctx, "oncekey: message at the broker's delivery limit; its requeue drops it or dead-letters it",
			append([]any{logkeys.Action, d.Action.String(), logkeys.Err, d.Err}, where...)...)
		if d.Err != nil {
			d.Err = fmt.Errorf("%w: %v (%w)", ErrDeliveryLimit, d.Action, d.Err)
		} else {
			d.Err = fmt.Errorf("%w: %v", ErrDeliveryLimit, d.Action)
		}
	}
	if !errors.Is(d.Err, ErrDeadLetter) {
		return d, false
	}
	x.counter.Add(ctx, 1, metric.WithAttributes(x.adapter, attribute.String("reason", Reason(d.Err))))
	return d, true
}

// GiveUpHeld returns the Hold d given up (Broker.HoldGivesUp): its error
// wrapped in ErrHeldGivenUp, which Check then counts. It logs it at Error
// with where (never the message id).
func (x *Drops) GiveUpHeld(ctx context.Context, log *slog.Logger, where []any, d Decision) Decision {
	log.ErrorContext(ctx, "oncekey: message outcome uncertain; passed on to the dead letter, the messages after it go on",
		append([]any{logkeys.Action, d.Action.String(), logkeys.Err, d.Err}, where...)...)
	if d.Err != nil {
		d.Err = fmt.Errorf("%w (%w)", ErrHeldGivenUp, d.Err)
	} else {
		d.Err = ErrHeldGivenUp
	}
	return d
}

// Reason is the metric's reason for a message given up with err
// (mismatch, no_identity, invalid_scope, config, delivery_limit,
// uncertain, other), for an adapter that passes the message on with it.
func Reason(err error) string {
	switch {
	case errors.Is(err, ErrDeliveryLimit):
		return "delivery_limit"
	case errors.Is(err, ErrHeldGivenUp):
		return "uncertain"
	case errors.Is(err, claim.ErrMismatch):
		return "mismatch"
	case errors.Is(err, ErrNoIdentity):
		return "no_identity"
	case errors.Is(err, claim.ErrInvalidScope):
		return "invalid_scope"
	case errors.Is(err, claim.ErrConfig):
		return "config"
	}
	return "other"
}
