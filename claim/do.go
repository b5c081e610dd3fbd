package claim

import (
	"context"
	"errors"
	"fmt"
	"time"

	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/internal/logkeys"
)

// commitRereadTimeout bounds the read that settles a COMMIT whose reply was
// lost.
const commitRereadTimeout = 5 * time.Second

// Op describes the operation to the function run by [Claimer.Do].
type Op struct {
	// ID is the stable identity of the logical operation: use it as the
	// idempotency key of any downstream call.
	ID string
	// Token is the fencing token of this execution: the record's, held
	// by the claim that opened fn's transaction. With [WithWriteAtCommit]
	// it is only a proposal, stored if fn's transaction commits: fn may
	// then run for a duplicate whose token is never stored, and two
	// duplicates in flight may see the same generation; do not present it
	// to a fence outside the transaction then. Work that calls other
	// systems belongs in [Claimer.Claim] and a [Lease].
	Token fence.Token
}

// Do runs fn and stores its result in one transaction of the durable
// store: a crash before the commit leaves nothing (the retry runs again),
// after it everything (the retry replays). Then it caches the result in
// Redis.
//
// fn is the business effect, run inside the transaction tx that also
// commits the record. It returns the result to store, or:
//
//   - an error made by [Reject]: a final business rejection, stored as failed
//     and replayed;
//   - any other error: transient; the transaction rolls back, nothing is
//     stored, the key is free, and Do returns the error;
//   - a panic: the transaction rolls back, the key is free, Do re-panics.
//
// Do holds the key before fn runs. On PostgreSQL it locks first: the
// transaction's first round trip takes the key's lock (a transaction-scoped
// advisory lock that every claim of the key takes too) and checks that the
// key has no record; fn runs; the record is inserted, finished, with the
// COMMIT. The record is written once, and the library adds two round trips
// of its own to fn's. A key that has a record is not run: a finished one
// replays, any other is claimed as below. On SQLite Do claims first: the
// durable claim is the first statement of the transaction, then fn runs,
// then the record is completed, all committing together.
//
// Either way a concurrent duplicate waits for the holder's transaction and,
// once it commits, replays its result; a key another worker's [Lease]
// holds is answered InProgress, another payload ErrMismatch, without
// running fn. So fn runs at most once per record life (a run whose
// transaction rolled back leaves nothing, and the retry runs it again),
// never for a duplicate, also when Redis is down, frozen or lost the key,
// and for a result too large for Redis to cache. [WithWriteAtCommit]
// trades this for one statement fewer: fn first without the lock, the
// record inserted at COMMIT, and fn run again for the duplicates Redis did
// not stop (see the option).
//
// fn must not make long external calls: the transaction holds locks (the
// business rows, the key's) that concurrent duplicates wait on. Use
// [Claimer.Claim] and a [Lease] for work that calls other systems.
//
// It returns Executed (fn ran and its result committed), Replayed,
// InProgress or Uncertain (nothing of fn committed), with the same errors as
// [Claimer.Claim], plus fn's own transient error. When the COMMIT itself
// fails ambiguously, Do re-reads the record and returns the committed result
// if it is there, so the caller never retries into a replay it cannot tell
// from a first execution.
func (c *Claimer[TTx]) Do(ctx context.Context, r Request, fn func(ctx context.Context, tx TTx, op Op) (durable.Result, error)) (Outcome, error) {
	if fn == nil {
		return Outcome{}, configErr("Do: nil function")
	}
	start := c.metrics.start()
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
	c.metrics.claimDone(ctx, start, out.Kind, err)
	ended = true
	endClaim(span, out, err)
	return out, err
}

// doAttempt is one attempt of Do: what its transaction needs and what it
// learns, in one allocation shared with the function that InTx runs.
type doAttempt[TTx any] struct {
	claimer *Claimer[TTx]
	fn      func(context.Context, TTx, Op) (durable.Result, error)
	target  target
	params  storeapi.ClaimParams
	sent    time.Time // when the claim was sent: the lease counts from it
	fast    fast      // Redis's answer to the claim

	claimed   storeapi.ClaimResult
	state     durable.State
	result    durable.Result
	committed bool // fn and the completion succeeded inside the transaction
	fnErr     error
	rejected  *rejectError
}

