package claim

import (
	"context"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/internal/logkeys"
)

// The asynchronous adapters (claimriver) claim a key in the transaction
// that records the intent to run, and resume the operation from a worker,
// through Driver (driver_seam.go).

func (c *Claimer[TTx]) leaseLength() time.Duration { return c.cfg.lease }

// expire ends the lease now by the database's clock (a renewal to 1ms),
// fenced; the record stays processing, for its job's next run to adopt.
func (l *Lease) expire(ctx context.Context) (err error) {
	ctx, span := l.startFinish(ctx, "expired")
	defer func() { endFinish(span, err) }()
	return wrap("expire", l.durable(ctx, func(ctx context.Context) error {
		return l.c.renew(ctx, l.ref, l.tok, time.Millisecond)
	}))
}

// claimTx claims r inside tx, in the durable store only (Redis is not
// asked: the claim is not visible before tx commits). An Acquired outcome
// carries a Lease whose writes run on their own, once tx committed, and
// reports whether it took over an expired lease of the same request.
func (c *Claimer[TTx]) claimTx(ctx context.Context, tx TTx, r Request) (Outcome, bool, error) {
	t, p, err := c.prepare(r)
	if err != nil {
		return Outcome{}, false, err
	}
	if out, ok := c.localReplay(ctx, &t, p); ok {
		return out, false, nil
	}
	sent := time.Now()
	c.hint(&p, fast{})
	res, err := c.store.Claim(ctx, tx, p)
	if err != nil {
		return Outcome{OperationID: t.opID}, false, c.claimErr(ctx, err)
	}
	c.newKeyGuess.observe(p, res)
	if !res.Acquired {
		return c.existing(ctx, &t, p, fast{}, res.Record, sent, true), false, nil
	}
	return Outcome{Kind: Acquired, OperationID: t.opID, Lease: newLease(c, &t, res.Token, p, sent, trace.SpanContextFromContext(ctx))}, res.Takeover, nil
}

// resume returns a Lease on the operation id of tenant, for a worker that
// runs it. With tok, the token of the claim that recorded the intent, the
// claim is handed over to this worker under a new generation (whether or
// not its lease expired); exactly one worker gets a token's handover, any
// other ErrFenced. With the zero token (the handover went to a worker that
// died or failed), the record is adopted under a new generation, which
// fences every earlier worker, once its lease expired: durable.ErrBusy
// while it is live. A record that is not processing (finished, uncertain,
// released) returns a nil Lease and the record: there is nothing to run.
func (c *Claimer[TTx]) resume(ctx context.Context, tenant, id string, tok fence.Token) (*Lease, durable.Record, error) {
	read := time.Now()
	rec, err := c.Operation(ctx, tenant, id)
	if err != nil {
		return nil, rec, err
	}
	if rec.State != durable.Processing || rec.Released {
		return nil, rec, nil
	}
	sent := time.Now()
	// Handover and Adopt keep the record's retention, that of the claim
	// that created it, which may be shorter than this Claimer's: the
	// lease's result is cached (Redis, WithReplayCache) only until the
	// record's expiry as read, which the finish never moves earlier.
	p := storeapi.ClaimParams{Fingerprint: rec.Fingerprint, Lease: c.cfg.lease, Retention: read.Add(rec.ExpiresIn).Sub(sent)}
	var ntok fence.Token
	if tok != (fence.Token{}) {
		ntok, err = c.store.Handover(ctx, rec.Ref, tok, uuid.New(), p.Lease)
	} else {
		ntok, err = c.store.Adopt(ctx, rec.Ref, uuid.New(), 0, p.Lease)
		if err == nil {
			c.metrics.takeover(ctx)
			c.log.Info("oncekey: a worker took the operation over", logkeys.Op, rec.Ref, logkeys.Generation, ntok.Generation)
		}
	}
	if err != nil {
		return nil, rec, wrap("resume", err)
	}
	t := c.targetOf(rec.Ref)
	return newLease(c, &t, ntok, p, sent, trace.SpanContextFromContext(ctx)), rec, nil
}
