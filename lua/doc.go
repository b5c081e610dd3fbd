// Package lua is the Redis fast path of oncekey: five Lua scripts (claim,
// renew, complete, release, sync-generation) with typed Go wrappers, a
// circuit breaker in front of them, and an eviction-policy check.
//
// Redis accelerates; it is never the guarantee. It answers duplicates of
// in-flight and finished keys without touching the database, collapses a
// burst of concurrent duplicates to one database claim, and proposes
// generations. The durable store (package durable) arbitrates every claim
// and fences every completion, so Redis losing data, failing over to a
// replica that missed writes, running a script twice or being down never
// lets a second effect through. When a wrapper returns [ErrUnavailable], the
// caller goes to the durable store alone (with proposed generation 0).
//
// # Key layout
//
// One idempotency key (a [durable.Ref]) has three Redis keys, named by
// [KeysFor]:
//
//	<prefix>:{<h>}:lease    hash {o: owner, g: generation, f: fingerprint}, PX = lease
//	<prefix>:{<h>}:gen      decimal generation counter, TTL >= retention
//	<prefix>:{<h>}:result   hash {f: fingerprint, g: generation, d: encoded result},
//	                        TTL = min(record's remaining retention, CacheTTL)
//
// h is the 64 lowercase hex digits of [durable.Ref.Digest], a SHA-256 over
// the length-prefixed tenant, operation and key hash. The braces make h the
// Redis Cluster hash tag: the three keys share one slot, so every script
// runs on one node with no CROSSSLOT error. No tenant, operation or key
// appears in a key name, and a client key containing '{' or '}' cannot move
// the slot, because only hex sits between the braces. The prefix defaults
// to "oncekey" and must not contain braces.
//
// The result's "d" field is a compact versioned binary encoding (version
// byte 0x01, then length-prefixed fields) of the state, status, headers
// (multi-valued, nil and empty told apart), body (binary safe), version and
// resource id. Bodies over [Options.MaxCachedBody] (64 KiB by default) are
// not cached; their replays come from the durable store.
//
// # Scripts
//
// Lease and expiry timing uses Redis's own clock (PX TTLs), never the
// caller's. Generations cross the Lua boundary as decimal strings, so
// generations above 2^53 stay exact.
//
// claim.lua ([Scripts.Claim]): KEYS lease, gen, result; ARGV fingerprint,
// owner, lease ms, retention ms.
//   - A cached result with the same fingerprint: Cached, with the result.
//   - A cached result with another fingerprint: Mismatch.
//   - A live lease of the same owner and fingerprint: Acquired with the
//     lease's generation again, no new proposal (a re-run).
//   - A live lease of another owner (or another fingerprint): Busy, with the
//     holder's owner, generation and remaining PTTL, and whether the lease is
//     for the same fingerprint (SameRequest). A lease's fingerprint is
//     never turned into Mismatch: a lease left behind by a release that did
//     not reach Redis must not make a new request fail for good.
//   - Otherwise: gen := max(gen + 1, Redis's clock (TIME) in ms - 59000),
//     its TTL raised to the retention, never lowered; lease := {owner, gen,
//     fingerprint} PX lease ms; Acquired with gen. The durable store gives
//     a record it creates or restarts at least its own clock in ms - 60000
//     (the floor that keeps generations rising across Sweep), so when the
//     Redis and database clocks agree within a second it keeps this
//     proposal and no SyncGen follows, even for a fresh key or after Redis
//     lost the counter. A counter already ahead of the clock rises by 1.
//
// renew.lua ([Scripts.Renew]): KEYS lease; ARGV owner, lease ms. If owner
// holds the lease, PEXPIRE it; 1, else 0. An expired lease is not brought
// back.
//
// complete.lua ([Scripts.Complete]): KEYS lease, result; ARGV owner (or
// empty), generation, fingerprint, blob, ttl ms. A lease of another owner
// with a higher generation makes the call a no-op (stale completion). A
// cached result of a higher generation is kept. The identical result is left
// as it is, TTL included. Otherwise the result is written with PX ttl. The
// lease is deleted only if owner holds it. Returns {cached, dropped}.
//
// release.lua ([Scripts.Release]): KEYS lease; ARGV owner. Deletes the lease
// only if owner holds it; 1, else 0.
//
// syncgen.lua ([Scripts.SyncGen]): KEYS lease, gen; ARGV generation, owner
// (or empty), retention ms. gen := max(gen, generation) with its TTL raised
// to the retention; the lease's generation := generation if owner holds it.
// The counter never goes down.
//
// Invariants: no script deletes or changes another owner's lease; no script
// lowers the counter; only claim.lua proposes from it (syncgen.lua raises it
// to a given value), and never twice for one owner while that owner's lease
// lives.
//
// # Retries and re-runs
//
// go-redis re-sends a command whose reply timed out (MaxRetries defaults to
// 3), so one call can run a script up to four times on the server; this was
// measured, and TestClaim_DelayedReplyRerun forces it. Every script is safe
// to re-run: claim.lua by the same owner returns the same generation without
// proposing another; renew, complete, release and syncgen write nothing new on a
// second run. MaxRetries may therefore stay at its default. The wrappers
// expect these client settings:
//
//   - ContextTimeoutEnabled: true, so that the per-call [Options.Timeout]
//     (50ms by default) ends a stalled socket read. With the go-redis
//     default (false) the wrapper still returns at its timeout, but the
//     call goes on in a goroutine until the client's ReadTimeout, costing a
//     goroutine per call (see BenchmarkClaim's "wrapper-detached").
//   - ReadTimeout and WriteTimeout no shorter than Timeout.
//   - Any MaxRetries (the default 3 is fine): retries happen inside the
//     per-call timeout.
//
// A wrapper that returns an error may still have run its script: claim.lua
// may have left a lease of this owner, which expires by itself or is
// dropped by Complete or Release; the durable store's decision stands
// either way.
//
// # Breaker
//
// Every wrapper goes through a [Breaker]: after [BreakerOptions.Failures]
// consecutive failed calls (5 by default) it opens for
// [BreakerOptions.CoolDown] (1s by default), during which calls return
// [ErrBreakerOpen] at once with no Redis call; then one probe call is let
// through (half-open), whose success closes it and whose failure opens it
// again. A call the caller's own context ended, a bad argument or a corrupt
// reply does not count as a failure. [Scripts.Breaker] and
// [Options.OnStateChange] report the state for metrics.
//
// # Eviction
//
// Under any maxmemory-policy but noeviction Redis may evict a generation
// counter or a lease (seen on allkeys-lru). [CheckEviction] reads the policy
// at start-up; the caller logs and counts anything but [NoEviction]. It is not
// fatal, since the durable store arbitrates, but the fast path is degraded.
//
// # Pipelines
//
// The wrappers send EVALSHA and fall back to EVAL on NOSCRIPT (a restarted
// server, a new cluster node); a pipeline has no such fallback. Call [Scripts.Load] before sending the scripts in a
// pipeline of your own.
package lua