// run is the transaction's body: the durable claim, fn and the completion.
func (d *doAttempt[TTx]) run(ctx context.Context, tx TTx) error {
	c := d.claimer
	res, err := c.durableClaim(ctx, tx, d.params)
	if err != nil {
		return err
	}
	d.claimed = res
	if !res.Acquired {
		return nil // commit nothing; classify below
	}
	tok := res.Token
	if time.Until(d.sent.Add(d.params.Lease)) < c.marginFor(d.params.Lease) {
		return ErrLeaseExpired
	}
	c.confirmAsync(ctx, &d.target, d.fast, tok)
	if err := d.call(ctx, tx, tok); err != nil {
		return err
	}
	if d.state == durable.Completed {
		err = c.store.Complete(ctx, tx, d.target.ref, tok, d.result)
	} else {
		err = c.store.Fail(ctx, tx, d.target.ref, tok, d.result)
	}
	if err != nil {
		return err
	}
	d.committed = true
	return nil
}

// call runs fn under tok and keeps its outcome: Completed with its result,
// Failed with a [Reject]'s, or fn's transient error, returned.
func (d *doAttempt[TTx]) call(ctx context.Context, tx TTx, tok fence.Token) error {
	d.result, d.fnErr = d.fn(d.claimer.withOperationBaggage(ctx, d.target.opID), tx, Op{ID: d.target.opID, Token: tok})
	switch {
	case d.fnErr == nil:
		d.state = durable.Completed
	case errors.As(d.fnErr, &d.rejected):
		d.state, d.result = durable.Failed, d.rejected.Result
	default:
		return d.fnErr
	}
	return nil
}

// endTxOnPanic, deferred right after a transaction span starts, ends the
// span and gives back the Redis lease when fn panics (the store rolled the
// transaction back), then panics on.
func (c *Claimer[TTx]) endTxOnPanic(ctx context.Context, txSpan trace.Span, f fast, t *target, p storeapi.ClaimParams) {
	if v := recover(); v != nil {
		txSpan.SetStatus(otelcodes.Error, "panic")
		txSpan.End()
		c.dropRedisLease(ctx, f, t, p)
		panic(v)
	}
}

func (c *Claimer[TTx]) doOnce(ctx context.Context, r Request, fn func(context.Context, TTx, Op) (durable.Result, error)) (out Outcome, err error) {
	s, out, done, err := c.beginClaim(ctx, r)
	if done {
		return out, err
	}
	t, p, f, sent := s.target, s.params, s.fast, s.sent
	d := &doAttempt[TTx]{claimer: c, fn: fn, target: t, params: p, sent: sent}
	read := false // the record was just read: it exists
	if c.atCommit != nil {
		if out, done, err := c.doAtCommit(ctx, d, f); done {
			return out, err
		}
		// The record exists: claim it as below. fn's first run rolled back.
		*d = doAttempt[TTx]{claimer: c, fn: fn, target: t, params: p, sent: sent}
		read = true
	} else {
		if f.proposed == 0 && c.newKeyGuess.recorded() {
			// Most recent claims Redis did not grant found a record: one
			// read answers a finished one without a transaction (newGuess).
			out, done, absent, err := c.readFirst(ctx, d, f)
			if done {
				if err == nil || errors.Is(err, durable.ErrMismatch) {
					c.newKeyGuess.observeRead()
				}
				return out, err
			}
			read = !absent
		}
		if c.locked != nil && !read {
			if out, done, err := c.doLocked(ctx, d, f); done {
				return out, err
			}
			// The record exists and is not finished: claim it as below.
			*d = doAttempt[TTx]{claimer: c, fn: fn, target: t, params: p, sent: sent}
			read = true
		}
	}
	c.hint(&d.params, f)
	d.fast = f
	// A record just read would only be found again by the plain insert.
	d.params.ExpectNew = d.params.ExpectNew && !read
	p = d.params

	txCtx, txSpan := c.tracing.start(ctx, spanDurableTx)
	defer c.endTxOnPanic(ctx, txSpan, f, &d.target, p)
	txErr := c.store.InTx(txCtx, d.run)
	if txErr != nil && txSpan.IsRecording() {
		txSpan.SetStatus(otelcodes.Error, errWord(txErr))
	}
	txSpan.End()
	if txErr != nil {
		if d.committed && errors.Is(txErr, durable.ErrUnavailable) {
			return c.commitLost(ctx, d, f, txErr)
		}
		c.dropRedisLease(ctx, f, &d.target, p)
		if d.fnErr != nil && errors.Is(txErr, d.fnErr) {
			return Outcome{OperationID: d.target.opID}, d.fnErr
		}
		return Outcome{OperationID: d.target.opID}, c.claimErr(ctx, txErr)
	}
	if !d.claimed.Acquired {
		return c.existing(ctx, &d.target, p, f, d.claimed.Record, sent, false), nil
	}
	c.acquired(ctx, &d.target, p, f, d.claimed, true)
	return c.executed(ctx, d), nil
}

