package fastpath

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
	"github.com/oncekey/oncekey/lua"
)

// The scripts, from package lua's embedded sources. A call sends EVALSHA and
// falls back to EVAL on NOSCRIPT (a restarted or failed-over server, or a
// cluster node that never saw the script); see Scripts.send.
var (
	claimScript    = script("claim.lua")
	renewScript    = script("renew.lua")
	completeScript = script("complete.lua")
	releaseScript  = script("release.lua")
	syncgenScript  = script("syncgen.lua")
)

// Source returns the script name of package lua as it is loaded: the
// prelude record.lua, then the script.
func Source(name string) string {
	pre, err := lua.Sources.ReadFile("record.lua")
	if err != nil {
		panic("fastpath: " + err.Error()) // embedded: cannot happen
	}
	b, err := lua.Sources.ReadFile(name)
	if err != nil {
		panic("fastpath: " + err.Error())
	}
	return string(pre) + string(b)
}

// luaScript is one script, with its EVALSHA and EVAL arguments boxed once.
type luaScript struct {
	*redis.Script
	sha, src any
}

func script(name string) *luaScript {
	src := Source(name)
	rs := redis.NewScript(src)
	return &luaScript{Script: rs, sha: rs.Hash(), src: src}
}

// Defaults of [Options], as documented on [lua.Options].
const (
	DefaultTimeout       = 50 * time.Millisecond
	DefaultMaxCachedBody = 64 << 10
	DefaultCacheTTL      = 24 * time.Hour
)

// MaxFingerprintLen is the longest fingerprint accepted, as in the durable
// store.
const MaxFingerprintLen = 256

// Options configure [New]: the user's [lua.Options] (see [FromLua]) and what
// only the project sets (the breaker's clock, a state callback). The zero
// value takes every default.
type Options struct {
	// Prefix starts every key name. Defaults to [DefaultPrefix]. It must
	// not contain '{' or '}', which would change the hash tag.
	Prefix string
	// Timeout bounds each call, Redis's retries included, from when the
	// call is sent: a wait in the gate's queue is not part of it (see
	// [New]). Defaults to [DefaultTimeout].
	Timeout time.Duration
	// MaxCachedBody is the largest body cached in Redis, in bytes.
	// Defaults to [DefaultMaxCachedBody]; negative caches no result at all.
	MaxCachedBody int
	// CacheTTL bounds a cached result's life. Defaults to [DefaultCacheTTL].
	CacheTTL time.Duration
	// Breaker configures the circuit breaker.
	Breaker BreakerOptions
	// TrustLease is lua.Options.TrustLease; the Claimer reads it, the
	// scripts do not. New only checks it is not negative.
	TrustLease time.Duration
	// OnStateChange, when set, is called with the breaker's new state on
	// every change (for a metric or a log line). It runs under the
	// breaker's lock: it must be quick and must not call [Scripts].
	OnStateChange func(BreakerState)
}

// FromLua returns the Options that o, the user's configuration, stands for.
func FromLua(o lua.Options) Options {
	return Options{
		Prefix:        o.Prefix,
		Timeout:       o.Timeout,
		MaxCachedBody: o.MaxCachedBody,
		CacheTTL:      o.CacheTTL,
		Breaker:       BreakerOptions{Failures: o.BreakerFailures, CoolDown: o.BreakerCoolDown},
		TrustLease:    o.TrustLease,
	}
}

// Hooks are settings no user configures: the in-module benchmarks and the
// chaos suite attach them to a client with [WithHooks] before handing it to
// claim.WithRedis, and [New] applies them.
type Hooks struct {
	// Now, when set, is the breaker's clock (see [BreakerOptions.Now]).
	Now func() time.Time
	// OnStateChange, when set, is called on every breaker state change,
	// after [Options.OnStateChange].
	OnStateChange func(BreakerState)
}

// hooked is a client with [Hooks] attached.
type hooked struct {
	redis.Scripter
	hooks Hooks
}

// WithHooks returns c with h attached. The result is a redis.Scripter only;
// [New] takes c back out of it and applies h.
func WithHooks(c redis.Scripter, h Hooks) redis.Scripter { return hooked{c, h} }

// unhook returns the client inside c and opts with c's hooks applied.
func unhook(c redis.Scripter, opts Options) (redis.Scripter, Options) {
	h, ok := c.(hooked)
	if !ok {
		return c, opts
	}
	if h.hooks.Now != nil {
		opts.Breaker.Now = h.hooks.Now
	}
	if extra := h.hooks.OnStateChange; extra != nil {
		if first := opts.OnStateChange; first != nil {
			opts.OnStateChange = func(s BreakerState) { first(s); extra(s) }
		} else {
			opts.OnStateChange = extra
		}
	}
	return h.Scripter, opts
}

