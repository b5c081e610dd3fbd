package claim

import (
	"context"
	"errors"
	"reflect"
	"time"

	"github.com/oncekey/oncekey/durable"
)

// DoTx is [Claimer.Do] inside tx, a transaction the caller began and
// commits: the claim, fn's business write and the completion all ride in tx
// and commit with it. tx must be a transaction on the store's own database:
// a pgx.Tx at READ COMMITTED (PostgreSQL's default) on the pool the store
// was built with, or a *sql.Tx on the *sql.DB of the SQLite store (from
// durable/sqlite's Open, whose transactions begin IMMEDIATE). fn gets tx
// back, as with Do.
//
// DoTx never commits or rolls back tx. Its outcomes:
//
//   - Executed with its State and Result: fn ran and its result is stored
//     in tx. Commit tx, then call finish with the commit's error.
//   - Replayed, InProgress, Uncertain: fn did not run and tx holds
//     nothing of DoTx: no write and no lock (in PostgreSQL the claim ran
//     under a savepoint, rolled back to once it did not acquire), so the
//     record's holder finishes it while tx is still open. Answer as Do's
//     caller would; tx stays usable.
//   - an error (fn's transient error, [ErrLeaseExpired], the store's
//     errors; a [Reject] is not an error but Executed with State failed):
//     roll tx back. fn's writes and the claim must not commit; if tx were
//     committed anyway, the claim would commit as processing and its lease
//     would expire, after which a retry takes it over and runs again, as
//     after a crash.
//
// finish is the Redis step, never nil: call it once tx has ended, with the
// error of the caller's COMMIT (nil when it committed, the rollback's cause
// otherwise). After a commit it caches the result in Redis for retries;
// otherwise it frees the Redis lease this claim took, so a retry goes to the
// store, which holds nothing of the rolled-back claim and runs the request
// again. Not calling finish is safe but slow: Redis answers "in progress"
// until the claim's lease would have expired. finish does nothing after the
// outcomes other than Executed.
//
// Rollback: everything DoTx wrote is in tx, so a rollback (the caller's
// error, a failed COMMIT, a crash) leaves no record: the key is free and a
// retry runs fn again. A COMMIT whose reply was lost leaves the outcome to
// the store: a retry either replays the committed result or runs again.
//
// fn must be short, as with Do: concurrent duplicates wait on the claimed
// row until tx ends. [WithWait] does not apply: an in-progress answer
// returns at once rather than hold the caller's transaction open.
func (c *Claimer[TTx]) DoTx(ctx context.Context, tx TTx, r Request, fn func(ctx context.Context, tx TTx, op Op) (durable.Result, error)) (out Outcome, finish func(ctx context.Context, commitErr error), err error) {
	finish = func(context.Context, error) {}
	if fn == nil {
		return Outcome{}, finish, configErr("DoTx: nil function")
	}
	if reflect.ValueOf(&tx).Elem().IsZero() {
		return Outcome{}, finish, configErr("DoTx: nil transaction (use Do to run in a transaction of the store's)")
	}
	start := c.metrics.start()
	defer func() { c.metrics.claimDone(ctx, start, out.Kind, err) }()
	t, p, err := c.prepare(r)
	if err != nil {
		return Outcome{}, finish, err
	}
	ref, opID := t.ref, t.opID
	if out, ok := c.localReplay(ctx, &t, p); ok {
		return out, finish, nil
	}
	sent := time.Now()
	f := c.redisClaim(ctx, &t, p)
	if f.final {
		out, err = c.fastOutcome(ctx, opID, f)
		return out, finish, err
	}
	if f.peek {
		// Only the store can tell whether the operation is finished (a
		// tentative lease, a finished marker): ask it through tx, whose
		// connection the caller holds already, rather than take another
		// from the pool. Redis holds no lease of ours.
		f = fast{}
	}
	c.hint(&p, f)
	// tx stays open after DoTx answers: a claim that does not acquire must
	// leave no lock on the record there, or its holder could not finish it
	// until the caller's transaction ends.
	p.NoLockUnlessAcquired = true
	defer func() {
		if v := recover(); v != nil {
			c.dropRedisLease(ctx, f, &t, p)
			panic(v)
		}
	}()
	claimed, err := c.store.Claim(ctx, tx, p)
	if err != nil {
		c.dropRedisLease(ctx, f, &t, p)
		return Outcome{OperationID: opID}, finish, c.claimErr(ctx, err)
	}
	c.newKeyGuess.observe(p, claimed)
	if !claimed.Acquired {
		return c.existing(ctx, &t, p, f, claimed.Record, sent, true), finish, nil
	}
	tok := claimed.Token
	if time.Until(sent.Add(p.Lease)) < c.marginFor(p.Lease) {
		c.dropRedisLease(ctx, f, &t, p)
		return Outcome{OperationID: opID}, finish, ErrLeaseExpired
	}
	c.confirmAsync(ctx, &t, f, tok)
	var (
		state  durable.State
		result durable.Result
		rej    *rejectError
	)
	result, fnErr := fn(ctx, tx, Op{ID: opID, Token: tok})
	switch {
	case fnErr == nil:
		state = durable.Completed
		err = c.store.Complete(ctx, tx, ref, tok, result)
	case errors.As(fnErr, &rej):
		state, result = durable.Failed, rej.Result
		err = c.store.Fail(ctx, tx, ref, tok, result)
	default:
		c.dropRedisLease(ctx, f, &t, p)
		return Outcome{OperationID: opID}, finish, fnErr
	}
	if err != nil {
		c.dropRedisLease(ctx, f, &t, p)
		return Outcome{OperationID: opID}, finish, wrap("complete", err)
	}
	var once bool
	finish = func(ctx context.Context, commitErr error) {
		if once {
			return
		}
		once = true
		if commitErr != nil {
			c.dropRedisLease(ctx, f, &t, p)
			return
		}
		c.acquired(ctx, &t, p, f, claimed, true)
		c.cacheResult(ctx, ref, t.keys, tok, p.Fingerprint, state, result, p.Retention, sent)
	}
	res := result
	return Outcome{Kind: Executed, OperationID: opID, State: state, Result: &res}, finish, nil
}
