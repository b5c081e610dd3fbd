package claim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/internal/logkeys"
)

// checkEviction reads Redis's maxmemory-policy the first time it is called,
// bounded by the per-call Redis timeout but not by ctx's cancellation, and
// logs and counts any policy but noeviction.
func (c *Claimer[TTx]) checkEviction(ctx context.Context) {
	if c.evictionChecked.Load() || !c.evictionChecked.CompareAndSwap(false, true) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.redisTimeout)
	policy, err := c.scripts.EvictionPolicy(ctx)
	cancel()
	switch {
	case err != nil:
		c.log.Warn("oncekey: could not read redis maxmemory-policy", logkeys.Err, err)
	case policy != "" && policy != fastpath.NoEviction:
		c.metrics.evictionPolicy(policy)
		c.log.Warn("oncekey: redis maxmemory-policy is not noeviction; evictions degrade the fast path (the database still arbitrates)", logkeys.Policy, policy)
	}
}

// fast is the outcome of the Redis step of a claim (the fast path).
type fast struct {
	// answered: Redis ran claim.lua and its reply was read.
	answered bool
	// proposed, when answered and not final: the generation Redis proposed
	// for the durable claim; our owner holds the Redis lease.
	proposed uint64
	// final: Redis settled the claim and the durable store is not asked;
	// the claim's outcome is kind (Replayed, with state and result;
	// InProgress, with retry) or err (a mismatch).
	final  bool
	kind   Kind
	result *durable.Result
	state  durable.State
	retry  time.Duration
	err    error
	// ambiguous: claim.lua failed after it may have run (a lost reply, a
	// timeout, a corrupt reply), so our owner may hold a Redis lease that
	// nothing confirmed. Once the durable store answered, Redis is made to
	// agree with it: synced to the durable token, or the lease released.
	ambiguous bool
	// peek: Redis sent the claim to the durable store's record without
	// taking a lease (peek.go): another owner's tentative lease for this
	// request (retry is its length), or, with marker, a finished marker.
	peek, marker bool
}

// mayHoldRedisLease reports whether this claim's owner holds, or may hold,
// a Redis lease.
func (f fast) mayHoldRedisLease() bool { return (f.answered && f.proposed != 0) || f.ambiguous }

// redisClaim runs claim.lua. Any Redis failure degrades to the durable
// store alone.
func (c *Claimer[TTx]) redisClaim(ctx context.Context, t *target, p storeapi.ClaimParams) fast {
	if c.scripts == nil {
		return fast{}
	}
	ctx, span := c.tracing.start(ctx, spanRedisClaim)
	defer span.End()
	asked := time.Now()
	rep, err := c.scripts.ClaimKeys(ctx, t.keys, fastpath.ClaimArgs{Fingerprint: p.Fingerprint, Owner: p.Owner, Lease: p.Lease, WithTTL: c.local != nil})
	if span.IsRecording() {
		span.SetAttributes(attrRedisResult.String(redisResult(rep.Status, err)))
	}
	if err != nil {
		c.metrics.fallback(ctx)
		c.debug("oncekey: redis claim failed; using the durable store alone", t.ref, err)
		// An open breaker or a bad argument sent nothing; any other error
		// may come after the script ran and took a lease for our owner.
		return fast{ambiguous: !errors.Is(err, fastpath.ErrBreakerOpen) && !errors.Is(err, fastpath.ErrInvalidArgument)}
	}
	// Redis answers: the first answer is when its eviction policy is read.
	c.checkEviction(ctx)
	switch rep.Status {
	case fastpath.ClaimAcquired:
		return fast{answered: true, proposed: rep.Generation}
	case fastpath.ClaimCached:
		// Redis's copy lives no longer than the record (see cacheTTL); its
		// TTL was measured after asked.
		c.keepLocal(t, rep.Cached.Fingerprint, rep.Cached.State, rep.Cached.Result, asked.Add(rep.Cached.TTL))
		// rep.Cached is this reply's own: the outcome can point into it.
		return fast{answered: true, final: true, kind: Replayed, result: &rep.Cached.Result, state: rep.Cached.State}
	case fastpath.ClaimMismatch:
		return fast{answered: true, final: true, err: fmt.Errorf("claim: %w (cached result)", ErrMismatch)}
	case fastpath.ClaimFinished:
		return fast{answered: true, peek: true, marker: true}
	case fastpath.ClaimBusy:
		if !rep.SameRequest {
			// A lease for another payload: a mismatch, or a lease left by a
			// request that never reached the durable store. Only the store
			// can tell; ask it, proposing no generation.
			return fast{}
		}
		if rep.Tentative || rep.Age >= c.trustLease {
			// A tentative holder may only be about to replay; a confirmed
			// lease may have outlived its completion in Redis (a failover
			// or split brain that kept the lease and lost the result): the
			// store knows. Only a lease younger than lua.Options.TrustLease
			// (an opt-in, zero by default) answers alone.
			return fast{answered: true, peek: true, retry: rep.Lease}
		}
		return fast{answered: true, final: true, kind: InProgress, retry: rep.Lease}
	}
	return fast{}
}