// Scripts runs the fast-path scripts on one Redis deployment. It is safe for
// concurrent use.
type Scripts struct {
	c       redis.Scripter
	prefix  string
	timeout time.Duration
	// epoch is when the Scripts were made; lagSeen is when, since epoch,
	// a call's timeout last found this process lagging (0: never);
	// lagCalls counts the timed-out calls not counted for that reason.
	epoch         time.Time
	lagSeen       atomic.Int64
	lagCalls      atomic.Int64
	maxCachedBody int
	cacheTTL      time.Duration
	breaker       *Breaker
	// direct is true when the client ends a call at its context's deadline
	// (ContextTimeoutEnabled); otherwise each call runs on its own
	// goroutine so the wrapper can return at the deadline anyway.
	direct bool
	// gate, for a *redis.Client, bounds the sends in flight and sends the
	// calls that queue behind them in pipelines (see [New]): a call waits
	// there, before its per-call timeout starts, instead of in the pool,
	// where the timeout would run out while it queues. nil for other
	// clients: their calls queue in the pool, on the timeout's time.
	gate *gate
	// proc is c when it is a go-redis client, whose Process takes a
	// command built here in one allocation (see call); nil for any other
	// Scripter, which is called through redis.Script.Run.
	proc interface {
		Process(ctx context.Context, cmd redis.Cmder) error
	}
	// wake holds the subscriptions of Watch.
	wake wakeHub
}

// New returns the scripts running on c, which may be any client kind
// (*redis.Client, *redis.ClusterClient, a Sentinel failover client, a Ring)
// or a wrapper of one. New makes no Redis call. It returns an error
// matching [ErrInvalidArgument] for a nil client or a bad option.
//
// For the per-call timeout to end a stalled read, create the client with
// ContextTimeoutEnabled: true; with a client that ignores context deadlines
// (the go-redis default) each call runs on a goroutine of its own and the
// wrapper returns at the deadline while that goroutine waits out the
// client's ReadTimeout. See package lua's documentation for retry settings.
// Hooks attached to c with [WithHooks] are applied to opts.
//
// Queueing for a connection is not Redis failing, and a call that queues
// need not cost a round trip of its own. With a *redis.Client (a Sentinel
// failover client is one), at most 4 sends are in flight at once (fewer
// when the pool has fewer turns: PoolSize, or MaxActiveConns when lower;
// as many as the pool has turns when the client ignores context
// deadlines, since a send that timed out then holds its connection until
// the client's ReadTimeout), each a call alone or a pipeline; a call that
// finds them all taken queues, and the next send to end takes the queue
// out as one pipeline of up to 128 calls, each still one script run with
// its own reply. A call never queues while a send is free, so calls one at
// a time go out alone.
// A queued call's per-call timeout starts once it is sent. Its wait is
// bounded by ctx and by the client's PoolTimeout, and a call still queued
// when the breaker opens returns [ErrBreakerOpen] without being sent;
// running out of either is not a breaker failure. After a send whose calls
// all failed, the next one carries one call only, until one succeeds: a
// dead Redis is found with as few calls as before pipelines. The pipeline
// carries the context values of its first call (a tracing hook's span),
// not the others'. Commands the application sends on the same client are
// not counted: a call may still wait for a connection they hold, on its
// timeout's time. Cluster and Ring clients, whose pools are per node, and
// other Scripters are not gated: each call is sent alone, and a wait in
// their pools counts as before.
func New(c redis.Scripter, opts Options) (*Scripts, error) {
	c, opts = unhook(c, opts)
	if c == nil {
		return nil, invalid("nil redis client")
	}
	s := &Scripts{
		c:             c,
		prefix:        opts.Prefix,
		timeout:       opts.Timeout,
		maxCachedBody: opts.MaxCachedBody,
		cacheTTL:      opts.CacheTTL,
		direct:        honorsContext(c),
		epoch:         time.Now(),
	}
	switch c := c.(type) {
	case *redis.Client:
		s.proc = c
		o := c.Options() // as the client normalized them: PoolSize and PoolTimeout are set
		n := o.PoolSize
		if o.MaxActiveConns > 0 && o.MaxActiveConns < n {
			n = o.MaxActiveConns
		}
		if n > 0 && o.PoolTimeout > 0 {
			// A client that honors deadlines gets maxSends sends. One
			// that ignores them holds a connection until its ReadTimeout
			// after a call timed out: it keeps every turn of its pool
			// for sends, as without pipelines.
			if s.direct {
				n = min(n, maxSends)
			}
			s.gate = &gate{client: c, limit: n, wait: o.PoolTimeout}
		}
	case *redis.ClusterClient:
		s.proc = c
	case *redis.Ring:
		s.proc = c
	}
	switch {
	case containsBrace(opts.Prefix):
		return nil, invalid("Prefix %q must not contain '{' or '}'", opts.Prefix)
	case opts.Timeout < 0:
		return nil, invalid("Timeout must not be negative")
	case opts.CacheTTL < 0:
		return nil, invalid("CacheTTL must not be negative")
	case opts.Breaker.Failures < 0:
		return nil, invalid("BreakerFailures must not be negative")
	case opts.Breaker.CoolDown < 0:
		return nil, invalid("BreakerCoolDown must not be negative")
	case opts.TrustLease < 0:
		return nil, invalid("TrustLease must not be negative")
	}
	if s.prefix == "" {
		s.prefix = DefaultPrefix
	}
	if s.timeout == 0 {
		s.timeout = DefaultTimeout
	}
	if s.maxCachedBody == 0 {
		s.maxCachedBody = DefaultMaxCachedBody
	}
	if s.cacheTTL == 0 {
		s.cacheTTL = DefaultCacheTTL
	}
	s.breaker = NewBreaker(opts.Breaker, opts.OnStateChange)
	return s, nil
}

