package claim

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekey/oncekey/driver/storeapi"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/internal/adapter"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/lua"
)

// Defaults of a [Claimer], as its options document them.
const (
	defaultLease     = 30 * time.Second
	defaultRetention = 24 * time.Hour
)

// minLease is the shortest lease the lease rule accepts (see
// [ErrInvalidLease]). [Lease.KeepAlive] renews every third of the lease,
// each renewal due a third after the previous one was sent, and cancels the
// work when only the start margin (by default a tenth of the lease) is left.
// So a renewal has from a third of the lease to nine tenths of it, 0.57 of
// the lease, to reach the database, commit and come back: 57ms at 100ms.
// That covers a commit round trip (a few milliseconds with its fsync) and a
// scheduling stall or GC pause of tens of milliseconds; a shorter lease is
// lost to the first slow fsync or stall, and the work is cancelled, or
// taken over, with nothing wrong but the clock. A claim, too, must come back
// with more than the margin left (10ms at 100ms), or it is given back.
const minLease = 100 * time.Millisecond

// Option configures a [Claimer]. An option given a bad value makes [New]
// fail with an error that matches [ErrConfig] and names the option.
type Option func(*config) error

// configErr returns an error matching [ErrConfig] that says what is wrong.
func configErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)
}

type config struct {
	redis       redis.Scripter
	luaOpts     lua.Options
	lease       time.Duration
	retention   time.Duration
	perOp       map[string]time.Duration
	wait        time.Duration // WithWait: how long a duplicate waits; 0: it does not
	poll        bool          // WithPoll
	margin      time.Duration
	marginSet   bool
	meter       metric.MeterProvider
	tracer      trace.TracerProvider
	logger      *slog.Logger
	statsMaxAge time.Duration
	sweepBatch  int
	atCommit    bool // WithWriteAtCommit
}

// WithRedis puts Redis in front of the durable store, through the scripts of
// package lua configured by opts. Without it the Claimer runs on the durable
// store alone, with the same guarantees. c may be any go-redis client
// (standalone, Sentinel, Cluster); when it is a [redis.UniversalClient], the
// Claimer reads its maxmemory-policy once, after Redis first answers a
// claim, and logs a warning and sets the oncekey.redis.eviction gauge for any policy
// but noeviction. [New] makes no Redis call.
//
// When Redis fails opts.BreakerFailures times in a row, the breaker opens
// and claims go to the durable store alone until a probe after the
// cool-down succeeds. The Claimer logs the opening and the closing as
// warnings, at most one line of each kind per 10s (the next line says how
// many changes it did not log), and counts every opening in
// oncekey.redis.breaker.opens; a single failed Redis step is logged at
// debug level only.
//
// go-redis logs on its own (its connection pool's dial failures, for one)
// to stderr, through a logger global to the process, which the Claimer
// leaves alone: a library must not replace a process-wide setting its
// application may have chosen. To route those lines to your logger, call
// redis.SetLogger once in main with a value whose method is
// Printf(ctx context.Context, format string, v ...any), for example one
// that calls logger.WarnContext(ctx, fmt.Sprintf(format, v...)). Redis
// never sees a raw key (key names hold a hash), so neither do those lines.
func WithRedis(c redis.Scripter, opts lua.Options) Option {
	return func(cfg *config) error {
		if c == nil {
			return configErr("WithRedis: nil client")
		}
		cfg.redis, cfg.luaOpts = c, opts
		return nil
	}
}

// WithLease sets the default lease of a claim. Defaults to 30s; zero keeps
// the default. The lease follows the lease rule of [ErrInvalidLease] (at
// least 100ms, longer than an explicit start margin, not longer than any
// retention); [New] fails otherwise with an error matching ErrInvalidLease.
func WithLease(d time.Duration) Option {
	return func(cfg *config) error {
		if d != 0 {
			cfg.lease = d
		}
		return nil
	}
}

// WithRetention sets how long a record, and so the guarantee, lasts after a
// request is first accepted. After it a retried key is a new operation.
// Defaults to 24h. At least 1ms, and not shorter than the lease ([New]
// fails otherwise).
func WithRetention(d time.Duration) Option {
	return func(cfg *config) error {
		if d < time.Millisecond {
			return configErr("WithRetention: retention must be at least 1ms, got %v", d)
		}
		cfg.retention = d
		return nil
	}
}

