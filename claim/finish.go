package claim

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/trace"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/internal/logkeys"
)

// Complete stores res as the operation's result (state completed), fenced,
// then caches it in Redis. Completing again with the same result succeeds.
// Errors: [ErrFenced] (the result must not be published), [ErrUnavailable]
// (unknown whether it was stored; retry Complete).
func (l *Lease) Complete(ctx context.Context, res durable.Result) error {
	return l.finish(ctx, durable.Completed, res)
}

// Fail stores res as a final business rejection (state failed), fenced, and
// replays it to every retry. For a transient failure before any effect use
// [Lease.Release] instead.
func (l *Lease) Fail(ctx context.Context, res durable.Result) error {
	return l.finish(ctx, durable.Failed, res)
}

func (l *Lease) finish(ctx context.Context, state durable.State, res durable.Result) (err error) {
	ctx, span := l.startFinish(ctx, string(state))
	defer func() { endFinish(span, err) }()
	err = l.durable(ctx, func(ctx context.Context) error {
		if state == durable.Completed {
			return l.c.finish(ctx, durable.Completed, l.ref, l.tok, res)
		}
		return l.c.finish(ctx, durable.Failed, l.ref, l.tok, res)
	})
	if err != nil {
		if errors.Is(err, durable.ErrFenced) {
			l.c.meters().fenced(ctx)
			l.c.logger().Warn("oncekey: fenced completion rejected", logkeys.Op, l.ref, logkeys.Generation, l.tok.Generation)
		}
		return wrap(string(state), err)
	}
	l.c.cacheResult(ctx, l.ref, l.keys, l.tok, l.fp, state, res, l.retention, l.sent)
	return nil
}

// Release gives the key back after a transient failure before any effect:
// the next request with the key (any payload) runs as a new operation.
//
// An operation with recorded steps ([Lease.Step], this attempt's or an
// earlier one's) has had effects, or may have: Release refuses (an error
// matching [ErrConfig]; nothing is written), since the next request would
// start a new operation that runs every step again. End the work with Fail
// or MarkUncertain instead.
func (l *Lease) Release(ctx context.Context) (err error) {
	if l.stepStarted() {
		return configErr("Release after a step started: its effect may have happened; Fail or MarkUncertain instead")
	}
	steps, err := l.c.steps().Steps(ctx, l.ref, false)
	if err != nil {
		return wrap("release", err)
	}
	if len(steps) > 0 {
		return configErr("Release of an operation with recorded steps: their effects happened or may have; Fail or MarkUncertain instead")
	}
	ctx, span := l.startFinish(ctx, "released")
	defer func() { endFinish(span, err) }()
	if err := l.durable(ctx, func(ctx context.Context) error { return l.c.release(ctx, l.ref, l.tok) }); err != nil {
		return wrap("release", err)
	}
	l.releaseRedis(ctx)
	return nil
}

func (l *Lease) releaseRedis(ctx context.Context) {
	if l.c.redis() == nil {
		return
	}
	_, err := l.c.redis().ReleaseKeys(context.WithoutCancel(ctx), l.keys, l.tok)
	l.c.tracer().event(ctx, eventRedisRelease, err)
	if err != nil {
		l.c.logger().Debug("oncekey: redis release failed", logkeys.Op, l.ref, logkeys.Err, err)
	}
}

// MarkUncertain records that the external outcome is unknown (a downstream
// call timed out after it may have applied). Retries then get [Uncertain]
// until a [Reconciler] resolves the record; nothing is re-executed.
func (l *Lease) MarkUncertain(ctx context.Context) (err error) {
	ctx, span := l.startFinish(ctx, string(durable.Uncertain))
	defer func() { endFinish(span, err) }()
	if err := l.durable(ctx, func(ctx context.Context) error { return l.c.markUncertain(ctx, l.ref, l.tok) }); err != nil {
		return wrap("mark uncertain", err)
	}
	l.c.meters().uncertain(ctx)
	l.releaseRedis(ctx)
	return nil
}

// startFinish starts the span of a finishing write that leads to state.
func (l *Lease) startFinish(ctx context.Context, state string) (context.Context, trace.Span) {
	return startFinish(ctx, l.c.tracer(), l.claimSpan, l.OperationID(), l.tok, state)
}

// durable runs a finishing write on the store as a child span.
func (l *Lease) durable(ctx context.Context, f func(context.Context) error) error {
	return l.c.tracer().step(ctx, spanDurableWrite, f)
}