func containsBrace(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '{' || s[i] == '}' {
			return true
		}
	}
	return false
}

// honorsContext reports whether c is a go-redis client that ends socket
// reads at the context's deadline.
func honorsContext(c redis.Scripter) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// Keys returns the Redis keys of ref under this Scripts' prefix.
func (s *Scripts) Keys(ref durable.Ref) Keys { return KeysFor(s.prefix, ref) }

// KeysAt returns the Redis keys, under this Scripts' prefix, of the record
// whose [durable.Ref.Digest] is d: a caller that has the digest already
// builds the keys once and passes them to every call of a request (the
// methods ending in Keys).
func (s *Scripts) KeysAt(d [32]byte) Keys { return keysAt(s.prefix, d) }

// Breaker returns the breaker's state.
func (s *Scripts) Breaker() BreakerState { return s.breaker.State() }

// Load loads every script into the script cache of the server (of every
// master, for a cluster client). It is optional: calls fall back to EVAL on
// NOSCRIPT. It is needed before sending scripts in a pipeline, which has no
// such fallback. Load goes through neither the breaker nor the timeout: ctx
// bounds it.
func (s *Scripts) Load(ctx context.Context) error {
	for _, sc := range []*luaScript{claimScript, renewScript, completeScript, releaseScript, syncgenScript} {
		if err := sc.Load(ctx, s.c).Err(); err != nil {
			return fmt.Errorf("%w: load: %w", ErrUnavailable, err)
		}
	}
	return nil
}

// The most arguments of a script command: EVALSHA, the SHA1, the number
// of keys, the record's one key, 5 arguments (complete.lua).
const maxCallArgs = 3 + 1 + 6

// call is one script command, built in one allocation: the arguments of
// EVALSHA as go-redis sends them, every string and integer boxed as a
// pointer into the call itself (go-redis writes and routes *string and
// *int64 as it does string and int64), so that boxing allocates nothing.
// Keys come first, then the script's arguments.
type call struct {
	args  [maxCallArgs]any
	n     int // arguments set, from args[3] on
	nkeys int
	strs  [maxCallArgs - 3]string
	ints  [2]int64
	ni    int
	gen   uint64
	owner uuidText
	// ttl, when set, points at the argument that is a TTL in milliseconds
	// counted from when the call was made (complete.lua's): shortened by
	// the wait in the gate's queue, so that the TTL still runs from then.
	ttl *int64
}

// uuidText is a UUID's canonical text form, which go-redis sends as the
// bytes MarshalBinary returns.
type uuidText [36]byte

func (u *uuidText) MarshalBinary() ([]byte, error) { return u[:], nil }

// newCall returns a call of the given keys.
func newCall(keys ...string) *call {
	c := &call{n: 3, nkeys: len(keys)}
	for _, k := range keys {
		c.str(k)
	}
	return c
}

func (c *call) str(v string) {
	p := &c.strs[c.n-3]
	*p = v
	c.args[c.n] = p
	c.n++
}

// uuid adds id in its canonical text form, or "" for uuid.Nil.
func (c *call) uuid(id uuid.UUID) {
	if id == uuid.Nil {
		c.str("")
		return
	}
	// uuid.UUID.String's layout, written in place.
	const hexDigits = "0123456789abcdef"
	j := 0
	for i, b := range id {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			c.owner[j] = '-'
			j++
		}
		c.owner[j], c.owner[j+1] = hexDigits[b>>4], hexDigits[b&0x0f]
		j += 2
	}
	c.args[c.n] = &c.owner
	c.n++
}

