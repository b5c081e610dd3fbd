// Package lua holds the Redis scripts of oncekey's fast path and the
// [Options] that configure it: pass them to claim.WithRedis.
//
//	claimer, err := claim.New[pgx.Tx](store, claim.WithRedis(rdb, lua.Options{Prefix: "shop"}))
//
// Redis accelerates; it is never the guarantee. It answers duplicates of
// in-flight and finished keys without touching the database, collapses a
// burst of concurrent duplicates to one database claim, and proposes
// generations. The durable store (package durable) arbitrates every claim
// and fences every completion, so Redis losing data, failing over to a
// replica that missed writes, running a script twice or being down never
// lets a second effect through: the Claimer then goes to the durable store
// alone.
//
// # Scripts
//
// Five scripts, embedded in [Sources]: claim.lua (take the lease or say
// why not, proposing a generation), renew.lua, complete.lua (cache a
// finished result and drop the lease), release.lua and syncgen.lua (give
// this owner's lease the database's generation). Each is loaded after
// record.lua, a prelude that parses the record's key. Each file's header
// states its keys, arguments, reply, rules and why it is safe to run again;
// that header is the one description of the script. Lease and expiry timing
// uses Redis's own clock (PX TTLs), never the caller's, and generations
// cross the Lua boundary as decimal strings, so generations above 2^53 stay
// exact.
//
// Invariants: no script deletes or changes another owner's lease, except
// complete.lua replacing a lease of a generation not above the result it
// caches, or a tentative lease (that result is durable, so the lease is
// stale or its holder will replay); only claim.lua
// proposes a generation, and never twice for one owner while that owner's
// lease lives.
//
// # Key layout
//
// One idempotency key (a durable.Ref) has one Redis key, a string:
//
//	<prefix>:{<h>}:rec    a lease   "L" gen ":" lease_ms ":" owner fingerprint, PX = lease
//	                      or a tentative lease, "T" and the same fields, PX = lease
//	                      or a result "R" gen ":" len(fingerprint) ":" fingerprint blob,
//	                      PX = min(record's remaining retention, CacheTTL)
//	                      or a finished marker "F" gen ":" len(fingerprint) ":" fingerprint,
//	                      PX as a result's
//
// claim.lua takes a tentative lease: the durable store has not granted the
// key yet, and the holder may find the operation finished there (Redis lost
// its copy) and only replay it. A duplicate that meets a tentative lease is
// not answered "in progress" by Redis; it reads the durable store.
// syncgen.lua (or renew.lua) confirms the lease once the store granted it:
// a confirmed lease stops a stale result from replacing it (complete.lua),
// and under the [Options].TrustLease opt-in answers
// duplicates "in progress" alone while it is young. A finished
// result too large to cache leaves the marker, so that retries replay from
// the durable store without taking a lease.
//
// One key per record keeps every script to one read and at most one write:
// a fresh claim and its completion cost 8 server calls (the completion's
// wake included), a busy duplicate 3 (its lease's age) and a replay 2
// (claim.lua's and complete.lua's headers count them). A lease and a
// cached result never coexist: the result replaces the lease.
// There is no generation counter: claim.lua proposes Redis's clock, the
// durable store decides.
//
// h is the 64 lowercase hex digits of durable.Ref.Digest, a SHA-256 over
// the length-prefixed tenant, operation and key hash. The braces make h the
// Redis Cluster hash tag, so a cluster routes by it. No tenant, operation or
// key appears in a key name, and a client key containing '{' or '}' cannot
// move the slot, because only hex sits between the braces. The prefix is
// [Options.Prefix]. Layout v1 (until 2026-12) used three keys per record
// (:lease, :gen, :result); the two layouts do not share a key, so during a
// rolling upgrade each runs beside the other, both arbitrated by the store.
//
// The blob is a compact versioned binary encoding of the
// state, status, headers, body, version and resource id. Bodies over
// [Options.MaxCachedBody] are not cached; their replays come from the
// durable store.
//
// # Client settings and re-runs
//
// go-redis re-sends a command whose reply timed out (MaxRetries defaults to
// 3), so one call can run a script up to four times on the server; this was
// measured, and a test forces it. Every script is safe to re-run, so
// MaxRetries may stay at its default. Create the client with:
//
//   - ContextTimeoutEnabled: true, so that the per-call [Options.Timeout]
//     ends a stalled socket read. With the go-redis default (false) a call
//     still returns at its timeout, but goes on in a goroutine until the
//     client's ReadTimeout, costing a goroutine per call.
//   - ReadTimeout and WriteTimeout no shorter than Timeout.
//   - Any MaxRetries (the default 3 is fine): retries happen inside the
//     per-call timeout.
//
// A call that returns an error may still have run its script: claim.lua
// may have left a lease of this owner, which expires by itself or is
// dropped by a later completion or release; the durable store's decision
// stands either way.
//
// # Breaker
//
// A circuit breaker sits in front of every call: after
// [Options.BreakerFailures] consecutive failed calls it opens for
// [Options.BreakerCoolDown], during which the Claimer uses the durable
// store alone without calling Redis; then one probe call is let through,
// whose success closes it. The Claimer logs every state change and reports
// the state as the oncekey.redis.breaker gauge (see package claim, Metrics).
//
// # Eviction
//
// Under any maxmemory-policy but noeviction Redis may evict a lease or a
// cached result. That is not fatal, since the durable store
// arbitrates, but the fast path is degraded: the Claimer reads the policy
// once, after Redis first answers a claim, and logs a warning and sets the
// oncekey.redis.eviction gauge for any other policy.
package lua
