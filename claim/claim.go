package claim

import (
	"context"
	"errors"
	"time"

	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/internal/logkeys"
)

// Kind is the kind of an [Outcome].
type Kind int

const (
	// Acquired: this caller holds the key; run the work under Outcome.Lease.
	Acquired Kind = iota + 1
	// Executed: [Claimer.Do] ran the function and committed its result.
	Executed
	// Replayed: the operation finished before; Outcome.Result is its stored
	// result (Outcome.State says completed or failed). Nothing ran.
	Replayed
	// InProgress: another request of the same operation holds the key.
	// Retry after Outcome.RetryAfter, or poll Outcome.OperationID.
	InProgress
	// Uncertain: the outcome of the first request is unknown and being
	// reconciled. Nothing ran; poll Outcome.OperationID.
	Uncertain
)

func (k Kind) String() string {
	switch k {
	case Acquired:
		return "acquired"
	case Executed:
		return "executed"
	case Replayed:
		return "replayed"
	case InProgress:
		return "in_progress"
	case Uncertain:
		return "uncertain"
	}
	return "unknown"
}

// Outcome is what a claim came to.
type Outcome struct {
	Kind Kind
	// OperationID is the stable identity of the logical operation (the
	// same for every retry and takeover), to pass downstream as that
	// system's idempotency key and to poll.
	OperationID string
	// Lease is set when Kind is Acquired.
	Lease *Lease
	// State and Result are set when Kind is Executed or Replayed.
	State  durable.State
	Result *durable.Result
	// RetryAfter hints when to retry an InProgress outcome, at least 1s:
	// the holder's remaining lease when the durable store answered, its
	// lease length (an upper bound) when Redis did.
	RetryAfter time.Duration
	// FromCache reports a replay answered without touching the durable
	// store: by Redis, or by the replay cache in process
	// ([WithReplayCache]).
	FromCache bool
	// local: the replay cache in process answered (FromCache is set too).
	local bool
}

func retryAfter(d time.Duration) time.Duration {
	if d < time.Second {
		return time.Second
	}
	return d
}

// Claim claims the request's key. It returns:
//
//   - Acquired with a [Lease]: this caller runs the work, then completes,
//     fails, releases or marks the lease uncertain. The lease is already
//     durable; a crash leaves a processing record that a retry takes over
//     once the lease expires.
//   - Replayed with the stored result of a finished operation.
//   - InProgress with a retry-after hint (after waiting, [WithWait]).
//   - Uncertain for an operation whose outcome is being reconciled.
//
// Errors: [ErrMismatch], [ErrInvalidScope] and [ErrInvalidLease] (nothing
// reserved), [ErrUnavailable] (the durable store is down: fail closed, do
// not run the work), [ErrLeaseExpired]. ctx bounds the round trips and any
// wait; the lease is governed by its duration.
func (c *Claimer[TTx]) Claim(ctx context.Context, r Request) (Outcome, error) {
	start := c.metrics.start()
	ctx, span := c.startClaim(ctx, "claim", r)
	out, err := c.withPolicy(ctx, r, c.claimOnce)
	c.metrics.claimDone(ctx, start, out.Kind, err)
	endClaim(span, out, err)
	return out, err
}

// withPolicy runs one claim attempt and, configured [WithWait], repeats it
// while the operation is in progress. A waiting duplicate is woken when
// the holder finishes: it watches the key's wake channel in Redis
// (complete.lua and release.lua publish there, from any process), then
// answers at once from Redis's copy of the result or, for a result too
// large to cache, from one read shared by the waiters of this process. It
// still polls, slowly, in case a wake is lost; without Redis it polls
// faster. A Do holder's duplicates need no wake without Redis: their claim
// waits on the holder's row until it commits.
func (c *Claimer[TTx]) withPolicy(ctx context.Context, r Request, once func(context.Context, Request) (Outcome, error)) (Outcome, error) {
	out, err := once(ctx, r)
	if err != nil || out.Kind != InProgress || c.cfg.wait == 0 {
		return out, err
	}
	deadline := time.Now().Add(c.cfg.wait)
	backoff, most := 5*time.Millisecond, 100*time.Millisecond
	var wake <-chan struct{}
	if w := c.watch(ctx, r, deadline); w != nil {
		defer w.Close()
		wake = w.C
		backoff, most = 100*time.Millisecond, time.Second
		// The holder may have finished before the watch began: look once
		// more now that any later finish wakes us.
		if out, err = once(ctx, r); err != nil || out.Kind != InProgress {
			return out, err
		}
	}
	for out.Kind == InProgress {
		wait := min(backoff, time.Until(deadline))
		if wait <= 0 {
			return out, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return out, nil
		case <-wake:
			t.Stop()
			c.metrics.woken(ctx)
		case <-t.C:
			backoff = min(backoff*2, most)
		}
		next, err := once(ctx, r)
		if err != nil {
			return next, err
		}
		out = next
	}
	return out, nil
}

