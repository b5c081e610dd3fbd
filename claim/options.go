package claim

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekey/oncekey/lua"
)

// Defaults of a [Claimer], as its options document them.
const (
	defaultLease     = 30 * time.Second
	defaultRetention = 24 * time.Hour
)

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
	atCommit    bool  // WithWriteAtCommit
	replayCache int64 // WithReplayCache: bytes; 0: off
}

// WithRedis puts Redis in front of the durable store, through the scripts of
// package lua configured by opts. Without it the Claimer runs on the durable
// store alone, with the same guarantees. c may be any go-redis client
// (standalone, Sentinel, Cluster). Its maxmemory-policy must be noeviction;
// the Claimer checks it once and warns (package lua's documentation,
// Eviction, says why and how). [New] makes no Redis call.
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

// WithReplayCache keeps up to maxBytes of finished results (completed or
// failed) in this process's memory and answers a duplicate of one from
// there, without a network call: for hot keys whose retries arrive in
// bursts. Off by default; 0 turns it off.
//
// It changes no answer. A finished record does not change until its
// retention ends, and an entry is dropped before that: its lifetime is
// what the store (or Redis) said was left of the record, counted from
// before the question was sent. Only results this Claimer saw committed
// or read, outside a caller's transaction, are kept; processing,
// uncertain and released records never are. An entry answers only the
// fingerprint it was stored with (another payload goes on to the stores,
// which answer the mismatch), and it is keyed by the record's digest, so
// tenants never share one. Redis being flushed does not touch it.
//
// maxBytes bounds an estimate of the heap the entries take: about 320
// bytes an entry plus its fingerprint, body and headers (a 100-byte body
// with one header: 845 bytes measured), the least recently used evicted
// first; a result larger than a sixteenth of maxBytes is not kept. Such a
// replay has [Outcome].FromCache set and counts in oncekey.replays with
// source "process".
func WithReplayCache(maxBytes int64) Option {
	return func(cfg *config) error {
		if maxBytes < 0 {
			return configErr("WithReplayCache: negative size %d", maxBytes)
		}
		cfg.replayCache = maxBytes
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
// duplicates the business work is multiplied by them. What it saves, since
// issue 44, is little: the default also writes the record once, at COMMIT,
// and only adds the key's lock and a check for a record to the BEGIN's
// round trip.
//
// Without it (the default) Do locks first on PostgreSQL (see Do): fn runs
// at most once per record life and never for a duplicate. On a store that
// cannot write at commit (durable/sqlite) the option has no effect.
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
// Their attributes use one set of keys across the library and its adapters
// (op for the operation identity, err for the error), listed in the
// repository's internal/logkeys.
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
