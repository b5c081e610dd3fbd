package lua

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
)

var (
	//go:embed claim.lua
	claimSrc string
	//go:embed renew.lua
	renewSrc string
	//go:embed complete.lua
	completeSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed syncgen.lua
	syncgenSrc string

	// Run sends EVALSHA and falls back to EVAL on NOSCRIPT (a restarted or
	// failed-over server, or a cluster node that never saw the script).
	claimScript    = redis.NewScript(claimSrc)
	renewScript    = redis.NewScript(renewSrc)
	completeScript = redis.NewScript(completeSrc)
	releaseScript  = redis.NewScript(releaseSrc)
	syncgenScript  = redis.NewScript(syncgenSrc)
)

// Defaults of [Options].
const (
	DefaultTimeout       = 50 * time.Millisecond
	DefaultMaxCachedBody = 64 << 10
	DefaultCacheTTL      = 24 * time.Hour
)

// MaxFingerprintLen is the longest fingerprint accepted, as in the durable
// store.
const MaxFingerprintLen = 256

// Options configure [New]. The zero value takes every default.
type Options struct {
	// Prefix starts every key name. Defaults to [DefaultPrefix]. It must
	// not contain '{' or '}', which would change the hash tag.
	Prefix string
	// Timeout bounds each call, Redis's retries included. Defaults to 50ms.
	Timeout time.Duration
	// MaxCachedBody is the largest body cached in Redis, in bytes; results
	// with larger bodies are not cached and their replays come from the
	// durable store. Defaults to 64 KiB; negative caches no result at all.
	MaxCachedBody int
	// CacheTTL bounds a cached result's life. Each Complete also passes the
	// record's remaining retention; the smaller one is used. Defaults to 24h.
	CacheTTL time.Duration
	// Breaker configures the circuit breaker.
	Breaker BreakerOptions
	// OnStateChange, when set, is called with the breaker's new state on
	// every change (for a metric or a log line). It runs under the
	// breaker's lock: it must be quick and must not call [Scripts].
	OnStateChange func(BreakerState)
}

