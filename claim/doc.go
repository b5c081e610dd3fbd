// Package claim is the public API of oncekey: it makes a retried request
// execute once and return the same answer.
//
// A [Claimer] runs the claim protocol. Redis (optional, through package lua)
// answers duplicates of in-flight and finished operations without touching
// the database and proposes generations; the durable store (package
// durable: PostgreSQL in production, SQLite embedded) arbitrates every claim
// and fences every completion. If Redis loses data, fails over, or is down,
// nothing executes twice; if the durable store is down, the claim fails
// closed with [ErrUnavailable] and nothing executes.
//
// # Two modes
//
// [Claimer.Do] claims the key, runs the business write and stores its result
// in ONE transaction of the durable store: a crash before the commit leaves
// nothing, after it everything. Use it when the effect is a database write.
// [Claimer.DoTx] does the same in a transaction the caller began and
// commits, and returns the Redis step to run after that commit.
//
// [Claimer.Claim] returns a [Lease] for workflow work that calls other
// systems: the claim commits on its own, the worker keeps the lease alive
// ([Lease.KeepAlive]), passes [Lease.OperationID] downstream as that system's
// idempotency key, and completes with [Lease.Complete], fenced. A worker
// whose lease expired and was taken over gets [ErrFenced] and must not
// publish its result.
//
// [Claimer.Operation] reads an operation by its identity within a tenant,
// for a caller that polls it (package claimhttp serves it over HTTP;
// claim/claimriver, a module of its own, runs operations asynchronously on
// River).
//
// # After the work started
//
// Once work under a [Lease] has started, an external effect may have
// happened. From then on the only safe outcomes are [Lease.Complete],
// [Lease.Fail] and [Lease.MarkUncertain] ("do not run again; reconcile").
// [Lease.Release] is the application's statement that nothing happened; the
// library never calls it on its own after the start. A renewal that failed
// ([ErrLeaseExpired] from KeepAlive) does not mean the key was lost: a
// fenced Complete still succeeds if no one took it over, so try it. When
// nothing can be written at all (the store is down), leave the record
// processing: retries see it in progress, and after the lease a takeover
// (or the [Reconciler]) decides, as after a crash. Keep the work alive past
// its client: pass KeepAlive a context detached from request cancellation
// (context.WithoutCancel).
//
// # What a retry gets
//
//   - [Replayed]: the stored result, completed or failed, byte for byte.
//   - [InProgress]: the first request still runs; retry after
//     [Outcome.RetryAfter] (or wait, [WithWait]; or poll, [WithPoll]).
//   - [Uncertain]: the first request's outcome is unknown; a [Reconciler]
//     resolves it. Nothing runs again on its own.
//   - [ErrMismatch]: the key was used for a different request.
//
// # Retention
//
// Each record lasts the retention (default 24h, per operation with
// [WithOperationRetention]) from when it was first accepted, and at least a
// full retention from when it finished: an operation that finished late (a
// long workflow, a reconciliation) is still replayed for the whole window.
// After it the guarantee is gone: a retried key is a new operation, under a
// higher generation than any before it. Redis never caches a result past
// the record's retention. Records past their retention stay in the store
// until a sweep deletes them: run [Claimer.RunSweeper] beside the service
// (or [Claimer.Sweep] from a scheduled job).
//
// # Configuration
//
// [New] takes functional options (With...), [NewReconciler] takes
// [ReconcilerOption] values ([WithStaleAfter], [WithSkip], [WithBatch]),
// and the two loops take their interval: [Claimer.RunSweeper] and
// [Reconciler.Run]. Every error about configuration rather than data (a bad
// option, a lease that breaks the lease rule of [ErrInvalidLease], a
// [Request.Lease] included, a nil function) matches [ErrConfig]; nothing
// was reserved.
//
// Every lease, the Claimer's ([WithLease]) and a [Request.Lease], follows
// one rule: zero means the default, and otherwise it is at least 100ms,
// longer than an explicit start margin and not longer than the
// operation's retention (see [ErrInvalidLease] for why 100ms).
//
// # Clocks
//
// Lease expiry is decided by the database's clock and Redis's TTLs, never a
// worker's clock. A worker measures its own deadline from when it sent the
// claim or its last renewal, on the monotonic clock (so it errs early), does
// not start work with less than the start margin left ([WithStartMargin]),
// and [Lease.KeepAlive] cancels the work when only that margin is left of a
// lease it could not renew: before another worker can take the key over.
//
// # Metrics
//
// With [WithMeterProvider], a Claimer records these OpenTelemetry
// instruments (meter "github.com/oncekey/oncekey/claim"). Attributes are
// low-cardinality words only: never a tenant, key, operation identity or
// body.
//
//	Name                              Kind        Unit  Attributes, meaning
//	oncekey.claims                    counter           outcome: acquired, executed, replayed, in_progress,
//	                                                    uncertain, mismatch, invalid, unavailable,
//	                                                    lease_expired, error
//	oncekey.claim.duration            histogram   s     outcome, as above: claim latency
//	oncekey.mismatches                counter           keys reused with a different request
//	oncekey.replays                   counter           source: redis or durable
//	oncekey.takeovers                 counter           expired leases taken over, reconciler adoptions included
//	oncekey.fenced                    counter           completions or renewals rejected by the fence
//	oncekey.uncertain                 counter           leases marked uncertain
//	oncekey.reconciled                counter           result: completed, failed, released, unknown, skipped, error
//	oncekey.waits.woken               counter           waiting duplicates (WithWait) woken by the holder's
//	                                                    finish through Redis, rather than by their poll
//	oncekey.redis.fallbacks           counter           claims that went to the durable store alone
//	oncekey.redis.breaker             gauge             0 closed, 1 half-open, 2 open
//	oncekey.redis.breaker.opens       counter           times the breaker opened (from closed): claims then
//	                                                    went to the durable store alone until it closed
//	oncekey.redis.eviction            gauge             1 when maxmemory-policy is not noeviction
//	oncekey.durable.degraded          gauge             1 when the database can lose acknowledged commits
//	                                                    (read once, on the first claim, and with Stats)
//	oncekey.records                   gauge             state: records by state
//	oncekey.records.oldest_age        gauge       s     age of the oldest record within retention
//	oncekey.records.stale_processing  gauge             processing records whose lease expired
//	oncekey.records.expired_unswept   gauge             finished records past retention, not swept yet
//	oncekey.records.expired_stuck     gauge             processing or uncertain records past retention
//	                                                    (never deleted: look at them)
//
// The record gauges read the store's Stats at most every 10 seconds.
//
// # Traces
//
// With [WithTracerProvider], a Claimer records these spans (tracer
// "github.com/oncekey/oncekey/claim"). No span name, attribute, event or
// status holds a raw key, tenant or body: an operation is named by its
// identity (oncekey.operation_id, a hash), and an error's status by its
// kind, never its message.
//
//	Span                          Parent       Attributes, meaning
//	oncekey.claim                 the caller   one per Claimer.Claim or Claimer.Do call:
//	                                           oncekey.mode (claim, do), oncekey.operation (the
//	                                           operation name), oncekey.outcome (as the metric),
//	                                           oncekey.operation_id, oncekey.redis.answered (bool),
//	                                           oncekey.generation (acquired, or the record's),
//	                                           oncekey.takeover (bool), oncekey.replay (bool),
//	                                           oncekey.replay.source (redis, durable) and
//	                                           oncekey.state on a replay; oncekey.durable.read
//	                                           (absent, or the state read) when Redis sent the
//	                                           claim to read the record (a tentative lease, a
//	                                           finished marker); status Error with the outcome
//	                                           for an error
//	oncekey.redis.claim           claim        claim.lua: oncekey.redis.result (acquired, cached,
//	                                           busy, finished, mismatch, error, breaker_open)
//	oncekey.durable.transaction   claim        one of Do's transactions: on PostgreSQL the key's
//	                                           lock and check, the function and the record inserted
//	                                           with the commit (with WithWriteAtCommit, without
//	                                           the lock), oncekey.durable.result (inserted, or
//	                                           existing when the record was there: Do then reads
//	                                           it, and claims it in a second transaction unless it
//	                                           is finished); on SQLite, and for a key with a
//	                                           record, the claim, the function, the result and
//	                                           the commit
//	oncekey.durable.claim         claim or     the store's claim: oncekey.durable.result
//	                              transaction  (acquired, existing, or the error's kind)
//	oncekey.finish                the caller   one per Lease.Complete, Fail, MarkUncertain or
//	                                           Release: oncekey.state (completed, failed,
//	                                           uncertain, released), oncekey.fenced (bool),
//	                                           oncekey.generation, oncekey.operation_id; linked to
//	                                           the oncekey.claim span that acquired the lease
//	oncekey.durable.finish        finish or    the store's fenced write
//	                              reconcile
//	oncekey.reconcile             the caller   one per record a Reconciler pass handles:
//	                                           oncekey.reconcile.result (completed, failed,
//	                                           unknown, skipped, error), oncekey.generation (the
//	                                           adopted one), oncekey.operation_id; the resolve
//	                                           function runs under it
//	oncekey.durable.adopt         reconcile    the store's adoption of the record
//
// The Redis steps after the durable decision are events on the span they
// belong to, each with oncekey.ok (bool): oncekey.redis.syncgen (Redis
// raised to the durable generation), oncekey.redis.release (a Redis lease
// dropped), oncekey.redis.cache (a result cached). Renewals are not traced.
//
// A downstream call is joined to its claim by the operation identity: it is
// an attribute of the oncekey.claim, oncekey.finish and oncekey.reconcile
// spans, and, with a TracerProvider set, the
// baggage member oncekey.operation_id of the work's context (the one
// [Lease.KeepAlive] returns, the one [Claimer.Do] passes its function, and
// the one a [Reconciler] passes its resolve function),
// so a baggage propagator sends it downstream, where it is the idempotency
// key the work passes anyway (Lease.OperationID). Baggage goes to every
// service the work calls: the identity is a hash that reveals neither
// tenant nor key.
package claim