// WithOperationRetention overrides the retention for one operation name.
// Like [WithRetention], it must not be shorter than the lease.
func WithOperationRetention(operation string, d time.Duration) Option {
	return func(cfg *config) error {
		if operation == "" || d < time.Millisecond {
			return configErr("WithOperationRetention: needs an operation and at least 1ms, got %q and %v", operation, d)
		}
		if cfg.perOp == nil {
			cfg.perOp = map[string]time.Duration{}
		}
		cfg.perOp[operation] = d
		return nil
	}
}

// WithWait makes a duplicate of a request in progress wait, up to max and
// within the caller's context, for the first request to finish, then replay
// its result; past the bound it is answered [InProgress] as by default.
// max must be positive.
//
// By default (neither WithWait nor [WithPoll]) such a duplicate is answered
// at once with InProgress and a retry-after hint (claimhttp: 409 with
// Retry-After).
func WithWait(max time.Duration) Option {
	return func(cfg *config) error {
		if max <= 0 {
			return configErr("WithWait: the bound must be positive, got %v", max)
		}
		cfg.wait = max
		return nil
	}
}

// WithPoll tells adapters to answer an [InProgress] duplicate with the
// operation identity to poll ([Outcome.OperationID]) rather than a hint to
// retry: claimhttp answers 202 with the Location of the operation resource
// instead of 409. With [WithWait] too, the duplicate waits first.
func WithPoll() Option {
	return func(cfg *config) error {
		cfg.poll = true
		return nil
	}
}

// WithStartMargin sets the least lease that must remain, measured from when
// the claim was sent, for work to start: a claim that comes back with less
// is released (nothing ran yet) and returns [ErrLeaseExpired]. The same
// margin ends the work early: [Lease.KeepAlive] cancels the work when only
// the margin is left of a lease it could not renew.
//
// Defaults to a tenth of the lease of each claim (the Claimer's, or
// [Request.Lease] when set), so it scales with a per-request lease. An
// explicit margin is absolute: it must be shorter than the Claimer's lease
// (else New fails) and than every [Request.Lease] (else that claim fails
// before anything is reserved).
func WithStartMargin(d time.Duration) Option {
	return func(cfg *config) error {
		if d < 0 {
			return configErr("WithStartMargin: margin must not be negative, got %v", d)
		}
		cfg.margin, cfg.marginSet = d, true
		return nil
	}
}

// WithWriteAtCommit makes [Claimer.Do] on PostgreSQL run fn before anything
// claims the key and insert the record, finished, in the round trip of the
// COMMIT. Use it only for fn that is pure writes in its tx (no log line,
// metric or call outside tx that must not repeat).
//
// The trade-off: fn's writes in tx still commit once per key (a duplicate's
// insert waits for the winner's transaction and rolls back with everything
// its fn wrote, then replays), but fn itself runs for duplicates Redis did
// not stop: every duplicate in flight while Redis is down, frozen or
// without it, every retry after Redis lost the key, a request whose payload
// then mismatches, a request for a key another worker's [Lease] holds, and
// every replay of a result too large for Redis to cache. In a storm of
// duplicates the business work is multiplied by them. What it saves is the
// claim's round trip on a fresh key and the row's update at completion (one
// INSERT at COMMIT instead of a claim, then an UPDATE).
//
// Without it (the default) Do claims first: the durable claim is the
// transaction's first statement, so fn runs at most once per record life.
// On a store that cannot write at commit (durable/sqlite) the option has no
// effect.
func WithWriteAtCommit() Option {
	return func(cfg *config) error {
		cfg.atCommit = true
		return nil
	}
}

// WithMeterProvider records metrics (names under "oncekey.") with mp.
// Defaults to no metrics.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(cfg *config) error {
		if mp == nil {
			return configErr("WithMeterProvider: nil MeterProvider")
		}
		cfg.meter = mp
		return nil
	}
}