// commitLost settles a COMMIT of d that was sent and failed (txErr): it may
// have applied. It reads the truth, even when the caller has given up, but
// not forever: a store that does not answer leaves the outcome unknown.
func (c *Claimer[TTx]) commitLost(ctx context.Context, d *doAttempt[TTx], f fast, txErr error) (Outcome, error) {
	tok := d.claimed.Token
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitRereadTimeout)
	rec, err := c.store.Get(rctx, d.target.ref)
	cancel()
	if err == nil && rec.State == d.state && rec.Token == tok && rec.Result != nil {
		c.log.Info("oncekey: commit acknowledgement lost; the record shows it applied", logkeys.Op, d.target.ref)
		c.acquired(ctx, &d.target, d.params, f, d.claimed, true)
		d.result = *rec.Result
		return c.executed(ctx, d), nil
	}
	c.dropRedisLease(ctx, f, &d.target, d.params)
	return Outcome{OperationID: d.target.opID}, fmt.Errorf("claim: %w: commit outcome unknown and not visible: %w", ErrUnavailable, txErr)
}

// atCommitLag is how far behind the client's clock the generation of a
// write at commit is proposed when Redis proposed none. The insert requires
// at least the database's clock less 60 s (the floor of a fresh claim), so
// the client's clock may run up to 30 s behind the database's before Do
// falls back to claiming first.
const atCommitLag = 30 * time.Second

