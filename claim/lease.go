package claim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/oncekey/oncekey/driver/storeapi"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/internal/fastpath"
)

// Lease is a durable claim held by this worker (workflow mode: [Claimer.Claim]
// then a Lease method). Every method is fenced by the lease's token: once
// another worker took the key over, each returns [ErrFenced] and writes
// nothing.
//
// A Lease is safe for concurrent use, so [Lease.KeepAlive] may renew it while
// the work calls Complete.
type Lease struct {
	c         leaseHost
	ref       durable.Ref
	opID      string        // ref.OperationID()
	keys      fastpath.Keys // ref's Redis key names; zero without Redis
	tok       fence.Token
	fp        string
	lease     time.Duration
	retention time.Duration
	margin    time.Duration     // the start margin of this claim; KeepAlive ends the work with it left
	sent      time.Time         // when the claim was sent; the result cache is bounded from it
	claimSpan trace.SpanContext // the span of the claim that acquired the lease, linked from finishes

	mu       sync.Mutex
	deadline time.Time // conservative local end of the lease, on the monotonic clock
}

func newLease[TTx any](c *Claimer[TTx], t *target, tok fence.Token, p storeapi.ClaimParams, sent time.Time, claimSpan trace.SpanContext) *Lease {
	return &Lease{c: c, ref: t.ref, opID: t.opID, keys: t.keys, tok: tok, fp: p.Fingerprint, lease: p.Lease, retention: p.Retention,
		margin: c.marginFor(p.Lease), sent: sent, deadline: sent.Add(p.Lease), claimSpan: claimSpan}
}

// Token returns the fencing token of the lease. Pass its generation to
// downstream systems that can reject stale writers (see package fence).
func (l *Lease) Token() fence.Token { return l.tok }

// OperationID returns the stable identity of the logical operation, the same
// for every retry and takeover: use it as the idempotency key of downstream
// calls, so a takeover that repeats a call is deduplicated there.
func (l *Lease) OperationID() string { return l.opID }

// Deadline returns when the lease ends at the latest, by this process's
// monotonic clock, measured from when the claim or the last renewal was
// sent (so it errs early, never late).
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Renew extends the lease by its full length from now by the database's
// clock. Errors: [ErrFenced] when the lease was lost, [ErrUnavailable].
func (l *Lease) Renew(ctx context.Context) error {
	if err := l.renewDurable(ctx); err != nil {
		return err
	}
	l.renewRedis(ctx)
	return nil
}

// renewDurable renews the lease in the durable store, which is what the
// deadline counts.
func (l *Lease) renewDurable(ctx context.Context) error {
	sent := time.Now()
	if err := l.c.renew(ctx, l.ref, l.tok, l.lease); err != nil {
		if errors.Is(err, durable.ErrFenced) {
			l.c.meters().fenced(ctx)
		}
		return wrap("renew", err)
	}
	l.mu.Lock()
	l.deadline = sent.Add(l.lease)
	l.mu.Unlock()
	return nil
}

// renewRedis renews Redis's copy of the lease, best effort: it only keeps
// duplicates answered by Redis.
func (l *Lease) renewRedis(ctx context.Context) {
	if l.c.redis() == nil {
		return
	}
	if _, err := l.c.redis().RenewKeys(ctx, l.keys, l.tok, l.lease); err != nil {
		l.c.logger().Debug("oncekey: redis renew failed", "op", l.ref, "err", err)
	}
}

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
			l.c.logger().Warn("oncekey: fenced completion rejected", "op", l.ref, "generation", l.tok.Generation)
		}
		return wrap(string(state), err)
	}
	l.c.cacheResult(ctx, l.ref, l.keys, l.tok, l.fp, state, res, l.retention, l.sent)
	return nil
}

