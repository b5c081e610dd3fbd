package claim

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
)

// Span names, attribute keys and the baggage member; the package
// documentation lists them (# Traces) for users. No attribute holds a raw
// key, a tenant or a body: an operation is named by its identity (a hash).
const (
	tracerName = "github.com/oncekey/oncekey/claim"

	spanClaim        = "oncekey.claim"
	spanFinish       = "oncekey.finish"
	spanRedisClaim   = "oncekey.redis.claim"
	spanDurableClaim = "oncekey.durable.claim"
	spanDurableTx    = "oncekey.durable.transaction"
	spanDurableWrite = "oncekey.durable.finish"
	spanReconcile    = "oncekey.reconcile"
	spanDurableAdopt = "oncekey.durable.adopt"

	eventRedisSync    = "oncekey.redis.syncgen"
	eventRedisRelease = "oncekey.redis.release"
	eventRedisCache   = "oncekey.redis.cache"

	attrOperationID  = attribute.Key("oncekey.operation_id")
	attrOperation    = attribute.Key("oncekey.operation")
	attrMode         = attribute.Key("oncekey.mode")
	attrOutcome      = attribute.Key("oncekey.outcome")
	attrRedis        = attribute.Key("oncekey.redis.answered")
	attrRedisResult  = attribute.Key("oncekey.redis.result")
	attrDurable      = attribute.Key("oncekey.durable.result")
	attrPeek         = attribute.Key("oncekey.durable.read")
	attrGeneration   = attribute.Key("oncekey.generation")
	attrTakeover     = attribute.Key("oncekey.takeover")
	attrReplay       = attribute.Key("oncekey.replay")
	attrReplaySource = attribute.Key("oncekey.replay.source")
	attrState        = attribute.Key("oncekey.state")
	attrFenced       = attribute.Key("oncekey.fenced")
	attrOK           = attribute.Key("oncekey.ok")
	attrResult       = attribute.Key("oncekey.reconcile.result")

	// baggageOperationID names the baggage member that carries the
	// operation identity in the work's context.
	baggageOperationID = "oncekey.operation_id"
)

// WithTracerProvider records a span for every claim ([Claimer.Claim],
// [Claimer.Do]), every finishing write of a [Lease] and every record a
// [Reconciler] handles, with child spans for the Redis and database steps,
// through tp, and puts the operation identity in the baggage of the work's
// context ([Lease.KeepAlive], the functions [Claimer.Do] and the
// Reconciler run). Span names and attributes: package
// documentation, # Traces. Defaults to no traces.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(cfg *config) error {
		if tp == nil {
			return configErr("WithTracerProvider: nil TracerProvider")
		}
		cfg.tracer = tp
		return nil
	}
}

// tracer is a Claimer's tracing. Without WithTracerProvider it is off: it
// starts no span and touches no span it finds in a context (which would be
// the caller's own), and costs no allocation.
type tracer struct {
	tr trace.Tracer // nil when off
}

var offSpan trace.Span = noop.Span{}

func newTracer(tp trace.TracerProvider) tracer {
	if tp == nil {
		return tracer{}
	}
	return tracer{tr: tp.Tracer(tracerName)}
}

func (t tracer) on() bool { return t.tr != nil }

// start starts a span, or returns ctx and a span that records nothing.
func (t tracer) start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if t.tr == nil {
		return ctx, offSpan
	}
	return t.tr.Start(ctx, name, opts...)
}

// note sets attributes on the claim span in ctx.
func (t tracer) note(ctx context.Context, kv ...attribute.KeyValue) {
	if t.tr == nil {
		return
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(kv...)
	}
}

// event adds a Redis follow-up step to the span in ctx.
func (t tracer) event(ctx context.Context, name string, err error) {
	if t.tr == nil {
		return
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(name, trace.WithAttributes(attrOK.Bool(err == nil)))
	}
}

// step runs one Redis or database step as a child span.
func (t tracer) step(ctx context.Context, name string, f func(context.Context) error) error {
	if t.tr == nil {
		return f(ctx)
	}
	ctx, span := t.tr.Start(ctx, name)
	err := f(ctx)
	if err != nil {
		span.SetStatus(codes.Error, errWord(err))
	}
	span.End()
	return err
}