// WithLogger logs with l. Defaults to discarding logs. Log lines never hold
// a raw key, tenant or body: records are named by their operation identity.
//
// With a logger that writes warnings (or a [WithMeterProvider]), a Claimer
// on PostgreSQL reads the database's settings once, beside its first call
// on any path (Claim, Do, DoTx, Operation, Sweep, the adapters), without
// delaying it, and warns once when the database can lose acknowledged
// commits (see postgres.CheckDurability; also the oncekey.durable.degraded
// gauge) and once when the pool's sessions lack the timeouts
// postgres.ConfigurePool sets. It does not read them again; a read that
// fails is logged and tried again on a claim 30s later.
func WithLogger(l *slog.Logger) Option {
	return func(cfg *config) error {
		if l == nil {
			return configErr("WithLogger: nil logger")
		}
		cfg.logger = l
		return nil
	}
}

// Claimer runs the claim protocol: Redis in front (optional), the durable
// store arbitrating every claim and fencing every completion. It is safe for
// concurrent use.
type Claimer[TTx any] struct {
	store   storeapi.Store[TTx]
	scripts *fastpath.Scripts // nil without Redis
	// atCommit is store when [WithWriteAtCommit] asked for Do's record to
	// be written at commit and the store can (durable/postgres); nil
	// otherwise (Do claims first).
	atCommit storeapi.CommitWriter[TTx]
	// evictionChecked is set once the maxmemory-policy check has run.
	evictionChecked atomic.Bool
	// settings is the state of the store's settings check (checkSettings):
	// settingsUnread, settingsReading or settingsRead; settingsRetry, when
	// not 0, is the UnixNano before which a failed read is not tried again.
	settings      atomic.Int32
	settingsRetry atomic.Int64
	// redisTimeout is the per-call timeout of the scripts: the longest a
	// successful call can take to reach Redis.
	redisTimeout time.Duration
	cfg          config
	log          *slog.Logger
	m            *meters
	tr           tracer
	// breaker logs and counts the Redis breaker's changes; nil without
	// Redis.
	breaker *breakerLog
	// pause replaces the sweep's pause between batches in tests.
	pause func(ctx context.Context, d time.Duration) error
}

// New returns a Claimer over store, a store from durable/postgres or
// durable/sqlite. It checks every option and returns an error naming the bad
// one, which matches [ErrConfig].
func New[TTx any](store durable.Store[TTx], opts ...Option) (*Claimer[TTx], error) {
	if store == nil {
		return nil, configErr("nil store")
	}
	// The claim protocol is internal to this module (see package durable):
	// only its backends implement it.
	proto, ok := store.(storeapi.Store[TTx])
	if !ok {
		return nil, configErr("store %T does not implement the oncekey protocol; stores come from durable/postgres or durable/sqlite", store)
	}
	cfg := config{lease: defaultLease, retention: defaultRetention, statsMaxAge: 10 * time.Second, sweepBatch: defaultSweepBatch}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	// The lease rule (see ErrInvalidLease) for the Claimer's lease, against
	// the default retention and every operation's. A record must outlive
	// the lease of the claim that created it: a retention shorter than the
	// lease would let the record expire, and the key start over as a new
	// operation, while its first worker still runs.
	if err := checkLease("the Claimer's lease (WithLease)", cfg.lease, cfg.explicitMargin(), cfg.retention, ""); err != nil {
		return nil, err
	}
	for op, d := range cfg.perOp {
		if err := checkLease("the Claimer's lease (WithLease)", cfg.lease, cfg.explicitMargin(), d, op); err != nil {
			return nil, err
		}
	}
	c := &Claimer[TTx]{store: proto, cfg: cfg, log: cfg.logger, tr: newTracer(cfg.tracer)}
	if cfg.atCommit {
		c.atCommit, _ = store.(storeapi.CommitWriter[TTx])
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if cfg.redis != nil {
		fo := fastpath.FromLua(cfg.luaOpts)
		c.breaker = &breakerLog{log: c.log, m: func() *meters { return c.m }, now: time.Now}
		fo.OnStateChange = c.breaker.change
		s, err := fastpath.New(cfg.redis, fo)
		if err != nil {
			return nil, configErr("WithRedis: %w", err)
		}
		c.scripts = s
		c.redisTimeout = fo.Timeout
		if c.redisTimeout == 0 {
			c.redisTimeout = fastpath.DefaultTimeout
		}
	}
	m, err := newMeters(c)
	if err != nil {
		return nil, err
	}
	c.m = m
	c.initSettings()
	return c, nil
}

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
		c.log.Warn("oncekey: could not read redis maxmemory-policy", "err", err)
	case policy != "" && policy != fastpath.NoEviction:
		c.m.evictionPolicy(policy)
		c.log.Warn("oncekey: redis maxmemory-policy is not noeviction; evictions degrade the fast path (the database still arbitrates)", "policy", policy)
	}
}