// uint adds a generation.
func (c *call) uint(v uint64) {
	c.gen = v
	c.args[c.n] = &c.gen
	c.n++
}

func (c *call) int(v int64) {
	c.ints[c.ni] = v
	c.args[c.n] = &c.ints[c.ni]
	c.ni++
	c.n++
}

// shorten takes waited off the call's TTL argument, if it has one; a TTL
// under 1ms becomes 0, which caches nothing.
func (c *call) shorten(waited time.Duration) {
	if c.ttl == nil || waited <= 0 {
		return
	}
	if *c.ttl -= msUp(waited); *c.ttl < 1 {
		*c.ttl = 0
	}
}

// keys and values return the keys and arguments as redis.Script.Run takes
// them, by value: a Scripter that is not a go-redis client may read them.
func (c *call) keys() []string { return c.strs[:c.nkeys] }

func (c *call) values() []any {
	vs := make([]any, 0, c.n-3-c.nkeys)
	for _, a := range c.args[3+c.nkeys : c.n] {
		switch a := a.(type) {
		case *string:
			vs = append(vs, *a)
		case *int64:
			vs = append(vs, *a)
		case *uint64:
			vs = append(vs, strconv.FormatUint(*a, 10))
		case *uuidText:
			vs = append(vs, string(a[:]))
		}
	}
	return vs
}

// send runs the script: EVALSHA, then EVAL when the server does not have
// the script (a restarted or failed-over server, or a cluster node that
// never saw it), as redis.Script.Run does.
func (s *Scripts) send(ctx context.Context, sc *luaScript, c *call) (any, error) {
	if s.proc == nil {
		return sc.Run(ctx, s.c, c.keys(), c.values()...).Result()
	}
	cmd := c.evalsha(ctx, sc)
	_ = s.proc.Process(ctx, cmd)
	v, err := cmd.Result()
	if !noScript(err) {
		return v, err
	}
	return s.eval(ctx, sc, c)
}

