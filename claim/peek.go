package claim

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
)

// A duplicate is told the truth (issue 43): a finished operation replays,
// never "in progress", whether or not Redis holds its result. Redis does not
// answer "in progress" alone (but for a confirmed lease younger than the
// lua.Options.TrustLease opt-in). Its answers that leave the truth to the
// durable store, which peek reads without claiming anything:
//
//   - a confirmed lease: the store granted it, but a Redis failover or split
//     brain may have kept it and lost the holder's completion;
//   - a tentative lease: another request took the key in Redis and has not
//     heard from the store yet. It may be about to execute, or about to find
//     the operation finished (Redis lost its copy) and replay it;
//   - a finished marker: the result was too large for Redis.
//
// Concurrent duplicates of one key in this process share one read (reads),
// so a burst of retries costs the store one read, not one per retry.

// peek answers a claim that Redis sent to the durable store (f.peek) by
// reading the record, sent at since: done with the outcome, or not done
// when the record must be claimed after all (a finished marker whose
// record is gone or past its retention), in which case the claim goes on
// as if Redis had not answered.
func (c *Claimer[TTx]) peek(ctx context.Context, t *target, p storeapi.ClaimParams, f fast, since time.Time) (out Outcome, done bool, err error) {
	rec, read, err := c.reads.read(ctx, t.digest, since, func(ctx context.Context) (durable.Record, error) {
		return c.store.Get(ctx, t.ref)
	})
	notFound := errors.Is(err, durable.ErrNotFound)
	if c.tracing.on() {
		c.tracing.note(ctx, attrPeek.String(peekWord(rec, err)))
	}
	switch {
	case notFound && f.marker:
		return Outcome{}, false, nil
	case notFound:
		// The tentative holder's claim has not reached the store, or its
		// transaction has not committed: the operation is in progress.
		return Outcome{Kind: InProgress, OperationID: t.opID, RetryAfter: retryAfter(f.retry)}, true, nil
	case err != nil:
		return Outcome{OperationID: t.opID}, true, c.claimErr(ctx, err)
	case replayable(rec):
		if rec.Fingerprint != p.Fingerprint {
			return Outcome{OperationID: t.opID}, true, c.claimErr(ctx, durable.ErrMismatch)
		}
		c.metrics.replay(ctx, false)
		if !f.marker {
			// Redis lost the result: put it back (or the marker), which
			// also replaces the tentative lease, so the next retries
			// replay without asking the store.
			c.refill(ctx, fast{}, t, p, &rec, read)
		}
		c.keepLocal(t, rec.Fingerprint, rec.State, *rec.Result, read.Add(rec.ExpiresIn))
		res := *rec.Result
		return Outcome{Kind: Replayed, OperationID: t.opID, State: rec.State, Result: &res}, true, nil
	case f.marker:
		// The marker outlived its record's retention (clocks disagree) or
		// the record started again: claim it.
		return Outcome{}, false, nil
	case rec.Fingerprint != p.Fingerprint && !rec.Released && rec.ExpiresIn > 0:
		return Outcome{OperationID: t.opID}, true, c.claimErr(ctx, durable.ErrMismatch)
	case rec.State == durable.Uncertain:
		return Outcome{Kind: Uncertain, OperationID: t.opID, RetryAfter: retryAfter(rec.LeaseRemaining)}, true, nil
	}
	// Processing: held, or about to be taken over or restarted by the
	// tentative holder.
	retry := f.retry
	if rec.LeaseRemaining > 0 {
		retry = rec.LeaseRemaining
	}
	return Outcome{Kind: InProgress, OperationID: t.opID, RetryAfter: retryAfter(retry)}, true, nil
}

// peekWord names what peek read, for its span.
func peekWord(rec durable.Record, err error) string {
	switch {
	case errors.Is(err, durable.ErrNotFound):
		return "absent"
	case err != nil:
		return errWord(err)
	}
	return string(rec.State)
}

// readGroup shares one durable read of a record among the concurrent
// duplicates that need it. A caller joins only a read sent no earlier than
// its own request (since): an older read might have missed a commit that
// happened before the caller asked, and its answer would be stale for it.
type readGroup struct {
	mu sync.Mutex
	m  map[[32]byte]*sharedRead
}

type sharedRead struct {
	sent time.Time
	done chan struct{}
	rec  durable.Record
	err  error
}

// read returns the record read by get, or by a read of the same digest
// sent at or after since, and when that read was sent.
func (g *readGroup) read(ctx context.Context, d [32]byte, since time.Time, get func(context.Context) (durable.Record, error)) (durable.Record, time.Time, error) {
	g.mu.Lock()
	if r, ok := g.m[d]; ok && !r.sent.Before(since) {
		g.mu.Unlock()
		select {
		case <-r.done:
		case <-ctx.Done():
			return durable.Record{}, time.Time{}, wrap("claim", ctx.Err())
		}
		if !isContextErr(r.err) && r.err != errReadAbandoned {
			return r.rec, r.sent, r.err
		}
		// The read was cut short by its sender's context, not ours: read
		// on our own.
		rec, err := get(ctx)
		return rec, since, err
	}
	// err until get returns: a panic in get must not hand the joiners a
	// zero record as if it were read.
	r := &sharedRead{sent: time.Now(), done: make(chan struct{}), err: errReadAbandoned}
	if g.m == nil {
		g.m = map[[32]byte]*sharedRead{}
	}
	g.m[d] = r
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		if g.m[d] == r {
			delete(g.m, d)
		}
		g.mu.Unlock()
		close(r.done)
	}()
	r.rec, r.err = get(ctx)
	return r.rec, r.sent, r.err
}

var errReadAbandoned = errors.New("claim: the shared read of the record did not finish")

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
