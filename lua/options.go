package lua

import "time"

// Options configure the Redis fast path; pass them to claim.WithRedis. The
// zero value takes every default. claim.New rejects a negative duration or
// count, and a prefix with a brace.
type Options struct {
	// Prefix starts every key name (see "Key layout" in the package
	// documentation). Defaults to "oncekey". It must not contain '{' or
	// '}', which would change the hash tag.
	Prefix string
	// Timeout bounds each script call, go-redis's retries included, from
	// when the call is sent. With a *redis.Client, at most 4 calls or
	// pipelines are in flight at once (with ContextTimeoutEnabled; else as
	// many as the pool has connections); calls beyond them queue and go out
	// together as one pipeline (each still one script run with its own
	// reply). The wait in that queue is not part of Timeout and is not a
	// Redis failure for the breaker: it is bounded by the caller's context
	// and the client's PoolTimeout, and ends with the breaker opening.
	// Commands the application sends on the same client are not counted,
	// nor are Cluster and Ring clients gated: waiting for their
	// connections still counts. Defaults to 50ms.
	Timeout time.Duration
	// MaxCachedBody is the largest body cached in Redis, in bytes; results
	// with larger bodies are not cached and their replays come from the
	// durable store. Defaults to 64 KiB; negative caches no result at all.
	MaxCachedBody int
	// CacheTTL bounds a cached result's life. Each completion also passes
	// the record's remaining retention; the smaller one is used. Defaults
	// to 24h.
	CacheTTL time.Duration
	// BreakerFailures is how many consecutive failed calls open the
	// circuit breaker; claims then go to the durable store alone, and
	// claim.Claimer logs the opening and the closing as warnings (at most
	// one line of each kind per 10s) and counts openings in
	// oncekey.redis.breaker.opens. Defaults to 5. A timeout is not counted
	// when this process itself ran too far behind to read a reply in time
	// (a goroutine that yields at the deadline waits over a quarter of
	// Timeout to run again, or the timeout is seen that late, or such a lag
	// was seen after the call was sent): a burst of requests on a busy CPU
	// is not Redis failing. The call still fails and its claim goes to the
	// durable store.
	BreakerFailures int
	// BreakerCoolDown is how long the breaker stays open before it lets
	// one probe call through. Defaults to 1s.
	BreakerCoolDown time.Duration
	// TrustLease is how long after the durable store granted it (or it was
	// last renewed) a Redis lease answers a duplicate "in progress" by
	// itself. Zero, the default, trusts no lease: a duplicate that meets
	// one reads the record (one read shared by the process's concurrent
	// duplicates of the key), so a finished operation replays even when a
	// Redis failover or split brain kept its lease and lost its result.
	//
	// A positive value is an opt-in trade: duplicates arriving within it
	// are answered without that read (the bench's storm of in-flight
	// duplicates ran about a fifth faster with it), and during such a Redis
	// fault a duplicate in that window may be told "in progress" for work
	// already finished. Nothing ever runs twice either way.
	TrustLease time.Duration
}