// Scripts runs the fast-path scripts on one Redis deployment. It is safe for
// concurrent use.
type Scripts struct {
	c             redis.Scripter
	prefix        string
	timeout       time.Duration
	maxCachedBody int
	cacheTTL      time.Duration
	breaker       *Breaker
	// direct is true when the client ends a call at its context's deadline
	// (ContextTimeoutEnabled); otherwise each call runs on its own
	// goroutine so the wrapper can return at the deadline anyway.
	direct bool
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
// client's ReadTimeout. See the package documentation for retry settings.
func New(c redis.Scripter, opts Options) (*Scripts, error) {
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
	}
	switch {
	case containsBrace(opts.Prefix):
		return nil, invalid("prefix %q must not contain '{' or '}'", opts.Prefix)
	case opts.Timeout < 0:
		return nil, invalid("timeout must not be negative")
	case opts.CacheTTL < 0:
		return nil, invalid("cache TTL must not be negative")
	case opts.Breaker.Failures < 0:
		return nil, invalid("breaker failures must not be negative")
	case opts.Breaker.CoolDown < 0:
		return nil, invalid("breaker cool-down must not be negative")
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

// Breaker returns the breaker's state.
func (s *Scripts) Breaker() BreakerState { return s.breaker.State() }

// Load loads every script into the script cache of the server (of every
// master, for a cluster client). It is optional: calls fall back to EVAL on
// NOSCRIPT. It is needed before sending scripts in a pipeline, which has no
// such fallback. Load goes through neither the breaker nor the timeout: ctx
// bounds it.
func (s *Scripts) Load(ctx context.Context) error {
	for _, sc := range []*redis.Script{claimScript, renewScript, completeScript, releaseScript, syncgenScript} {
		if err := sc.Load(ctx, s.c).Err(); err != nil {
			return fmt.Errorf("%w: load: %w", ErrUnavailable, err)
		}
	}
	return nil
}

// run sends one script through the breaker, with the per-call timeout.
func (s *Scripts) run(ctx context.Context, name string, sc *redis.Script, keys []string, args ...any) (any, error) {
	probe, ok := s.breaker.Allow()
	if !ok {
		return nil, ErrBreakerOpen
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var v any
	var err error
	if s.direct {
		v, err = sc.Run(cctx, s.c, keys, args...).Result()
	} else {
		v, err = s.detached(cctx, sc, keys, args)
	}
	switch {
	case err == nil:
		s.breaker.Success(probe)
		return v, nil
	case ctx.Err() != nil:
		// The caller gave up; that says nothing about Redis.
		s.breaker.Abandon(probe)
	default:
		s.breaker.Failure(probe)
	}
	return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, name, err)
}

type reply struct {
	v   any
	err error
}

// detached runs the script on a goroutine and stops waiting at ctx's end,
// for clients that would otherwise block until their ReadTimeout.
func (s *Scripts) detached(ctx context.Context, sc *redis.Script, keys []string, args []any) (any, error) {
	ch := make(chan reply, 1)
	go func() {
		v, err := sc.Run(ctx, s.c, keys, args...).Result()
		ch <- reply{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		select {
		case r := <-ch: // answered just in time: select picks at random
			return r.v, r.err
		default:
			return nil, ctx.Err()
		}
	}
}

// Outcome is what [Scripts.Claim] found.
type Outcome int

// The outcomes of a claim.
const (
	// Acquired: this owner holds the Redis lease under the proposed
	// generation (ClaimReply.Generation). The durable claim decides next.
	Acquired Outcome = iota + 1
	// Busy: another owner holds a live lease (ClaimReply.Owner, Generation,
	// PTTL).
	Busy
	// Cached: a finished result with the same fingerprint is cached
	// (ClaimReply.Cached): replay it.
	Cached
	// Mismatch: a finished result with another fingerprint is cached: the
	// key was reused for a different request.
	Mismatch
)

// String returns "acquired", "busy", "cached" or "mismatch".
func (o Outcome) String() string {
	switch o {
	case Acquired:
		return "acquired"
	case Busy:
		return "busy"
	case Cached:
		return "cached"
	case Mismatch:
		return "mismatch"
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
	// Retention is how long the generation counter is kept at least (at
	// least 1ms; rounded up to whole milliseconds).
	Retention time.Duration
}

// ClaimReply is the typed reply of [Scripts.Claim].
type ClaimReply struct {
	Outcome Outcome
	// Generation is, for Acquired, the proposed generation; for Busy, the
	// holder's generation.
	Generation uint64
	// Owner is, for Busy, the holder.
	Owner uuid.UUID
	// PTTL is, for Busy, the lease's remaining time by Redis's clock.
	PTTL time.Duration
	// SameRequest is, for Busy, whether the holder's lease is for the same
	// fingerprint. When it is not, only the durable store can tell a
	// mismatch from a lease left behind by a request that never reached it.
	SameRequest bool
	// Cached is set for Cached.
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
}

// Claim runs claim.lua for ref: a cached result with a.Fingerprint is
// returned (Cached); a cached result with another fingerprint gives
// Mismatch; a live lease of another owner gives Busy; otherwise the
// generation counter becomes max(counter + 1, Redis's clock in ms - 59 s),
// which is proposed, and this owner takes the lease (Acquired). The clock
// term matches the durable store's floor for a record it creates or
// restarts (its clock in ms - 60 s), so a fresh key needs no SyncGen when
// the two clocks agree within a second. A live lease of a.Owner with
// a.Fingerprint (a re-run) gives Acquired with its generation, without
// another proposal.
//
// ctx bounds the call together with the per-call timeout. Errors:
// [ErrInvalidArgument] (no call made), [ErrBreakerOpen], [ErrUnavailable],
// [ErrCorrupt].
func (s *Scripts) Claim(ctx context.Context, ref durable.Ref, a ClaimArgs) (ClaimReply, error) {
	switch {
	case a.Fingerprint == "" || len(a.Fingerprint) > MaxFingerprintLen:
		return ClaimReply{}, invalid("claim: fingerprint empty or longer than %d bytes", MaxFingerprintLen)
	case a.Owner == uuid.Nil:
		return ClaimReply{}, invalid("claim: nil owner")
	case a.Lease < time.Millisecond:
		return ClaimReply{}, invalid("claim: lease shorter than 1ms")
	case a.Retention < time.Millisecond:
		return ClaimReply{}, invalid("claim: retention shorter than 1ms")
	}
	k := s.Keys(ref)
	v, err := s.run(ctx, "claim", claimScript, []string{k.Lease, k.Gen, k.Result},
		a.Fingerprint, a.Owner.String(), a.Lease.Milliseconds(), msUp(a.Retention))
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
		return ClaimReply{Outcome: Acquired, Generation: g}, nil
	case kind == "busy" && len(arr) == 5:
		g, gok := generation(arr[1])
		os, _ := arr[2].(string)
		owner, oerr := uuid.Parse(os)
		pttl, pok := arr[3].(int64)
		same, sok := arr[4].(int64)
		if !gok || oerr != nil || !pok || !sok {
			return ClaimReply{}, corrupt("claim", v)
		}
		return ClaimReply{Outcome: Busy, Generation: g, Owner: owner, PTTL: time.Duration(max(pttl, 0)) * time.Millisecond, SameRequest: same == 1}, nil
	case kind == "cached" && len(arr) == 4:
		fp, fok := arr[1].(string)
		g, gok := generation(arr[2])
		blob, bok := arr[3].(string)
		if !fok || !gok || !bok {
			return ClaimReply{}, corrupt("claim", v)
		}
		state, res, err := decodeResult([]byte(blob))
		if err != nil {
			return ClaimReply{}, err
		}
		return ClaimReply{Outcome: Cached, Cached: &CachedResult{Fingerprint: fp, State: state, Generation: g, Result: res}}, nil
	case kind == "mismatch" && len(arr) == 1:
		return ClaimReply{Outcome: Mismatch}, nil
	}
	return ClaimReply{}, corrupt("claim", v)
}

// Renew runs renew.lua: the lease is extended to lease from now by Redis's
// clock if tok.Owner holds it (the generation is not compared: owners are
// unique per claim, and a lease whose generation was not yet synced is still
// this owner's). held reports whether it did; an expired lease is not
// brought back. A re-run after a lost reply may report the first run's
// answer or the same again.
//
// Errors: [ErrInvalidArgument], [ErrBreakerOpen], [ErrUnavailable], [ErrCorrupt].
func (s *Scripts) Renew(ctx context.Context, ref durable.Ref, tok fence.Token, lease time.Duration) (held bool, err error) {
	switch {
	case tok.Owner == uuid.Nil:
		return false, invalid("renew: nil owner")
	case lease < time.Millisecond:
		return false, invalid("renew: lease shorter than 1ms")
	}
	k := s.Keys(ref)
	v, err := s.run(ctx, "renew", renewScript, []string{k.Lease}, tok.Owner.String(), lease.Milliseconds())
	if err != nil {
		return false, err
	}
	return flag("renew", v)
}

// Release runs release.lua: the lease is deleted if tok.Owner holds it.
// held reports whether this run deleted it; when go-redis re-ran the script
// after a lost reply, the run that answered may find the lease already gone
// and report false.
//
// Errors: [ErrInvalidArgument], [ErrBreakerOpen], [ErrUnavailable], [ErrCorrupt].
func (s *Scripts) Release(ctx context.Context, ref durable.Ref, tok fence.Token) (held bool, err error) {
	if tok.Owner == uuid.Nil {
		return false, invalid("release: nil owner")
	}
	k := s.Keys(ref)
	v, err := s.run(ctx, "release", releaseScript, []string{k.Lease}, tok.Owner.String())
	if err != nil {
		return false, err
	}
	return flag("release", v)
}

// Complete runs complete.lua after the durable store committed a finished
// result: it caches (fingerprint, state, res, tok.Generation) for
// min(ttl, CacheTTL) and deletes the lease if tok.Owner holds it.
//
//   - tok.Generation is the record's durable generation (at least 1).
//   - tok.Owner may be uuid.Nil to refill the cache from the durable store
//     on a replay: then no lease is touched.
//   - ttl is the record's remaining retention ([durable.Record.ExpiresIn]),
//     so the cached copy never outlives the record; under 1ms caches nothing.
//   - A body over MaxCachedBody is not cached (cached is false), but the
//     lease is still dropped.
//   - A lease of another owner with a higher generation means this
//     completion is stale: nothing is written. A cached result of a higher
//     generation is kept.
//
// cached reports whether the result cache holds this result afterwards. A
// re-run of the same call changes nothing (the TTL included).
//
// Errors: [ErrInvalidArgument], [ErrBreakerOpen], [ErrUnavailable], [ErrCorrupt].
func (s *Scripts) Complete(ctx context.Context, ref durable.Ref, tok fence.Token, fingerprint string, state durable.State, res durable.Result, ttl time.Duration) (cached bool, err error) {
	switch {
	case tok.Generation == 0:
		return false, invalid("complete: generation 0")
	case fingerprint == "" || len(fingerprint) > MaxFingerprintLen:
		return false, invalid("complete: fingerprint empty or longer than %d bytes", MaxFingerprintLen)
	case !state.Finished():
		return false, invalid("complete: state %q is not completed or failed", state)
	}
	ttl = min(ttl, s.cacheTTL)
	cache := ttl >= time.Millisecond && s.maxCachedBody >= 0 && len(res.Body) <= s.maxCachedBody
	var blob []byte
	var ttlMS int64
	if cache {
		blob, ttlMS = encodeResult(state, res), ttl.Milliseconds()
	} else if tok.Owner == uuid.Nil {
		return false, nil // nothing to cache and no lease to drop
	}
	owner := ""
	if tok.Owner != uuid.Nil {
		owner = tok.Owner.String()
	}
	k := s.Keys(ref)
	v, err := s.run(ctx, "complete", completeScript, []string{k.Lease, k.Result},
		owner, strconv.FormatUint(tok.Generation, 10), fingerprint, blob, ttlMS)
	if err != nil {
		return false, err
	}
	arr, ok := v.([]any)
	if !ok || len(arr) != 2 {
		return false, corrupt("complete", v)
	}
	c, ok := arr[0].(int64)
	if !ok {
		return false, corrupt("complete", v)
	}
	return c == 1, nil
}

// SyncGen runs syncgen.lua after the durable store answered with another
// generation than Redis proposed (Redis lost data or went back in time): the
// counter becomes max(counter, tok.Generation), kept at least for
// retention, and the lease's generation becomes tok.Generation if tok.Owner
// holds it. tok.Owner may be uuid.Nil to raise the counter only. The
// counter never goes down.
//
// Errors: [ErrInvalidArgument], [ErrBreakerOpen], [ErrUnavailable], [ErrCorrupt].
func (s *Scripts) SyncGen(ctx context.Context, ref durable.Ref, tok fence.Token, retention time.Duration) error {
	switch {
	case tok.Generation == 0:
		return invalid("syncgen: generation 0")
	case retention < time.Millisecond:
		return invalid("syncgen: retention shorter than 1ms")
	}
	owner := ""
	if tok.Owner != uuid.Nil {
		owner = tok.Owner.String()
	}
	k := s.Keys(ref)
	v, err := s.run(ctx, "syncgen", syncgenScript, []string{k.Lease, k.Gen},
		strconv.FormatUint(tok.Generation, 10), owner, msUp(retention))
	if err != nil {
		return err
	}
	if arr, ok := v.([]any); !ok || len(arr) != 2 {
		return corrupt("syncgen", v)
	}
	return nil
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