// Release gives the key back after a transient failure before any effect:
// the next request with the key (any payload) runs as a new operation.
func (l *Lease) Release(ctx context.Context) (err error) {
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
		l.c.logger().Debug("oncekey: redis release failed", "op", l.ref, "err", err)
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

// KeepAlive renews the lease in the background every third of its length,
// counted from when the claim or the previous renewal was sent (a claim or
// renewal that came back later than that is followed by a renewal at once),
// and returns a context for the work, derived from ctx. That context is
// cancelled, with the reason as its cause (context.Cause):
//
//   - [ErrFenced] when a renewal is fenced: another worker took the key
//     over, and the work must not publish its result;
//   - [ErrLeaseExpired] when the lease could not be renewed (the store is
//     unreachable) and only the start margin ([WithStartMargin]) is left of
//     it by [Lease.Deadline]. The deadline is measured from when the claim
//     or the last successful renewal was sent, so it errs early: the work
//     is told to stop before the lease ends by the database's clock, that
//     is before another worker can take the key over, not after.
//
// Stop renewing by calling stop, which returns that reason or nil; call it
// before Complete, Fail, MarkUncertain or Release.
//
// ErrLeaseExpired does not mean the key was lost to someone else: no one may
// have taken it over yet, so a fenced [Lease.Complete] (or Fail, or
// MarkUncertain) may still succeed, and the caller should try it rather
// than give up on recording an effect that may have happened. The renewals
// go on after ErrLeaseExpired, until stop or a fenced renewal: a renewal
// that gets through (a slow one in flight is not cut) keeps the key from a
// takeover while the worker winds down and records its outcome. KeepAlive
// never releases the key: once work started, only the application may
// state that nothing happened.
//
// ctx should not be a request's context when the work must outlive its
// client (a cancelled request would cancel the work and stop the renewals
// while the effect may be half done): pass context.WithoutCancel of it, as
// package claimhttp does, and bound the work by the lease instead.
func (l *Lease) KeepAlive(ctx context.Context) (work context.Context, stop func() error) {
	if l.c.tracer().on() {
		ctx = operationBaggage(ctx, l.OperationID())
	}
	// alive ends when stop is called (or ctx ends): the renewals run on
	// it. work, derived from it, also ends when the lease is lost or about
	// to run out; the renewals go on after that, until stop, since the
	// worker still holds the key and is about to record its outcome (a
	// fenced Complete, Fail or MarkUncertain): a renewal that succeeds
	// keeps the key from a takeover meanwhile, and the worker may still
	// be running whatever it did not stop.
	alive, end := context.WithCancel(ctx)
	work, cancel := context.WithCancelCause(alive)
	done := make(chan struct{})
	var (
		once   sync.Once
		reason error
		mu     sync.Mutex
	)
	fail := func(err error) {
		mu.Lock()
		if reason == nil {
			reason = err
		}
		mu.Unlock()
		cancel(err)
	}
	go func() {
		defer close(done)
		interval := max(l.lease/3, time.Millisecond)
		// Each renewal is due interval after the previous one (or the
		// claim) was sent, which is when the deadline counts from, not
		// after it came back: a slow claim or a slow renewal must not
		// stretch the period, or the lease would lapse.
		nextRenewal := func() time.Duration {
			return max(time.Until(l.Deadline())-(l.lease-interval), time.Millisecond)
		}
		renew := time.NewTimer(nextRenewal())
		defer renew.Stop()
		// expiry fires when only the margin is left of the lease by its
		// local deadline. It runs beside the renewals, not after them, so
		// a renewal that hangs cannot delay the cancellation; it is
		// re-armed whenever a renewal (ours, or the caller's Renew) moved
		// the deadline.
		untilExpiry := func() time.Duration { return time.Until(l.Deadline()) - l.margin }
		expiry := time.NewTimer(max(untilExpiry(), 0))
		defer expiry.Stop()
		var renewed chan error // set while a durable renewal is in flight
		// Redis's copy is renewed after each durable renewal, off the
		// schedule: a slow Redis must not delay the next durable renewal
		// (the lease would lapse for an accelerator). One at a time; a
		// renewal that finds the previous one still running skips it.
		var (
			redisBusy atomic.Bool
			redisWG   sync.WaitGroup
		)
		defer func() {
			if renewed != nil {
				<-renewed // stop ended alive, so its context ended the renewal
			}
			redisWG.Wait() // likewise
		}()
		for {
			select {
			case <-alive.Done():
				return
			case <-expiry.C:
				if d := untilExpiry(); d > 0 {
					expiry.Reset(d)
					continue
				}
				// The work must stop; the renewals go on (a slow one in
				// flight is not cut: it may yet extend the lease).
				fail(fmt.Errorf("%w: not renewed in time", ErrLeaseExpired))
			case <-renew.C:
				renewed = make(chan error, 1)
				go func(ch chan<- error) {
					// Bounded, so a renewal stuck on a dead connection is
					// retried: until the deadline while there is one, then
					// a third of the lease at a time.
					rctx, rcancel := context.WithTimeout(alive, max(time.Until(l.Deadline()), interval))
					err := l.renewDurable(rctx)
					rcancel()
					if err == nil && redisBusy.CompareAndSwap(false, true) {
						redisWG.Add(1)
						go func() {
							defer redisWG.Done()
							defer redisBusy.Store(false)
							l.renewRedis(alive)
						}()
					}
					ch <- err
				}(renewed)
			case err := <-renewed:
				renewed = nil
				switch {
				case err == nil:
					if work.Err() == nil {
						expiry.Reset(max(untilExpiry(), 0))
					}
					renew.Reset(nextRenewal())
				case errors.Is(err, ErrFenced):
					fail(err)
					return
				default: // the store unreachable: retry soon
					renew.Reset(max(interval/4, time.Millisecond))
				}
			}
		}
	}()
	stop = func() error {
		once.Do(func() {
			cancel(context.Canceled)
			end()
			<-done
		})
		mu.Lock()
		defer mu.Unlock()
		return reason
	}
	return work, stop
}

// leaseHost is what a Lease needs of its Claimer, without the Claimer's
// transaction type: a Lease writes on its own, never in a caller's
// transaction.
type leaseHost interface {
	renew(ctx context.Context, ref durable.Ref, tok fence.Token, lease time.Duration) error
	finish(ctx context.Context, state durable.State, ref durable.Ref, tok fence.Token, res durable.Result) error
	release(ctx context.Context, ref durable.Ref, tok fence.Token) error
	markUncertain(ctx context.Context, ref durable.Ref, tok fence.Token) error
	cacheResult(ctx context.Context, ref durable.Ref, keys fastpath.Keys, tok fence.Token, fp string, state durable.State, res durable.Result, retention time.Duration, sent time.Time)
	redis() *fastpath.Scripts
	logger() *slog.Logger
	meters() *meters
	tracer() tracer
}

// startFinish starts the span of a finishing write that leads to state.
func (l *Lease) startFinish(ctx context.Context, state string) (context.Context, trace.Span) {
	return startFinish(ctx, l.c.tracer(), l.claimSpan, l.OperationID(), l.tok, state)
}

// durable runs a finishing write on the store as a child span.
func (l *Lease) durable(ctx context.Context, f func(context.Context) error) error {
	return l.c.tracer().step(ctx, spanDurableWrite, f)
}

func (c *Claimer[TTx]) renew(ctx context.Context, ref durable.Ref, tok fence.Token, lease time.Duration) error {
	return c.store.Renew(ctx, ref, tok, lease)
}

func (c *Claimer[TTx]) finish(ctx context.Context, state durable.State, ref durable.Ref, tok fence.Token, res durable.Result) error {
	if state == durable.Failed {
		return c.store.Fail(ctx, *new(TTx), ref, tok, res)
	}
	return c.store.Complete(ctx, *new(TTx), ref, tok, res)
}

func (c *Claimer[TTx]) release(ctx context.Context, ref durable.Ref, tok fence.Token) error {
	return c.store.Release(ctx, *new(TTx), ref, tok)
}

func (c *Claimer[TTx]) markUncertain(ctx context.Context, ref durable.Ref, tok fence.Token) error {
	return c.store.MarkUncertain(ctx, ref, tok)
}

func (c *Claimer[TTx]) redis() *fastpath.Scripts { return c.scripts }
func (c *Claimer[TTx]) logger() *slog.Logger     { return c.log }
func (c *Claimer[TTx]) meters() *meters          { return c.m }
func (c *Claimer[TTx]) tracer() tracer           { return c.tr }
