package claim

import (
	"context"
	"errors"
	"fmt"
	"time"

	otelcodes "go.opentelemetry.io/otel/codes"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/internal/storeapi"
)

// commitRereadTimeout bounds the read that settles a COMMIT whose reply was
// lost.
const commitRereadTimeout = 5 * time.Second

// Op describes the operation to the function run by [Claimer.Do].
type Op struct {
	// ID is the stable identity of the logical operation: use it as the
	// idempotency key of any downstream call.
	ID string
	// Token is the fencing token of this execution.
	Token fence.Token
}

// Do claims the request's key, runs fn, and stores its result, all in one
// transaction of the durable store: a crash before the commit leaves
// nothing (the retry runs again), after it everything (the retry replays).
// Then it caches the result in Redis.
//
// fn is the business effect, run inside the transaction tx that also holds
// the claim. It returns the result to store, or:
//
//   - an error made by [Reject]: a final business rejection, stored as failed
//     and replayed;
//   - any other error: transient; the transaction rolls back, nothing is
//     stored, the key is free, and Do returns the error;
//   - a panic: the transaction rolls back, the key is free, Do re-panics.
//
// fn must not make long external calls: the transaction holds a row lock
// that concurrent duplicates wait on. Use [Claimer.Claim] and a [Lease] for
// work that calls other systems.
//
// It returns Executed (fn ran and its result committed), Replayed,
// InProgress or Uncertain (fn did not run), with the same errors as
// [Claimer.Claim], plus fn's own transient error. When the COMMIT itself
// fails ambiguously, Do re-reads the record and returns the committed result
// if it is there, so the caller never retries into a replay it cannot tell
// from a first execution.
func (c *Claimer[TTx]) Do(ctx context.Context, r Request, fn func(ctx context.Context, tx TTx, op Op) (durable.Result, error)) (Outcome, error) {
	if fn == nil {
		return Outcome{}, configErr("Do: nil function")
	}
	start := c.m.start()
	ctx, span := c.startClaim(ctx, "do", r)
	ended := false
	defer func() {
		if !ended { // fn panicked
			span.SetStatus(otelcodes.Error, "panic")
			span.End()
		}
	}()
	out, err := c.withPolicy(ctx, r, func(ctx context.Context, r Request) (Outcome, error) {
		return c.doOnce(ctx, r, fn)
	})
	c.m.claimDone(ctx, start, out.Kind, err)
	ended = true
	endClaim(span, out, err)
	return out, err
}

// doAttempt is one attempt of Do: what its transaction needs and what it
// learns, in one allocation shared with the function that InTx runs.
type doAttempt[TTx any] struct {
	c    *Claimer[TTx]
	fn   func(context.Context, TTx, Op) (durable.Result, error)
	t    target
	p    storeapi.ClaimParams
	sent time.Time // when the claim was sent: the lease counts from it

	claimed   storeapi.ClaimResult
	state     durable.State
	result    durable.Result
	committed bool // fn and the completion succeeded inside the transaction
	fnErr     error
	rej       *rejectError
}

// run is the transaction's body: the durable claim, fn and the completion.
func (d *doAttempt[TTx]) run(ctx context.Context, tx TTx) error {
	c := d.c
	res, err := c.durableClaim(ctx, tx, d.p)
	if err != nil {
		return err
	}
	d.claimed = res
	if !res.Acquired {
		return nil // commit nothing; classify below
	}
	tok := res.Token
	if time.Until(d.sent.Add(d.p.Lease)) < c.marginFor(d.p.Lease) {
		return ErrLeaseExpired
	}
	d.result, d.fnErr = d.fn(c.withOperationBaggage(ctx, d.t.opID), tx, Op{ID: d.t.opID, Token: tok})
	switch {
	case d.fnErr == nil:
		d.state = durable.Completed
		err = c.store.Complete(ctx, tx, d.t.ref, tok, d.result)
	case errors.As(d.fnErr, &d.rej):
		d.state, d.result = durable.Failed, d.rej.Result
		err = c.store.Fail(ctx, tx, d.t.ref, tok, d.result)
	default:
		return d.fnErr
	}
	if err != nil {
		return err
	}
	d.committed = true
	return nil
}

func (c *Claimer[TTx]) doOnce(ctx context.Context, r Request, fn func(context.Context, TTx, Op) (durable.Result, error)) (out Outcome, err error) {
	t, p, err := c.prepare(r)
	if err != nil {
		return Outcome{}, err
	}
	sent := time.Now()
	f := c.redisClaim(ctx, &t, p)
	if c.tr.on() {
		c.tr.note(ctx, attrRedis.Bool(f.answered))
	}
	if f.final {
		return c.fastOutcome(ctx, t.opID, f)
	}
	p.Proposed = f.proposed

	d := &doAttempt[TTx]{c: c, fn: fn, t: t, p: p, sent: sent}
	txCtx, txSpan := c.tr.start(ctx, spanDurableTx)
	defer func() {
		if v := recover(); v != nil {
			txSpan.SetStatus(otelcodes.Error, "panic")
			txSpan.End()
			c.dropRedisLease(ctx, f, &d.t, p)
			panic(v)
		}
	}()
	txErr := c.store.InTx(txCtx, d.run)
	if txErr != nil && txSpan.IsRecording() {
		txSpan.SetStatus(otelcodes.Error, errWord(txErr))
	}
	txSpan.End()
	tok := d.claimed.Token
	if txErr != nil {
		if d.committed && errors.Is(txErr, durable.ErrUnavailable) {
			// COMMIT was sent and failed: it may have applied. Read the truth,
			// even when the caller has given up, but not forever: a store that
			// does not answer leaves the outcome unknown.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitRereadTimeout)
			rec, err := c.store.Get(rctx, d.t.ref)
			cancel()
			if err == nil &&
				rec.State == d.state && rec.Token == tok && rec.Result != nil {
				c.log.Info("oncekey: commit acknowledgement lost; the record shows it applied", "op", d.t.ref)
				c.acquired(ctx, &d.t, p, f, d.claimed)
				d.result = *rec.Result
				return c.executed(ctx, d), nil
			}
			c.dropRedisLease(ctx, f, &d.t, p)
			return Outcome{OperationID: d.t.opID}, fmt.Errorf("%w: commit outcome unknown and not visible: %w", ErrUnavailable, txErr)
		}
		c.dropRedisLease(ctx, f, &d.t, p)
		if d.fnErr != nil && errors.Is(txErr, d.fnErr) {
			return Outcome{OperationID: d.t.opID}, d.fnErr
		}
		return Outcome{OperationID: d.t.opID}, c.claimErr(ctx, txErr)
	}
	if !d.claimed.Acquired {
		return c.existing(ctx, &d.t, p, f, d.claimed.Record, sent), nil
	}
	c.acquired(ctx, &d.t, p, f, d.claimed)
	return c.executed(ctx, d), nil
}

// executed caches the committed result of d in Redis and returns its
// outcome, whose Result points into d.
func (c *Claimer[TTx]) executed(ctx context.Context, d *doAttempt[TTx]) Outcome {
	c.cacheResult(ctx, d.t.ref, d.t.keys, d.claimed.Token, d.p.Fingerprint, d.state, d.result, d.p.Retention, d.sent)
	return Outcome{Kind: Executed, OperationID: d.t.opID, State: d.state, Result: &d.result}
}