// dropRedisLease gives back a Redis lease that the durable store did not
// confirm, so it blocks no one. It wakes no waiter (DropKeys): when the
// store refused the claim, the key's holder is another, and the waiters
// would only take turns finding that out; when the work failed before its
// effect, they find the key free at their next poll. release.lua matches the owner only, so a
// lease whose generation we never learned (a lost reply) is dropped too.
func (c *Claimer[TTx]) dropRedisLease(ctx context.Context, f fast, t *target, p storeapi.ClaimParams) {
	if !f.mayHoldRedisLease() {
		return
	}
	tok := fence.Token{Generation: f.proposed, Owner: p.Owner}
	_, err := c.scripts.DropKeys(context.WithoutCancel(ctx), t.keys, tok)
	c.tracing.event(ctx, eventRedisRelease, err)
	if err != nil {
		c.debug("oncekey: redis release failed", t.ref, err)
	}
}

// refill caches a finished record in Redis (which had lost it) for no longer
// than the record's remaining retention, and drops our Redis lease if we
// took one. read is when the statement that read rec was sent, or earlier
// (the claims pass the time their claim was sent, before Redis was asked):
// rec.ExpiresIn was measured by the database after it, so ExpiresIn minus
// the time since read, on the monotonic clock, is no more than what is
// left of the record however slow the round trips were (see cacheTTL).
func (c *Claimer[TTx]) refill(ctx context.Context, f fast, t *target, p storeapi.ClaimParams, rec *durable.Record, read time.Time) {
	if c.scripts == nil {
		return
	}
	ttl := c.cacheTTL(rec.ExpiresIn, read)
	if ttl <= 0 {
		c.dropRedisLease(ctx, f, t, p)
		return
	}
	// The cached copy carries the record's durable generation; with our
	// owner, complete.lua also drops the Redis lease we took, if any.
	tok := fence.Token{Generation: rec.Token.Generation}
	if f.mayHoldRedisLease() {
		tok.Owner = p.Owner
	}
	_, err := c.scripts.CompleteKeys(context.WithoutCancel(ctx), t.keys, tok, rec.Fingerprint, rec.State, *rec.Result, ttl)
	c.tracing.event(ctx, eventRedisCache, err)
	if err != nil {
		c.debug("oncekey: redis refill failed", t.ref, err)
	}
}

// cacheTTL returns how long Redis may keep a copy of a record that had
// remaining lifetime left when measured by the database, no earlier than
// from. Redis applies a TTL when the script runs, which is after it is sent:
// the per-call timeout bounds that delay for a call that succeeds, so it is
// taken off too. (A call that times out may still run on a server that
// stalled past the timeout; that copy could outlive the record by the
// stall. Nothing the client sends can bound it.)
func (c *Claimer[TTx]) cacheTTL(remaining time.Duration, from time.Time) time.Duration {
	return remaining - time.Since(from) - c.redisTimeout
}

// cacheResult publishes a committed result to Redis, for no longer than the
// record's retention measured from when the claim was sent (which is before
// the database set expires_at, so the cache never outlives the record; a
// finish that moves expires_at later only makes this more conservative).
func (c *Claimer[TTx]) cacheResult(ctx context.Context, ref durable.Ref, keys fastpath.Keys, tok fence.Token, fp string, state durable.State, res durable.Result, retention time.Duration, sent time.Time) {
	c.cache(ctx, ref, keys, tok, fp, state, res, retention, sent, false)
}

// maxBehind bounds the Redis completions of Do that run after the caller
// has its answer (cacheBehind); past it they run on the caller's path.
const maxBehind = 256

// cacheBehind is cacheResult for a Do whose commit was acknowledged: the
// replay cache in process is filled at once, and the Redis completion is
// sent off the caller's path, at most maxBehind at a time (beyond that, on
// the caller's path: nothing is dropped). Until it lands, Redis still holds
// the caller's lease, and a duplicate that meets a lease reads the record
// and replays (fastClaim): the answer stays true. Not under
// lua.Options.TrustLease, where a young confirmed lease answers "in
// progress" alone: there the completion stays on the caller's path. Each
// call is bounded by the scripts' Timeout; nothing waits for them at
// shutdown.
func (c *Claimer[TTx]) cacheBehind(ctx context.Context, ref durable.Ref, keys fastpath.Keys, tok fence.Token, fp string, state durable.State, res durable.Result, retention time.Duration, sent time.Time) {
	c.cache(ctx, ref, keys, tok, fp, state, res, retention, sent, c.trustLease == 0)
}