// evalsha returns the EVALSHA command of c, its arguments c's own.
func (c *call) evalsha(ctx context.Context, sc *luaScript) *redis.Cmd {
	c.args[0], c.args[1], c.args[2] = "evalsha", sc.sha, c.nkeys
	cmd := redis.NewCmd(ctx, c.args[:c.n]...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// eval sends c with EVAL and the script's source, after NOSCRIPT.
func (s *Scripts) eval(ctx context.Context, sc *luaScript, c *call) (any, error) {
	// A fresh slice: the first command may still be read by a hook.
	args := append([]any{"eval", sc.src, c.nkeys}, c.args[3:c.n]...)
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	_ = s.proc.Process(ctx, cmd)
	return cmd.Result()
}

// admit asks the breaker whether a call may go to Redis now (see
// [Breaker.Allow]). A call's arguments are built only once it is admitted,
// and run must follow with the probe flag.
func (s *Scripts) admit() (probe bool, err error) {
	probe, ok := s.breaker.Allow()
	if !ok {
		return false, ErrBreakerOpen
	}
	return probe, nil
}

// run sends one script admitted by the breaker, with the per-call timeout,
// and records its outcome with the breaker. With a gate (see [New]), a
// call that finds every send taken queues and goes out in a pipeline; the
// timeout starts when it is sent.
func (s *Scripts) run(ctx context.Context, probe bool, name string, sc *luaScript, c *call) (any, error) {
	if s.gate != nil && !s.gate.enter() {
		return s.queue(ctx, probe, name, sc, c)
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	deadline, _ := cctx.Deadline()
	var v any
	var err error
	if s.direct {
		v, err = s.send(cctx, sc, c)
		s.record(ctx, probe, deadline, err)
		if s.gate != nil {
			s.leave(err == nil)
		}
	} else {
		v, err = s.detached(cctx, sc, c) // leaves the gate when the client returns
		s.record(ctx, probe, deadline, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, name, err)
	}
	return v, nil
}

// lagged reports whether this process ran too far behind to have read the
// reply of a call whose own timeout ended at deadline: its lag now
// (processLag) is over a quarter of the per-call timeout, or such a lag was
// seen, by another call's timeout, after this call was sent. Calls sent
// together in a burst time out together, while the run queue ahead of them
// drains: the first ones see the lag, the last ones may not any more.
func (s *Scripts) lagged(deadline time.Time) bool {
	sent := deadline.Add(-s.timeout)
	if processLag(deadline) > s.timeout/4 {
		s.lagSeen.Store(int64(time.Since(s.epoch)))
		return true
	}
	seen := s.lagSeen.Load()
	return seen != 0 && seen >= int64(sent.Sub(s.epoch))
}

// processLag returns how far behind this process runs when a call timed out
// at deadline: the longer of how late the timeout was seen and how long a
// goroutine that yields waits to run again (the run queue ahead of it).
// Both are microseconds in a process that keeps up; in a burst of
// thousands of requests on two cores they were tens of milliseconds, while
// Redis had answered (bench -workload storm).
func processLag(deadline time.Time) time.Duration {
	late := time.Since(deadline)
	t0 := time.Now()
	runtime.Gosched()
	return max(late, time.Since(t0))
}

type reply struct {
	v   any
	err error
}

// detached runs the script on a goroutine and stops waiting at ctx's end,
// for clients that would otherwise block until their ReadTimeout. The
// goroutine leaves the gate when the client returns: the connection is
// back in the pool only then.
func (s *Scripts) detached(ctx context.Context, sc *luaScript, c *call) (any, error) {
	var r reply
	if _, ok := untilDone(ctx, func() {
		r.v, r.err = s.send(ctx, sc, c)
		if s.gate != nil {
			s.leave(r.err == nil)
		}
	}); !ok {
		return nil, ctx.Err()
	}
	return r.v, r.err
}

// untilDone runs f on a goroutine and waits for it to return or for ctx
// to end, whichever is first. It reports whether f returned in time;
// what f writes may be read only then. returned is closed when f has
// returned, for a caller that must hold on until it does.
func untilDone(ctx context.Context, f func()) (returned <-chan struct{}, ok bool) {
	ch := make(chan struct{})
	go func() { f(); close(ch) }()
	select {
	case <-ch:
		return ch, true
	case <-ctx.Done():
		select {
		case <-ch: // returned just in time: select picks at random
			return ch, true
		default:
			return ch, false
		}
	}
}

// ClaimStatus is what [Scripts.Claim] found: one of claim.lua's five
// replies. It is not claim.Kind, the caller-facing outcome of a claim.
type ClaimStatus int

// The statuses of claim.lua.
const (
	// ClaimAcquired: this owner holds the Redis lease under the proposed
	// generation (ClaimReply.Generation). The durable claim decides next.
	ClaimAcquired ClaimStatus = iota + 1
	// ClaimBusy: another owner holds a live lease (ClaimReply.Owner, Generation,
	// Lease).
	ClaimBusy
	// ClaimCached: a finished result with the same fingerprint is cached
	// (ClaimReply.Cached): replay it.
	ClaimCached
	// ClaimMismatch: a finished result with another fingerprint is cached: the
	// key was reused for a different request.
	ClaimMismatch
	// ClaimFinished: the operation finished with this fingerprint under
	// ClaimReply.Generation, but its result was too large to cache: replay
	// it from the durable store.
	ClaimFinished
)

// String returns "acquired", "busy", "cached", "mismatch" or "finished".
func (o ClaimStatus) String() string {
	switch o {
	case ClaimAcquired:
		return "acquired"
	case ClaimBusy:
		return "busy"
	case ClaimCached:
		return "cached"
	case ClaimMismatch:
		return "mismatch"
	case ClaimFinished:
		return "finished"
	}
	return "unknown"
}

// ClaimArgs are the arguments of [Scripts.Claim].
type ClaimArgs struct {
	// Fingerprint is the request's canonical fingerprint; 1 to 256 bytes.
	Fingerprint string
	// Owner is the claim's fresh random identity; not uuid.Nil. Calling
	// Claim again with the same Owner (a retry of the same claim) returns
	// the same generation.
	Owner uuid.UUID
	// Lease is the Redis lease's length (at least 1ms; whole milliseconds,
	// rounded down), measured by Redis's clock.
	Lease time.Duration
	// WithTTL asks a cached reply for the cached result's remaining time
	// too ([CachedResult.TTL]): one more server call inside the script.
	WithTTL bool
}

// ClaimReply is the typed reply of [Scripts.Claim].
type ClaimReply struct {
	Status ClaimStatus
	// Generation is, for ClaimAcquired, the proposed generation; for
	// ClaimBusy, the holder's generation; for ClaimFinished, the
	// finished record's.
	Generation uint64
	// Owner is, for ClaimBusy, the holder.
	Owner uuid.UUID
	// Lease is, for ClaimBusy, the holder's lease length: its lease ends
	// within this time by Redis's clock, unless renewed.
	Lease time.Duration
	// SameRequest is, for ClaimBusy, whether the holder's lease is for the same
	// fingerprint. When it is not, only the durable store can tell a
	// mismatch from a lease left behind by a request that never reached it.
	SameRequest bool
	// Tentative is, for ClaimBusy, whether the holder's lease is still
	// tentative: the durable store has not granted it, and its holder may
	// only be about to replay a finished operation. Only the durable store
	// can then tell "in progress" from "finished".
	Tentative bool
	// Age is, for ClaimBusy of a confirmed lease for the same request, how
	// long ago it was last confirmed or renewed (its length less what is
	// left of it, by Redis's clock); zero otherwise.
	Age time.Duration
	// Cached is set for ClaimCached.
	Cached *CachedResult
}

// CachedResult is a finished result read from the Redis cache.
type CachedResult struct {
	Fingerprint string
	// State is durable.Completed or durable.Failed.
	State durable.State
	// Generation is the durable generation under which the result was
	// committed.
	Generation uint64
	Result     durable.Result
	// TTL is, when the claim asked WithTTL, the cached copy's remaining
	// time by Redis's clock, measured when the script ran; zero when it
	// was not asked or the copy has no TTL.
	TTL time.Duration
}

// Claim runs claim.lua for ref (its header says what each reply means and
// how a generation is proposed) and decodes the reply; a cached result is
// decoded into ClaimReply.Cached.
//
// ctx bounds the call together with the per-call timeout. Errors:
// [ErrInvalidArgument] (no call made), [ErrBreakerOpen], [ErrUnavailable],
// [ErrCorrupt].
func (s *Scripts) Claim(ctx context.Context, ref durable.Ref, a ClaimArgs) (ClaimReply, error) {
	return s.ClaimKeys(ctx, s.Keys(ref), a)
}

// ClaimKeys is [Scripts.Claim] on keys from [Scripts.KeysAt].
func (s *Scripts) ClaimKeys(ctx context.Context, k Keys, a ClaimArgs) (ClaimReply, error) {
	switch {
	case a.Fingerprint == "" || len(a.Fingerprint) > MaxFingerprintLen:
		return ClaimReply{}, invalid("claim: fingerprint empty or longer than %d bytes", MaxFingerprintLen)
	case a.Owner == uuid.Nil:
		return ClaimReply{}, invalid("claim: nil owner")
	case a.Lease < time.Millisecond:
		return ClaimReply{}, invalid("claim: lease shorter than 1ms")
	}
	probe, err := s.admit()
	if err != nil {
		return ClaimReply{}, err
	}
	c := newCall(k.Record)
	c.str(a.Fingerprint)
	c.uuid(a.Owner)
	c.int(a.Lease.Milliseconds())
	if a.WithTTL {
		c.str("ttl")
	}
	v, err := s.run(ctx, probe, "claim", claimScript, c)
	if err != nil {
		return ClaimReply{}, err
	}
	return parseClaim(v)
}

func parseClaim(v any) (ClaimReply, error) {
	arr, ok := v.([]any)
	if !ok || len(arr) == 0 {
		return ClaimReply{}, corrupt("claim", v)
	}
	kind, _ := arr[0].(string)
	switch {
	case kind == "acquired" && len(arr) == 2:
		g, ok := generation(arr[1])
		if !ok {
			return ClaimReply{}, corrupt("claim", v)
		}
		return ClaimReply{Status: ClaimAcquired, Generation: g}, nil
	case kind == "busy" && len(arr) == 7:
		g, gok := generation(arr[1])
		os, _ := arr[2].(string)
		owner, oerr := uuid.Parse(os)
		lease, lok := arr[3].(int64)
		same, sok := arr[4].(int64)
		tent, tok := arr[5].(int64)
		left, pok := arr[6].(int64)
		if !gok || oerr != nil || !lok || !sok || !tok || !pok {
			return ClaimReply{}, corrupt("claim", v)
		}
		r := ClaimReply{Status: ClaimBusy, Generation: g, Owner: owner, Lease: time.Duration(max(lease, 0)) * time.Millisecond, SameRequest: same == 1, Tentative: tent == 1}
		if left >= 0 {
			r.Age = max(r.Lease-time.Duration(left)*time.Millisecond, 0)
		}
		return r, nil
	case kind == "finished" && len(arr) == 2:
		g, ok := generation(arr[1])
		if !ok {
			return ClaimReply{}, corrupt("claim", v)
		}
		return ClaimReply{Status: ClaimFinished, Generation: g}, nil
	case kind == "cached" && (len(arr) == 4 || len(arr) == 5):
		fp, fok := arr[1].(string)
		g, gok := generation(arr[2])
		blob, bok := arr[3].(string)
		var pttl int64
		pok := true
		if len(arr) == 5 {
			pttl, pok = arr[4].(int64)
		}
		if !fok || !gok || !bok || !pok {
			return ClaimReply{}, corrupt("claim", v)
		}
		state, res, err := decodeResult(blob)
		if err != nil {
			return ClaimReply{}, err
		}
		// PTTL is -1 for a key without a TTL: no bound, so no TTL.
		ttl := time.Duration(max(pttl, 0)) * time.Millisecond
		return ClaimReply{Status: ClaimCached, Cached: &CachedResult{Fingerprint: fp, State: state, Generation: g, Result: res, TTL: ttl}}, nil
	case kind == "mismatch" && len(arr) == 1:
		return ClaimReply{Status: ClaimMismatch}, nil
	}
	return ClaimReply{}, corrupt("claim", v)
}

// Renew runs renew.lua for tok.Owner (the generation is not compared:
// owners are unique per claim, and a lease whose generation was not yet
// synced is still this owner's). held is the script's reply; after a lost
// reply and a re-run it is the answering run's.
//
// Errors: [ErrInvalidArgument], [ErrBreakerOpen], [ErrUnavailable], [ErrCorrupt].
func (s *Scripts) Renew(ctx context.Context, ref durable.Ref, tok fence.Token, lease time.Duration) (held bool, err error) {
	return s.RenewKeys(ctx, s.Keys(ref), tok, lease)
}

// RenewKeys is [Scripts.Renew] on keys from [Scripts.KeysAt].
func (s *Scripts) RenewKeys(ctx context.Context, k Keys, tok fence.Token, lease time.Duration) (held bool, err error) {
	switch {
	case tok.Owner == uuid.Nil:
		return false, invalid("renew: nil owner")
	case lease < time.Millisecond:
		return false, invalid("renew: lease shorter than 1ms")
	}
	probe, err := s.admit()
	if err != nil {
		return false, err
	}
	c := newCall(k.Record)
	c.uuid(tok.Owner)
	c.int(lease.Milliseconds())
	v, err := s.run(ctx, probe, "renew", renewScript, c)
	if err != nil {
		return false, err
	}
	return flag("renew", v)
}

// Release runs release.lua for tok.Owner. held is the script's reply; when
// go-redis re-ran the script after a lost reply, the run that answered may
// find the lease already gone and report false.
//
// Errors: [ErrInvalidArgument], [ErrBreakerOpen], [ErrUnavailable], [ErrCorrupt].
func (s *Scripts) Release(ctx context.Context, ref durable.Ref, tok fence.Token) (held bool, err error) {
	return s.ReleaseKeys(ctx, s.Keys(ref), tok)
}

// ReleaseKeys is [Scripts.Release] on keys from [Scripts.KeysAt]. It wakes
// the key's watchers ([Scripts.Watch]) when it deletes the lease.
func (s *Scripts) ReleaseKeys(ctx context.Context, k Keys, tok fence.Token) (held bool, err error) {
	return s.release(ctx, k, tok, false)
}

// DropKeys is [Scripts.ReleaseKeys] without the wake: for a lease the
// durable store did not grant, whose key someone else holds.
func (s *Scripts) DropKeys(ctx context.Context, k Keys, tok fence.Token) (held bool, err error) {
	return s.release(ctx, k, tok, true)
}

func (s *Scripts) release(ctx context.Context, k Keys, tok fence.Token, quiet bool) (held bool, err error) {
	if tok.Owner == uuid.Nil {
		return false, invalid("release: nil owner")
	}
	probe, err := s.admit()
	if err != nil {
		return false, err
	}
	c := newCall(k.Record)
	c.uuid(tok.Owner)
	if quiet {
		c.str("quiet")
	}
	v, err := s.run(ctx, probe, "release", releaseScript, c)
	if err != nil {
		return false, err
	}
	return flag("release", v)
}

// Complete runs complete.lua (its header gives the rules: stale
// completions, higher generations, the lease) after the durable store
// committed a finished result, to cache (fingerprint, state, res,
// tok.Generation) for min(ttl, CacheTTL) and drop tok.Owner's lease.
//
//   - tok.Generation is the record's durable generation (at least 1).
//   - tok.Owner may be uuid.Nil to refill the cache from the durable store
//     on a replay: then no lease is touched.
//   - ttl is the record's remaining retention ([durable.Record.ExpiresIn]),
//     so the cached copy never outlives the record; under 1ms caches nothing.
//   - A body over MaxCachedBody (or any body, when it is negative) is not
//     cached (cached is false): Redis keeps a marker instead, which says the
//     operation finished and that its replay comes from the durable store,
//     so retries replay without taking a lease. The lease is still
//     dropped.
//
// cached reports whether the result cache holds this result afterwards.
//
// Errors: [ErrInvalidArgument], [ErrBreakerOpen], [ErrUnavailable], [ErrCorrupt].
func (s *Scripts) Complete(ctx context.Context, ref durable.Ref, tok fence.Token, fingerprint string, state durable.State, res durable.Result, ttl time.Duration) (cached bool, err error) {
	return s.CompleteKeys(ctx, s.Keys(ref), tok, fingerprint, state, res, ttl)
}

// CompleteKeys is [Scripts.Complete] on keys from [Scripts.KeysAt].
func (s *Scripts) CompleteKeys(ctx context.Context, k Keys, tok fence.Token, fingerprint string, state durable.State, res durable.Result, ttl time.Duration) (cached bool, err error) {
	switch {
	case tok.Generation == 0:
		return false, invalid("complete: generation 0")
	case fingerprint == "" || len(fingerprint) > MaxFingerprintLen:
		return false, invalid("complete: fingerprint empty or longer than %d bytes", MaxFingerprintLen)
	case !state.Finished():
		return false, invalid("complete: state %q is not completed or failed", state)
	}
	ttl = min(ttl, s.cacheTTL)
	keep := ttl >= time.Millisecond
	cache := keep && s.maxCachedBody >= 0 && len(res.Body) <= s.maxCachedBody
	if !keep && tok.Owner == uuid.Nil {
		return false, nil // nothing to keep and no lease to drop
	}
	probe, err := s.admit()
	if err != nil {
		return false, err
	}
	var blob string
	var ttlMS int64
	if keep {
		ttlMS = ttl.Milliseconds()
	}
	if cache {
		blob = encodeResultString(state, res)
	}
	c := newCall(k.Record)
	c.uuid(tok.Owner)
	c.uint(tok.Generation)
	c.str(fingerprint)
	c.str(blob)
	c.int(ttlMS)
	if keep {
		c.ttl = &c.ints[c.ni-1]
	}
	if keep && !cache {
		c.str("F")
	}
	v, err := s.run(ctx, probe, "complete", completeScript, c)
	if err != nil {
		return false, err
	}
	arr, ok := v.([]any)
	if !ok || len(arr) != 2 {
		return false, corrupt("complete", v)
	}
	n, ok := arr[0].(int64)
	if !ok {
		return false, corrupt("complete", v)
	}
	return n == 1 && cache, nil
}

// SyncGen runs syncgen.lua with tok once the durable store granted the key
// to tok.Owner: tok.Owner's lease, if Redis still holds it, is confirmed
// (no stale result may replace it; under lua.Options.TrustLease it
// answers young duplicates "in progress" alone) and
// carries the durable generation, which differs from claim.lua's proposal
// when Redis lost data, went back in time, or its reply was lost. With
// tok.Owner uuid.Nil there is no lease to rewrite and no call is made.
//
// Errors: [ErrInvalidArgument], [ErrBreakerOpen], [ErrUnavailable], [ErrCorrupt].
func (s *Scripts) SyncGen(ctx context.Context, ref durable.Ref, tok fence.Token) error {
	return s.SyncGenKeys(ctx, s.Keys(ref), tok)
}

// SyncGenKeys is [Scripts.SyncGen] on keys from [Scripts.KeysAt].
func (s *Scripts) SyncGenKeys(ctx context.Context, k Keys, tok fence.Token) error {
	if tok.Generation == 0 {
		return invalid("syncgen: generation 0")
	}
	if tok.Owner == uuid.Nil {
		return nil
	}
	probe, err := s.admit()
	if err != nil {
		return err
	}
	c := newCall(k.Record)
	c.uint(tok.Generation)
	c.uuid(tok.Owner)
	v, err := s.run(ctx, probe, "syncgen", syncgenScript, c)
	if err != nil {
		return err
	}
	_, err = flag("syncgen", v)
	return err
}

// msUp returns d in whole milliseconds, rounded up.
func msUp(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// generation reads a generation a script returned as a decimal string.
func generation(v any) (uint64, bool) {
	s, ok := v.(string)
	if !ok {
		return 0, false
	}
	g, err := strconv.ParseUint(s, 10, 64)
	return g, err == nil && g > 0
}

func flag(name string, v any) (bool, error) {
	n, ok := v.(int64)
	if !ok || (n != 0 && n != 1) {
		return false, corrupt(name, v)
	}
	return n == 1, nil
}

func corrupt(name string, v any) error {
	return fmt.Errorf("%w: %s: reply of type %T", ErrCorrupt, name, v)
}
