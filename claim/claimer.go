package claim

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/oncekey/oncekey/claim/internal/localcache"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/internal/fastpath"
)

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
	// locked is store when it can run Do's default protocol, the lock
	// first (durable/postgres): the key's lock and a check for a record in
	// the BEGIN's round trip, fn, and the finished record inserted with
	// the COMMIT; nil otherwise (Do claims first).
	locked storeapi.CommitWriter[TTx]
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
	// trustLease is lua.Options.TrustLease: how young a confirmed Redis
	// lease must be to answer a duplicate "in progress" without a read of
	// the record (zero: never).
	trustLease time.Duration
	// behind holds a token for each Redis completion of Do running after
	// its caller's answer (cacheBehind).
	behind  chan struct{}
	cfg     config
	log     *slog.Logger
	metrics *meters
	tracing tracer
	// local is the replay cache in process (WithReplayCache); nil when off.
	local *localcache.Cache
	// breaker logs and counts the Redis breaker's changes; nil without
	// Redis.
	breaker *breakerLog
	// newKeyGuess sets ExpectNew on the claims Redis did not grant
	// (newGuess).
	newKeyGuess newGuess
	// reads shares the durable reads of concurrent duplicates (peek).
	reads readGroup
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
	c := &Claimer[TTx]{store: proto, cfg: cfg, log: cfg.logger, tracing: newTracer(cfg.tracer), local: localcache.New(cfg.replayCache)}
	if cfg.atCommit {
		c.atCommit, _ = store.(storeapi.CommitWriter[TTx])
	} else {
		c.locked, _ = store.(storeapi.CommitWriter[TTx])
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if cfg.redis != nil {
		fo := fastpath.FromLua(cfg.luaOpts)
		c.breaker = &breakerLog{log: c.log, m: func() *meters { return c.metrics }, now: time.Now}
		fo.OnStateChange = c.breaker.change
		s, err := fastpath.New(cfg.redis, fo)
		if err != nil {
			return nil, configErr("WithRedis: %w", err)
		}
		c.scripts = s
		c.behind = make(chan struct{}, maxBehind)
		c.trustLease = fo.TrustLease
		c.redisTimeout = fo.Timeout
		if c.redisTimeout == 0 {
			c.redisTimeout = fastpath.DefaultTimeout
		}
	}
	m, err := newMeters(c)
	if err != nil {
		return nil, err
	}
	c.metrics = m
	c.initSettings()
	return c, nil
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

// marginFor returns the start margin of a claim with the given lease: the
// explicit one, or a tenth of that lease.
func (c *Claimer[TTx]) marginFor(lease time.Duration) time.Duration {
	if c.cfg.marginSet {
		return c.cfg.margin
	}
	return lease / 10
}