// retentionFor returns the retention of an operation.
func (c *Claimer[TTx]) retentionFor(operation string) time.Duration {
	if d, ok := c.cfg.perOp[operation]; ok {
		return d
	}
	return c.cfg.retention
}

// polls reports whether the Claimer was configured [WithPoll].
func (c *Claimer[TTx]) polls() bool { return c.cfg.poll }

// The adapters of this package (claimhttp) read the retention and the poll
// setting of a Claimer through package adapter, not through its API.
func init() {
	type settings interface {
		retentionFor(operation string) time.Duration
		polls() bool
		checkLease(what, operation string, lease time.Duration) error
	}
	adapter.Retention = func(c any, operation string) time.Duration { return c.(settings).retentionFor(operation) }
	adapter.Polls = func(c any) bool { return c.(settings).polls() }
	adapter.CheckLease = func(c any, what, operation string, lease time.Duration) error {
		return c.(settings).checkLease(what, operation, lease)
	}
	adapter.Rejected = func(err error) (durable.Result, bool) {
		var rej *rejectError
		if errors.As(err, &rej) {
			return rej.Result, true
		}
		return durable.Result{}, false
	}
}

// Request is one request to claim: its scope and its canonical fingerprint
// (see package canon).
type Request struct {
	Scope       durable.Scope
	Fingerprint string
	// Lease overrides the Claimer's lease for this claim when not zero. It
	// follows the lease rule of [ErrInvalidLease] (negative is an error, at
	// least 100ms, longer than an explicit [WithStartMargin], not longer
	// than the operation's retention): a claim with a lease that breaks it
	// fails with ErrInvalidLease before anything is reserved.
	Lease time.Duration
}

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
	// RetryAfter hints when to retry an InProgress outcome: the remaining
	// lease of the holder, at least 1s.
	RetryAfter time.Duration
	// FromCache reports a replay answered by Redis without touching the
	// durable store.
	FromCache bool
}

// marginFor returns the start margin of a claim with the given lease: the
// explicit one, or a tenth of that lease.
func (c *Claimer[TTx]) marginFor(lease time.Duration) time.Duration {
	if c.cfg.marginSet {
		return c.cfg.margin
	}
	return lease / 10
}

// target is the record a request names, with what the steps of the request
// derive from it, computed once (the digest is hashed once): the store's
// reference, the operation identity and the Redis key names.
type target struct {
	ref  durable.Ref
	opID string
	keys fastpath.Keys // zero without Redis
}

// targetOf returns the target of ref.
func (c *Claimer[TTx]) targetOf(ref durable.Ref) target {
	d := ref.Digest()
	t := target{ref: ref, opID: operationID(d)}
	if c.scripts != nil {
		t.keys = c.scripts.KeysAt(d)
	}
	return t
}

// operationID is [durable.Ref.OperationID] of the Ref whose digest is d, in
// one allocation.
func operationID(d [32]byte) string {
	const prefix = "op_"
	var b [len(prefix) + 43]byte
	copy(b[:], prefix)
	base64.RawURLEncoding.Encode(b[len(prefix):], d[:])
	return string(b[:])
}

// newOwner returns a fresh random (version 4) owner identity, as uuid.New
// does, without its allocation.
func newOwner() uuid.UUID {
	var u uuid.UUID
	_, _ = rand.Read(u[:]) // crypto/rand.Read never fails
	u[6] = (u[6] & 0x0f) | 0x40
	u[8] = (u[8] & 0x3f) | 0x80
	return u
}