// startClaim starts the span of a claim of mode "claim" or "do".
func (c *Claimer[TTx]) startClaim(ctx context.Context, mode string, r Request) (context.Context, trace.Span) {
	if !c.tracing.on() {
		return ctx, offSpan
	}
	return c.tracing.start(ctx, spanClaim, trace.WithAttributes(attrMode.String(mode), attrOperation.String(r.Scope.Operation)))
}

// endClaim records a claim's outcome on its span and ends it. An error's
// status names the outcome only: error messages are not recorded.
func endClaim(span trace.Span, out Outcome, err error) {
	if span.IsRecording() {
		outcome := outcomeAttr(out.Kind, err)
		span.SetAttributes(attrOutcome.String(outcome))
		if out.OperationID != "" {
			span.SetAttributes(attrOperationID.String(out.OperationID))
		}
		replay := out.Kind == Replayed
		span.SetAttributes(attrReplay.Bool(replay))
		if replay {
			src := "durable"
			switch {
			case out.local:
				src = "process"
			case out.FromCache:
				src = "redis"
			}
			span.SetAttributes(attrReplaySource.String(src), attrState.String(string(out.State)))
		}
		if err != nil {
			span.SetStatus(codes.Error, outcome)
		}
	}
	span.End()
}

// errWord names an error of the store by its kind, never by its message.
func errWord(err error) string {
	switch {
	case errors.Is(err, durable.ErrFenced):
		return "fenced"
	case errors.Is(err, durable.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, durable.ErrMismatch):
		return "mismatch"
	case errors.Is(err, durable.ErrInvalidScope):
		return "invalid"
	case errors.Is(err, ErrLeaseExpired):
		return "lease_expired"
	}
	return "error"
}

// withOperationBaggage returns ctx with the operation identity as the
// baggage member oncekey.operation_id, when traces are on, so that a
// downstream call made with it (and a propagator that sends baggage) can
// be joined to its claim.
func (c *Claimer[TTx]) withOperationBaggage(ctx context.Context, opID string) context.Context {
	if !c.tracing.on() {
		return ctx
	}
	return operationBaggage(ctx, opID)
}

func operationBaggage(ctx context.Context, opID string) context.Context {
	m, err := baggage.NewMemberRaw(baggageOperationID, opID)
	if err != nil {
		return ctx
	}
	b, err := baggage.FromContext(ctx).SetMember(m)
	if err != nil {
		return ctx
	}
	return baggage.ContextWithBaggage(ctx, b)
}

// startFinish starts the span of a Lease's finishing write, linked to the
// span of the claim that acquired the lease.
func startFinish(ctx context.Context, tr tracer, claimSpan trace.SpanContext, opID string, tok fence.Token, state string) (context.Context, trace.Span) {
	if !tr.on() {
		return ctx, offSpan
	}
	opts := []trace.SpanStartOption{trace.WithAttributes(
		attrOperationID.String(opID),
		attrGeneration.Int64(int64(tok.Generation)),
		attrState.String(state),
	)}
	if claimSpan.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: claimSpan}))
	}
	return tr.start(ctx, spanFinish, opts...)
}

// endFinish records whether the write was fenced, and ends the span.
func endFinish(span trace.Span, err error) {
	if span.IsRecording() {
		span.SetAttributes(attrFenced.Bool(errors.Is(err, durable.ErrFenced)))
		if err != nil {
			span.SetStatus(codes.Error, errWord(err))
		}
	}
	span.End()
}

// endReconcile records what became of one record in a reconciliation pass
// (before and after are the pass's tallies around it), and ends its span.
func endReconcile(span trace.Span, rec durable.Record, before, after tally, err error) {
	if span.IsRecording() {
		result := "skipped"
		switch {
		case after.completed > before.completed:
			result = "completed"
		case after.failed > before.failed:
			result = "failed"
		case after.released > before.released:
			result = "released"
		case after.unknown > before.unknown:
			result = "unknown"
		case err != nil && !errors.Is(err, durable.ErrBusy) && !errors.Is(err, durable.ErrNotFound) && !errors.Is(err, durable.ErrFenced):
			result = "error"
			span.SetStatus(codes.Error, errWord(err))
		}
		span.SetAttributes(
			attrOperationID.String(rec.Ref.OperationID()),
			attrGeneration.Int64(int64(rec.Token.Generation)),
			attrResult.String(result),
		)
	}
	span.End()
}
