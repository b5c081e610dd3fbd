// Package durable is the store contract the rest of oncekey programs against:
// the record of one idempotency key, its states, and the atomic operations a
// backend provides. The durable store alone decides who owns a key; Redis
// only accelerates (see package lua).
//
// A [Store] comes from durable/postgres or durable/sqlite and is handed to
// claim.New; an operator reads records ([Store.Get]), watches [Stats] and
// deletes expired records ([Store.Sweep]) through it. The claim protocol the
// Claimer drives on it (Claim, Complete, Fail, MarkUncertain, Renew,
// Release, Adopt, Pending and the store's transactions) is internal to this
// module for now, so it can still change: the backends live in this
// repository and pass its contract suite. It may be published once it is
// stable. The rules below are the protocol's, and hold for every store.
//
// # Identity
//
// A [Scope] is what the caller names: tenant (from authentication, never from
// a client header), operation (for example "POST /orders") and the client's
// idempotency key. A backend never stores the raw key: it stores a hash of it
// (SHA-256, or an HMAC with a configured secret so a database dump cannot be
// matched against guessed keys). A [Ref] is that stored identity; every
// method but Claim addresses a record by its Ref, because a record read back
// from the store (by the reconciler, for example) has no raw key.
//
// # States
//
// A record is in one of four [State]s: processing, completed, failed or
// uncertain (the stored state column holds exactly these). Released is not a
// fifth state: a released record is a processing record with no owner,
// which [Record.Released] reports and [Stats.Released] counts (apart from
// [Stats.ByState]'s processing count).
//
//	[*] ─────────► processing          Claim inserted the record
//	processing ──► completed           Complete, fenced by the token
//	processing ──► failed              Fail: a final business rejection, stored
//	processing ──► uncertain           MarkUncertain: the external outcome is unknown
//	processing ──► processing          takeover after the lease expired (generation+1),
//	                                   or Adopt by the reconciler
//	processing ──► processing, no owner  Release: nothing happened; the key is free
//	                                   again (Record.Released)
//	uncertain ───► uncertain           Adopt by the reconciler (new generation, lease set)
//	uncertain ───► completed|failed    Complete or Fail by the adopter
//	uncertain ───► processing, no owner  Release by the adopter: nothing happened
//
// A released record keeps its row (processing, owner NULL) so that its
// generation survives; any claim restarts it. Generations only rise for a
// scope, across takeovers, releases, retention restarts and Sweep (see
// Generations below).
//
// # The claim rule
//
// Claim is one atomic statement (never check-then-insert). It inserts
// a processing record, or takes over an existing one when exactly one of
// these holds:
//
//   - takeover: the record is processing, its lease expired by the
//     database's clock, and the fingerprint is the same;
//   - released: the record is processing with no owner ([Record.Released]);
//     any fingerprint;
//   - restart: the record is completed or failed and past its retention
//     (expires_at); any fingerprint, the stored result is cleared. After
//     retention a retried key is a new operation: this is the documented end
//     of the guarantee.
//
// The new generation is GREATEST(proposed, stored+1) for a takeover, and
// GREATEST(proposed, stored+1, clock floor) for a fresh insert or a restart
// (see Generations). Otherwise nothing is written and the existing record is
// returned for the caller to classify:
// different fingerprint ([ErrMismatch]), finished (replay its result),
// processing with a live lease or uncertain (in progress). Processing and
// uncertain records are never restarted nor deleted when past retention; they
// are counted by [Stats] for alerting.
//
// # Generations
//
// Generations only rise for a scope, also across Sweep: a record deleted by
// Sweep leaves no row to raise, so the store raises from the database's
// clock instead. With clockMs the database's clock in whole milliseconds
// since the Unix epoch:
//
//   - an acquisition that creates or restarts a record (a fresh insert, the
//     restart of a released record or of one past retention) gets
//     GREATEST(proposed, stored+1 when the row exists, clockMs - 60000);
//   - a takeover and an adoption get GREATEST(proposed, stored+1);
//   - Sweep deletes a record only once its generation < clockMs - 120000
//     (besides its other conditions), about a minute after the record was
//     created or restarted; until then it stays.
//
// A claim that started at T could reuse a swept generation g only if
// clockMs(T) - 60000 <= g < clockMs(sweep) - 120000: it would have had to
// start more than 60 s before the sweep and still be waiting, and every
// store bounds a claim's wait (lock_timeout, the busy timeout) far below
// that: both backends reject a lock or busy timeout of 30 s or more. This
// assumes the database server's clock does not step back by more than about a
// minute; a larger step back (a badly set clock corrected backwards) could let
// a claim after a sweep reuse a generation. Redis proposes its clock in
// milliseconds - 59000 (lua/claim.lua), a second above the store's floor,
// so its proposals normally lead and are kept.
//
// # Fencing
//
// Complete, Fail, MarkUncertain, Renew and Release each are one UPDATE that
// matches the record's owner AND generation AND expected state. Zero rows
// means the caller's lease is gone: [ErrFenced], and the caller must not
// publish its result. [ErrFenced] always means "this write did not apply".
// When such a write, or its COMMIT, fails in a way that may have applied (the
// acknowledgement was lost), the backend re-reads the record and reports the
// truth: in effect under the caller's token is success; provably not applied
// (the token never held the record, or the record is still unfinished under
// it) is [ErrFenced] or a retryable [ErrUnavailable]; a record that moved on
// since (a newer owner, the record gone) leaves the outcome unknown:
// [ErrUnavailable], with a message that says so.
//
// # Retention
//
// A claim stores its retention with the record. The record expires a
// retention after it was created, and a finishing write (Complete, Fail)
// moves expires_at to at least a retention after the finish, by the
// database's clock: a record finished late (a long workflow, an uncertain
// operation reconciled after its retention) is replayed for a full
// retention, never stored already expired. A takeover raises expires_at to
// a full retention from the takeover; nothing lowers it.
//
// # Clocks
//
// Every lease and retention decision uses the database's clock. No worker
// clock is read, so worker clock skew cannot break a lease. Generations
// depend on the database's clock not stepping back by more than about a
// minute (see Generations).
//
// # Conformance
//
// Every backend runs the contract suite (testkit/storetest) from its own
// tests. A backend is done when that suite passes unchanged.
package durable
