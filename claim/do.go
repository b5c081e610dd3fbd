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

func (c *Claimer[TTx]) doOnce(ctx context.Context, r Request, fn func(context.Context, TTx, Op) (durable.Result, error)) (out Outcome, err error) {
	t, p, err := c.prepare(r)
	if err != nil {
		return Outcome{}, err
	}
	ref, opID := t.ref, t.opID
	sent := time.Now()
	f := c.redisClaim(ctx, &t, p)
	if c.tr.on() {
		c.tr.note(ctx, attrRedis.Bool(f.answered))
	}
	if f.final {
		return c.fastOutcome(ctx, opID, f)
	}
	p.Proposed = f.proposed

	var (
		claimed   storeapi.ClaimResult
		tok       fence.Token
		state     durable.State
		result    durable.Result
		committed bool // fn and the completion succeeded inside the transaction
		fnErr     error
		read      time.Time // when the claim in tx was sent
	)
	txCtx, txSpan := c.tr.start(ctx, spanDurableTx)
	defer func() {
		if v := recover(); v != nil {
			txSpan.SetStatus(otelcodes.Error, "panic")
			txSpan.End()
			c.dropRedisLease(ctx, f, &t, p)
			panic(v)
		}
	}()
	txErr := c.store.InTx(txCtx, func(ctx context.Context, tx TTx) error {
		read = time.Now()
		res, err := c.durableClaim(ctx, tx, p)
		if err != nil {
			return err
		}
		claimed = res
		if !res.Acquired {
			return nil // commit nothing; classify below
		}
		tok = res.Token
		if time.Until(sent.Add(p.Lease)) < c.marginFor(p.Lease) {
			return ErrLeaseExpired
		}
		result, fnErr = fn(c.withOperationBaggage(ctx, opID), tx, Op{ID: opID, Token: tok})
		var rej *rejectError
		switch {
		case fnErr == nil:
			state = durable.Completed
			err = c.store.Complete(ctx, tx, ref, tok, result)
		case errors.As(fnErr, &rej):
			state, result = durable.Failed, rej.Result
			err = c.store.Fail(ctx, tx, ref, tok, result)
		default:
			return fnErr
		}
		if err != nil {
			return err
		}
		committed = true
		return nil
	})
	if txErr != nil && txSpan.IsRecording() {
		txSpan.SetStatus(otelcodes.Error, errWord(txErr))
	}
	txSpan.End()
	if txErr != nil {
		if committed && errors.Is(txErr, durable.ErrUnavailable) {
			// COMMIT was sent and failed: it may have applied. Read the truth,
			// even when the caller has given up, but not forever: a store that
			// does not answer leaves the outcome unknown.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitRereadTimeout)
			rec, err := c.store.Get(rctx, ref)
			cancel()
			if err == nil &&
				rec.State == state && rec.Token == tok && rec.Result != nil {
				c.log.Info("oncekey: commit acknowledgement lost; the record shows it applied", "op", ref)
				c.acquired(ctx, &t, p, f, claimed)
				return c.executed(ctx, &t, tok, p, state, *rec.Result, sent), nil
			}
			c.dropRedisLease(ctx, f, &t, p)
			return Outcome{OperationID: opID}, fmt.Errorf("%w: commit outcome unknown and not visible: %w", ErrUnavailable, txErr)
		}
		c.dropRedisLease(ctx, f, &t, p)
		if fnErr != nil && errors.Is(txErr, fnErr) {
			return Outcome{OperationID: opID}, fnErr
		}
		return Outcome{OperationID: opID}, c.claimErr(ctx, txErr)
	}
	if !claimed.Acquired {
		return c.existing(ctx, &t, p, f, claimed.Record, read), nil
	}
	c.acquired(ctx, &t, p, f, claimed)
	return c.executed(ctx, &t, tok, p, state, result, sent), nil
}

func (c *Claimer[TTx]) executed(ctx context.Context, t *target, tok fence.Token, p storeapi.ClaimParams, state durable.State, res durable.Result, sent time.Time) Outcome {
	c.cacheResult(ctx, t.ref, t.keys, tok, p.Fingerprint, state, res, p.Retention, sent)
	return Outcome{Kind: Executed, OperationID: t.opID, State: state, Result: &res}
}
