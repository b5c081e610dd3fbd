package claim

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/internal/logkeys"
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

	stepMu      sync.Mutex  // held while a Step runs: steps run one at a time, in order
	nextStep    int         // the place of the next new step in this attempt
	started     atomic.Bool // a step's function ran in this attempt: never Release
	stepsByName map[string]*stepMemo
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
		l.c.logger().Debug("oncekey: redis renew failed", logkeys.Op, l.ref, logkeys.Err, err)
	}
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
	steps() storeapi.StepStore
	logger() *slog.Logger
	meters() *meters
	tracer() tracer
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
func (c *Claimer[TTx]) meters() *meters          { return c.metrics }
func (c *Claimer[TTx]) tracer() tracer           { return c.tracing }