// cache is cacheResult and cacheBehind: behind sends the Redis completion
// off the caller's path when fewer than maxBehind are already.
func (c *Claimer[TTx]) cache(ctx context.Context, ref durable.Ref, keys fastpath.Keys, tok fence.Token, fp string, state durable.State, res durable.Result, retention time.Duration, sent time.Time, behind bool) {
	if c.local != nil {
		c.local.Put(ref.Digest(), fp, state, res, sent.Add(retention), time.Now())
	}
	if c.scripts == nil {
		return
	}
	if behind {
		select {
		case c.behind <- struct{}{}:
			ctx = context.WithoutCancel(ctx)
			go func() {
				defer func() { <-c.behind }()
				c.cacheRedis(ctx, ref, keys, tok, fp, state, res, retention, sent)
			}()
			return
		default:
		}
	}
	c.cacheRedis(ctx, ref, keys, tok, fp, state, res, retention, sent)
}

// cacheRedis is cacheResult's Redis part.
func (c *Claimer[TTx]) cacheRedis(ctx context.Context, ref durable.Ref, keys fastpath.Keys, tok fence.Token, fp string, state durable.State, res durable.Result, retention time.Duration, sent time.Time) {
	ttl := c.cacheTTL(retention, sent)
	if ttl <= 0 {
		if _, err := c.scripts.ReleaseKeys(context.WithoutCancel(ctx), keys, tok); err != nil {
			c.debug("oncekey: redis release failed", ref, err)
		}
		return
	}
	ctx = context.WithoutCancel(ctx)
	_, err := c.scripts.CompleteKeys(ctx, keys, tok, fp, state, res, ttl)
	c.tracing.event(ctx, eventRedisCache, err)
	if err != nil {
		// The result is durable, but a Redis lease left behind would answer
		// duplicates "in progress" until it expires: try once more to drop it.
		c.debug("oncekey: redis complete failed; the result is durable and replays from the store", ref, err)
		if _, err := c.scripts.ReleaseKeys(ctx, keys, tok); err != nil {
			c.debug("oncekey: redis release after a failed complete failed too; duplicates see in-progress until the Redis lease expires", ref, err)
		}
	}
}

// debug logs a failed Redis step of the operation ref at debug level,
// building the line's arguments only when that level is on.
func (c *Claimer[TTx]) debug(msg string, ref durable.Ref, err error) {
	if c.log.Enabled(context.Background(), slog.LevelDebug) {
		c.log.Debug(msg, logkeys.Op, ref, logkeys.Err, err)
	}
}

// redisResult names how claim.lua answered, or why it did not.
func redisResult(s fastpath.ClaimStatus, err error) string {
	switch {
	case errors.Is(err, fastpath.ErrBreakerOpen):
		return "breaker_open"
	case err != nil:
		return "error"
	case s == fastpath.ClaimAcquired:
		return "acquired"
	case s == fastpath.ClaimCached:
		return "cached"
	case s == fastpath.ClaimMismatch:
		return "mismatch"
	case s == fastpath.ClaimBusy:
		return "busy"
	case s == fastpath.ClaimFinished:
		return "finished"
	}
	return "unknown"
}

// localReplay answers r from the replay cache in process when it holds the
// finished result of t for p's fingerprint.
func (c *Claimer[TTx]) localReplay(ctx context.Context, t *target, p storeapi.ClaimParams) (Outcome, bool) {
	if c.local == nil {
		return Outcome{}, false
	}
	state, res, ok := c.local.Get(t.digest, p.Fingerprint, time.Now())
	if !ok {
		return Outcome{}, false
	}
	c.metrics.replayLocal(ctx)
	return Outcome{Kind: Replayed, OperationID: t.opID, State: state, Result: &res, FromCache: true, local: true}, true
}

// keepLocal keeps the finished result of t in the replay cache in process
// until deadline, which must be no later than the record's expiry on this
// process's monotonic clock: the time the statement or script that
// reported the remaining retention was sent, plus that retention.
func (c *Claimer[TTx]) keepLocal(t *target, fp string, state durable.State, res durable.Result, deadline time.Time) {
	if c.local != nil {
		c.local.Put(t.digest, fp, state, res, deadline, time.Now())
	}
}

// confirmAsync confirms our tentative Redis lease once the durable store
// granted the key inside a transaction whose work runs next (Do, DoTx), so
// duplicates arriving during the work are answered "in progress" by Redis
// alone. It is sent off the caller's path: the work does not wait for it,
// and it is harmless in any order with the completion that follows
// (syncgen.lua rewrites only a lease our owner still holds, and never
// brings one back). Until it lands, duplicates read the store (peek).
func (c *Claimer[TTx]) confirmAsync(ctx context.Context, t *target, f fast, tok fence.Token) {
	if c.scripts == nil || !f.mayHoldRedisLease() {
		return
	}
	ctx = context.WithoutCancel(ctx)
	keys, ref := t.keys, t.ref
	go func() {
		if err := c.scripts.SyncGenKeys(ctx, keys, tok); err != nil {
			c.debug("oncekey: redis lease confirmation failed; duplicates read the durable store until the work ends", ref, err)
		}
	}()
}