// prepare validates the request and returns its target. Every claim goes
// through it (Claim, Do, DoTx and the adapters' claims in a transaction),
// so it is also where the store's settings are first checked.
func (c *Claimer[TTx]) prepare(r Request) (target, storeapi.ClaimParams, error) {
	c.checkSettings()
	// The lease rule first: a configuration error of this claim's lease is
	// rejected before anything is reserved, rather than acquired and given
	// back every time.
	lease, err := c.requestLease(r)
	if err != nil {
		return target{}, storeapi.ClaimParams{}, err
	}
	p := storeapi.ClaimParams{
		Scope:       r.Scope,
		Fingerprint: r.Fingerprint,
		Owner:       newOwner(),
		Lease:       lease,
		Retention:   c.retentionFor(r.Scope.Operation),
	}
	if err := p.Validate(); err != nil {
		return target{}, p, invalidArg(err)
	}
	ref, err := c.store.Ref(r.Scope)
	if err != nil {
		return target{}, p, invalidArg(err)
	}
	return c.targetOf(ref), p, nil
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
	ctx, span := c.tr.start(ctx, spanRedisClaim)
	defer span.End()
	rep, err := c.scripts.ClaimKeys(ctx, t.keys, fastpath.ClaimArgs{Fingerprint: p.Fingerprint, Owner: p.Owner, Lease: p.Lease, Retention: p.Retention})
	if span.IsRecording() {
		span.SetAttributes(attrRedisResult.String(redisResult(rep.Status, err)))
	}
	if err != nil {
		c.m.fallback(ctx)
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
		// rep.Cached is this reply's own: the outcome can point into it.
		return fast{answered: true, final: true, kind: Replayed, result: &rep.Cached.Result, state: rep.Cached.State}
	case fastpath.ClaimMismatch:
		return fast{answered: true, final: true, err: fmt.Errorf("%w (cached result)", ErrMismatch)}
	case fastpath.ClaimBusy:
		if !rep.SameRequest {
			// A lease for another payload: a mismatch, or a lease left by a
			// request that never reached the durable store. Only the store
			// can tell; ask it, proposing no generation.
			return fast{}
		}
		return fast{answered: true, final: true, kind: InProgress, retry: rep.PTTL}
	}
	return fast{}
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
	start := c.m.start()
	ctx, span := c.startClaim(ctx, "claim", r)
	out, err := c.withPolicy(ctx, r, c.claimOnce)
	c.m.claimDone(ctx, start, out.Kind, err)
	endClaim(span, out, err)
	return out, err
}

// withPolicy runs one claim attempt and, configured [WithWait], repeats it
// while the operation is in progress.
func (c *Claimer[TTx]) withPolicy(ctx context.Context, r Request, once func(context.Context, Request) (Outcome, error)) (Outcome, error) {
	out, err := once(ctx, r)
	if err != nil || out.Kind != InProgress || c.cfg.wait == 0 {
		return out, err
	}
	deadline := time.Now().Add(c.cfg.wait)
	backoff := 5 * time.Millisecond
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
		case <-t.C:
		}
		backoff = min(backoff*2, 250*time.Millisecond)
		next, err := once(ctx, r)
		if err != nil {
			return next, err
		}
		out = next
	}
	return out, nil
}

func (c *Claimer[TTx]) claimOnce(ctx context.Context, r Request) (Outcome, error) {
	t, p, err := c.prepare(r)
	if err != nil {
		return Outcome{}, err
	}
	// The lease is measured from here, on the monotonic clock; so is the
	// age of what the durable claim reads (see refill).
	sent := time.Now()
	f := c.redisClaim(ctx, &t, p)
	if c.tr.on() {
		c.tr.note(ctx, attrRedis.Bool(f.answered))
	}
	if f.final {
		return c.fastOutcome(ctx, t.opID, f)
	}
	p.Proposed = f.proposed
	res, err := c.durableClaim(ctx, *new(TTx), p)
	if err != nil {
		c.dropRedisLease(ctx, f, &t, p)
		return Outcome{OperationID: t.opID}, c.claimErr(ctx, err)
	}
	if !res.Acquired {
		return c.existing(ctx, &t, p, f, res.Record, sent), nil
	}
	c.acquired(ctx, &t, p, f, res)
	l := newLease(c, &t, res.Token, p, sent, trace.SpanContextFromContext(ctx))
	if time.Until(l.Deadline()) < l.margin {
		// The claim took so long that too little lease is left to work
		// safely: give the key back rather than start work that could
		// outlive its lease.
		_ = l.Release(context.WithoutCancel(ctx))
		return Outcome{OperationID: t.opID}, ErrLeaseExpired
	}
	return Outcome{Kind: Acquired, OperationID: t.opID, Lease: l}, nil
}

func (c *Claimer[TTx]) claimErr(ctx context.Context, err error) error {
	if errors.Is(err, durable.ErrMismatch) {
		c.m.mismatch(ctx)
	}
	return wrap("claim", err)
}