// watch subscribes to the wakes of r's key for a waiting duplicate, bounded
// by deadline; nil when Redis cannot (no Redis, its breaker open, a client
// without sharded pub/sub, too many keys watched): the duplicate polls.
func (c *Claimer[TTx]) watch(ctx context.Context, r Request, deadline time.Time) *fastpath.Watch {
	if c.scripts == nil {
		return nil
	}
	t, _, err := c.prepare(r)
	if err != nil {
		return nil
	}
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	w, err := c.scripts.Watch(wctx, t.keys)
	if err != nil {
		c.debug("oncekey: cannot watch the key for its holder's finish; polling", t.ref, err)
		return nil
	}
	return w
}

// claimStart is how a claim or a Do began: r prepared as target and
// params, offered to Redis (its answer fast) at sent.
type claimStart struct {
	target target
	params storeapi.ClaimParams
	fast   fast
	sent   time.Time
}

// beginClaim prepares r and offers it to Redis. done reports that the claim
// is over already (r is invalid, or Redis settled it): out and err are its
// answer.
func (c *Claimer[TTx]) beginClaim(ctx context.Context, r Request) (s claimStart, out Outcome, done bool, err error) {
	s.target, s.params, err = c.prepare(r)
	if err != nil {
		return s, Outcome{}, true, err
	}
	if out, ok := c.localReplay(ctx, &s.target, s.params); ok {
		return s, out, true, nil
	}
	// The lease is measured from here, on the monotonic clock; so is the
	// age of what the durable claim reads (see refill).
	s.sent = time.Now()
	s.fast = c.redisClaim(ctx, &s.target, s.params)
	if c.tracing.on() {
		c.tracing.note(ctx, attrRedis.Bool(s.fast.answered))
	}
	if s.fast.final {
		out, err = c.fastOutcome(ctx, s.target.opID, s.fast)
		return s, out, true, err
	}
	if s.fast.peek {
		if out, done, err = c.peek(ctx, &s.target, s.params, s.fast, s.sent); done {
			return s, out, true, err
		}
		s.fast = fast{}
	}
	return s, Outcome{}, false, nil
}

func (c *Claimer[TTx]) claimOnce(ctx context.Context, r Request) (Outcome, error) {
	s, out, done, err := c.beginClaim(ctx, r)
	if done {
		return out, err
	}
	t, p, f, sent := s.target, s.params, s.fast, s.sent
	c.hint(&p, f)
	res, err := c.durableClaim(ctx, *new(TTx), p)
	if err != nil {
		c.dropRedisLease(ctx, f, &t, p)
		return Outcome{OperationID: t.opID}, c.claimErr(ctx, err)
	}
	if !res.Acquired {
		return c.existing(ctx, &t, p, f, res.Record, sent, false), nil
	}
	c.acquired(ctx, &t, p, f, res, false)
	l := newLease(c, &t, res.Token, p, sent, trace.SpanContextFromContext(ctx))
	if time.Until(l.Deadline()) < l.margin {
		// The claim took so long that too little lease is left to work
		// safely: give the key back rather than start work that could
		// outlive its lease. A takeover continues work another worker
		// started, whose effects may have happened: its lease is ended,
		// the record kept processing, so the next claim of the same
		// request takes it over again (a release would let any request
		// start a new operation on the key).
		if res.Takeover {
			_ = l.expire(context.WithoutCancel(ctx))
			l.releaseRedis(context.WithoutCancel(ctx))
		} else {
			_ = l.Release(context.WithoutCancel(ctx))
		}
		return Outcome{OperationID: t.opID}, ErrLeaseExpired
	}
	return Outcome{Kind: Acquired, OperationID: t.opID, Lease: l}, nil
}

func (c *Claimer[TTx]) claimErr(ctx context.Context, err error) error {
	if errors.Is(err, durable.ErrMismatch) {
		c.metrics.mismatch(ctx)
	}
	return wrap("claim", err)
}