// doAtCommit is Do's first path with [WithWriteAtCommit] on a store that
// writes the record at commit (durable/postgres): fn runs in a transaction
// that holds nothing of the record, and the record is inserted, finished,
// in the round trip of the COMMIT. The transaction is the lease: a concurrent duplicate's insert
// waits for it and fails once it commits, rolling back with its business
// write. When Redis did not answer, a plain read first keeps a known key
// from running fn: a finished record replays, any other record goes to the
// claim.
//
// It returns done=false, with fn's writes rolled back, when the record exists
// (or the generation is below the database's floor): the caller claims it,
// with Redis as f left it.
func (c *Claimer[TTx]) doAtCommit(ctx context.Context, d *doAttempt[TTx], f fast) (out Outcome, done bool, err error) {
	t, p := &d.target, d.params
	tok := fence.Token{Generation: f.proposed, Owner: p.Owner}
	if !f.answered {
		out, done, absent, err := c.readFirst(ctx, d, f)
		if done || !absent {
			return out, done, err
		}
		tok.Generation = uint64(max(1, time.Now().Add(-atCommitLag).UnixMilli()))
	}
	if time.Until(d.sent.Add(p.Lease)) < c.marginFor(p.Lease) {
		c.dropRedisLease(ctx, f, t, p)
		return Outcome{OperationID: t.opID}, true, ErrLeaseExpired
	}
	d.claimed = storeapi.ClaimResult{Acquired: true, Token: tok, Ref: t.ref}

	txCtx, txSpan := c.tracing.start(ctx, spanDurableTx)
	defer c.endTxOnPanic(ctx, txSpan, f, t, p)
	err = c.atCommit.InsertAtCommit(txCtx, p, tok, d.runAtCommit)
	endInsertSpan(txSpan, err)
	switch {
	case err == nil:
		c.acquired(ctx, t, p, f, d.claimed, true)
		return c.executed(ctx, d), true, nil
	case errors.Is(err, storeapi.ErrNotInserted):
		// Most likely a duplicate in flight committed first: one read
		// answers its replay; anything else is claimed.
		out, done, _, err := c.readFirst(ctx, d, f)
		return out, done, err
	case d.committed && errors.Is(err, durable.ErrUnavailable):
		out, err := c.commitLost(ctx, d, f, err)
		return out, true, err
	case d.fnErr != nil && errors.Is(err, d.fnErr):
		// A duplicate that committed first may be why fn failed (its
		// business write conflicted with fn's): answer with its result.
		if rec, gerr := c.store.Get(ctx, t.ref); gerr == nil && replayable(rec) && rec.Fingerprint == p.Fingerprint {
			return c.existing(ctx, t, p, f, &rec, d.sent, false), true, nil
		}
		c.dropRedisLease(ctx, f, t, p)
		return Outcome{OperationID: t.opID}, true, d.fnErr
	default:
		c.dropRedisLease(ctx, f, t, p)
		return Outcome{OperationID: t.opID}, true, c.claimErr(ctx, err)
	}
}

// doLocked is Do's default path on a store that can lock first
// (durable/postgres): the key's lock and a check that no record exists ride
// in the BEGIN's round trip, fn runs, and the record is inserted, finished,
// with the COMMIT: one row version, two round trips of the library's own.
// Every claim of the key takes the same lock, so a duplicate (a Do, a
// Claim, a DoTx) waits for this COMMIT and then finds the record: fn runs
// at most once per record life and never for a duplicate, a mismatch or a
// key another worker holds, with or without Redis.
//
// It returns done=false when a record exists and is not finished within
// its retention (held, uncertain, released, expired): fn did not run, and
// the caller claims it.
func (c *Claimer[TTx]) doLocked(ctx context.Context, d *doAttempt[TTx], f fast) (out Outcome, done bool, err error) {
	t, p := &d.target, d.params
	tok := fence.Token{Generation: f.proposed, Owner: p.Owner}
	if tok.Generation == 0 {
		tok.Generation = uint64(max(1, time.Now().Add(-atCommitLag).UnixMilli()))
	}
	if time.Until(d.sent.Add(p.Lease)) < c.marginFor(p.Lease) {
		c.dropRedisLease(ctx, f, t, p)
		return Outcome{OperationID: t.opID}, true, ErrLeaseExpired
	}
	d.claimed = storeapi.ClaimResult{Acquired: true, Token: tok, Ref: t.ref}
	d.fast = f
	p.Proposed = f.proposed
	p.LockFirst = true

	txCtx, txSpan := c.tracing.start(ctx, spanDurableTx)
	defer c.endTxOnPanic(ctx, txSpan, f, t, p)
	err = c.locked.InsertAtCommit(txCtx, p, tok, d.runLocked)
	endInsertSpan(txSpan, err)
	switch {
	case err == nil:
		c.newKeyGuess.observe(p, storeapi.ClaimResult{Acquired: true})
		c.acquired(ctx, t, p, f, d.claimed, true)
		return c.executed(ctx, d), true, nil
	case errors.Is(err, storeapi.ErrExists), errors.Is(err, storeapi.ErrNotInserted):
		// A record exists (fn did not run), or the proposal fell below the
		// store's floor (fn rolled back): one read answers a finished
		// record; anything else is claimed.
		c.newKeyGuess.observe(p, storeapi.ClaimResult{})
		out, done, _, err := c.readFirst(ctx, d, f)
		return out, done, err
	case d.committed && errors.Is(err, durable.ErrUnavailable):
		out, err := c.commitLost(ctx, d, f, err)
		return out, true, err
	case d.fnErr != nil && errors.Is(err, d.fnErr):
		c.dropRedisLease(ctx, f, t, p)
		return Outcome{OperationID: t.opID}, true, d.fnErr
	default:
		c.dropRedisLease(ctx, f, t, p)
		return Outcome{OperationID: t.opID}, true, c.claimErr(ctx, err)
	}
}