func (c *Claimer[TTx]) fastOutcome(ctx context.Context, opID string, f fast) (Outcome, error) {
	if f.err != nil {
		c.m.mismatch(ctx)
		return Outcome{OperationID: opID}, f.err
	}
	o := Outcome{Kind: f.kind, OperationID: opID, State: f.state, Result: f.result, FromCache: f.kind == Replayed}
	if f.kind == InProgress {
		o.RetryAfter = retryAfter(f.retry)
	}
	if f.kind == Replayed {
		c.m.replay(ctx, true)
	}
	return o, nil
}

// acquired finishes the Redis side of a durable acquisition: when the
// database's generation differs from Redis's proposal (Redis lost data or
// was bypassed), or when the Redis claim's reply was lost so the proposal
// is unknown, Redis is raised to it, and a Redis lease of our owner carries
// the durable generation.
func (c *Claimer[TTx]) acquired(ctx context.Context, t *target, p storeapi.ClaimParams, f fast, res storeapi.ClaimResult) {
	if c.tr.on() {
		c.tr.note(ctx, attrGeneration.Int64(int64(res.Token.Generation)), attrTakeover.Bool(res.Takeover))
	}
	if res.Takeover {
		c.m.takeover(ctx)
		c.log.Info("oncekey: took over an expired lease", "op", t.ref, "generation", res.Token.Generation)
	}
	if (f.answered && res.Token.Generation != f.proposed) || f.ambiguous {
		err := c.scripts.SyncGenKeys(context.WithoutCancel(ctx), t.keys, res.Token, p.Retention)
		c.tr.event(ctx, eventRedisSync, err)
		if err != nil {
			c.debug("oncekey: redis syncgen failed", t.ref, err)
		}
	}
}

// dropRedisLease gives back a Redis lease that the durable store did not
// confirm, so it blocks no one. release.lua matches the owner only, so a
// lease whose generation we never learned (a lost reply) is dropped too.
func (c *Claimer[TTx]) dropRedisLease(ctx context.Context, f fast, t *target, p storeapi.ClaimParams) {
	if !f.mayHoldRedisLease() {
		return
	}
	tok := fence.Token{Generation: f.proposed, Owner: p.Owner}
	_, err := c.scripts.ReleaseKeys(context.WithoutCancel(ctx), t.keys, tok)
	c.tr.event(ctx, eventRedisRelease, err)
	if err != nil {
		c.debug("oncekey: redis release failed", t.ref, err)
	}
}

// existing classifies a record the durable claim did not take, and refills
// Redis from it when Redis lost it. read is when the statement that read rec
// was sent, or earlier.
func (c *Claimer[TTx]) existing(ctx context.Context, t *target, p storeapi.ClaimParams, f fast, rec *durable.Record, read time.Time) Outcome {
	if rec == nil { // a store bug; fail safe
		c.dropRedisLease(ctx, f, t, p)
		return Outcome{Kind: InProgress, OperationID: t.opID, RetryAfter: time.Second}
	}
	if c.tr.on() {
		c.tr.note(ctx, attrGeneration.Int64(int64(rec.Token.Generation)))
	}
	switch {
	case rec.State.Finished() && rec.Result != nil:
		c.m.replay(ctx, false)
		c.refill(ctx, f, t, p, rec, read)
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
	c.tr.event(ctx, eventRedisCache, err)
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
	if c.scripts == nil {
		return
	}
	ttl := c.cacheTTL(retention, sent)
	if ttl <= 0 {
		if _, err := c.scripts.ReleaseKeys(context.WithoutCancel(ctx), keys, tok); err != nil {
			c.debug("oncekey: redis release failed", ref, err)
		}
		return
	}
	ctx = context.WithoutCancel(ctx)
	_, err := c.scripts.CompleteKeys(ctx, keys, tok, fp, state, res, ttl)
	c.tr.event(ctx, eventRedisCache, err)
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
		c.log.Debug(msg, "op", ref, "err", err)
	}
}

// durableClaim runs the store's claim as a child span of the claim.
func (c *Claimer[TTx]) durableClaim(ctx context.Context, tx TTx, p storeapi.ClaimParams) (storeapi.ClaimResult, error) {
	ctx, span := c.tr.start(ctx, spanDurableClaim)
	res, err := c.store.Claim(ctx, tx, p)
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
	}
	return "unknown"
}