func (c *Claimer[TTx]) fastOutcome(ctx context.Context, opID string, f fast) (Outcome, error) {
	if f.err != nil {
		c.metrics.mismatch(ctx)
		return Outcome{OperationID: opID}, f.err
	}
	o := Outcome{Kind: f.kind, OperationID: opID, State: f.state, Result: f.result, FromCache: f.kind == Replayed}
	if f.kind == InProgress {
		o.RetryAfter = retryAfter(f.retry)
	}
	if f.kind == Replayed {
		c.metrics.replay(ctx, true)
	}
	return o, nil
}

// acquired finishes the Redis side of a durable acquisition: our tentative
// Redis lease is confirmed (no stale result may replace it, and under
// lua.Options.TrustLease it answers duplicates "in progress" alone); when the database's generation differs from Redis's proposal
// (Redis lost data or was bypassed), or when the Redis claim's reply was
// lost so the proposal is unknown, the lease also takes the durable
// generation. completing: complete.lua runs next and replaces the lease,
// so only a generation to sync is sent (complete.lua's staleness rule
// compares durable generations).
func (c *Claimer[TTx]) acquired(ctx context.Context, t *target, p storeapi.ClaimParams, f fast, res storeapi.ClaimResult, completing bool) {
	if c.tracing.on() {
		c.tracing.note(ctx, attrGeneration.Int64(int64(res.Token.Generation)), attrTakeover.Bool(res.Takeover))
	}
	if res.Takeover {
		c.metrics.takeover(ctx)
		c.log.Info("oncekey: took over an expired lease", logkeys.Op, t.ref, logkeys.Generation, res.Token.Generation)
	}
	sync := (f.answered && res.Token.Generation != f.proposed) || f.ambiguous
	if !sync && !completing {
		// Only the confirmation is left: it need not hold the caller up.
		c.confirmAsync(ctx, t, f, res.Token)
	}
	if sync {
		err := c.scripts.SyncGenKeys(context.WithoutCancel(ctx), t.keys, res.Token)
		c.tracing.event(ctx, eventRedisSync, err)
		if err != nil {
			c.debug("oncekey: redis syncgen failed", t.ref, err)
		}
	}
}

// existing classifies a record the durable claim did not take, and refills
// Redis (and the replay cache in process) from it when it is finished. read
// is when the statement that read rec was sent, or earlier. callerTx: rec
// was read in a transaction of the caller's, which may have written it
// itself and may still roll back, so no cache is filled from it.
func (c *Claimer[TTx]) existing(ctx context.Context, t *target, p storeapi.ClaimParams, f fast, rec *durable.Record, read time.Time, callerTx bool) Outcome {
	if rec == nil { // a store bug; fail safe
		c.dropRedisLease(ctx, f, t, p)
		return Outcome{Kind: InProgress, OperationID: t.opID, RetryAfter: time.Second}
	}
	if c.tracing.on() {
		c.tracing.note(ctx, attrGeneration.Int64(int64(rec.Token.Generation)))
	}
	switch {
	case rec.State.Finished() && rec.Result != nil:
		c.metrics.replay(ctx, false)
		if callerTx {
			c.dropRedisLease(ctx, f, t, p)
		} else {
			c.refill(ctx, f, t, p, rec, read)
			c.keepLocal(t, rec.Fingerprint, rec.State, *rec.Result, read.Add(rec.ExpiresIn))
		}
		res := *rec.Result
		return Outcome{Kind: Replayed, OperationID: t.opID, State: rec.State, Result: &res}
	case rec.State == durable.Uncertain:
		c.dropRedisLease(ctx, f, t, p)
		return Outcome{Kind: Uncertain, OperationID: t.opID, RetryAfter: retryAfter(rec.LeaseRemaining)}
	default:
		c.dropRedisLease(ctx, f, t, p)
		return Outcome{Kind: InProgress, OperationID: t.opID, RetryAfter: retryAfter(rec.LeaseRemaining)}
	}
}

// durableClaim runs the store's claim as a child span of the claim.
func (c *Claimer[TTx]) durableClaim(ctx context.Context, tx TTx, p storeapi.ClaimParams) (storeapi.ClaimResult, error) {
	ctx, span := c.tracing.start(ctx, spanDurableClaim)
	res, err := c.store.Claim(ctx, tx, p)
	if err == nil {
		c.newKeyGuess.observe(p, res)
	}
	if span.IsRecording() {
		switch {
		case err != nil:
			span.SetAttributes(attrDurable.String(errWord(err)))
			span.SetStatus(otelcodes.Error, errWord(err))
		case res.Acquired:
			span.SetAttributes(attrDurable.String("acquired"))
		default:
			span.SetAttributes(attrDurable.String("existing"))
		}
	}
	span.End()
	return res, err
}