// endInsertSpan ends the span of a transaction that inserts its record at
// COMMIT (InsertAtCommit), saying whether it inserted, found the record
// (ErrExists, ErrNotInserted), or failed.
func endInsertSpan(span trace.Span, err error) {
	if span.IsRecording() {
		switch {
		case err == nil:
			span.SetAttributes(attrDurable.String("inserted"))
		case errors.Is(err, storeapi.ErrExists), errors.Is(err, storeapi.ErrNotInserted):
			span.SetAttributes(attrDurable.String("existing"))
		default:
			span.SetStatus(otelcodes.Error, errWord(err))
		}
	}
	span.End()
}

// runLocked is the transaction's body of doLocked, once the store holds the
// key's lock and found no record: our Redis lease is confirmed (off the
// caller's path), then fn runs and its outcome becomes the record's.
func (d *doAttempt[TTx]) runLocked(ctx context.Context, tx TTx) (durable.State, durable.Result, error) {
	d.claimer.confirmAsync(ctx, &d.target, d.fast, d.claimed.Token)
	return d.runAtCommit(ctx, tx)
}

// readFirst reads the record of d with one plain read: done with a replay
// (or a mismatch) when it is finished within its retention, or with the
// error when the store cannot be read; absent when there is no record;
// neither otherwise (the record must be claimed).
func (c *Claimer[TTx]) readFirst(ctx context.Context, d *doAttempt[TTx], f fast) (out Outcome, done, absent bool, err error) {
	t, p := &d.target, d.params
	rec, err := c.store.Get(ctx, t.ref)
	switch {
	case errors.Is(err, durable.ErrNotFound):
		return Outcome{}, false, true, nil
	case err != nil:
		c.dropRedisLease(ctx, f, t, p)
		return Outcome{OperationID: t.opID}, true, false, c.claimErr(ctx, err)
	case replayable(rec):
		if rec.Fingerprint != p.Fingerprint {
			c.dropRedisLease(ctx, f, t, p)
			return Outcome{OperationID: t.opID}, true, false, c.claimErr(ctx, durable.ErrMismatch)
		}
		return c.existing(ctx, t, p, f, &rec, d.sent, false), true, false, nil
	}
	return Outcome{}, false, false, nil
}

// replayable reports whether rec, read on its own, answers a retry: finished
// within its retention (what the claim statement's read-only path replays).
func replayable(rec durable.Record) bool {
	return rec.State.Finished() && rec.Result != nil && rec.ExpiresIn > 0
}

// runAtCommit is the transaction's body of a write at commit: fn, whose
// outcome becomes the record's state and result.
func (d *doAttempt[TTx]) runAtCommit(ctx context.Context, tx TTx) (durable.State, durable.Result, error) {
	if err := d.call(ctx, tx, d.claimed.Token); err != nil {
		return "", durable.Result{}, err
	}
	d.committed = true
	return d.state, d.result, nil
}

// executed caches the committed result of d in Redis and returns its
// outcome, whose Result points into d.
func (c *Claimer[TTx]) executed(ctx context.Context, d *doAttempt[TTx]) Outcome {
	c.cacheBehind(ctx, d.target.ref, d.target.keys, d.claimed.Token, d.params.Fingerprint, d.state, d.result, d.params.Retention, d.sent)
	return Outcome{Kind: Executed, OperationID: d.target.opID, State: d.state, Result: &d.result}
}
