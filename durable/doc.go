// Package durable is the store contract the rest of oncekey programs against:
// the record of one idempotency key, its states, and the atomic operations a
// backend must provide. The durable store alone decides who owns a key; Redis
// only accelerates (see package lua).
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
//	[*] ─────────► processing      Claim inserted the record
//	processing ──► completed       Complete, fenced by the token
//	processing ──► failed          Fail: a final business rejection, stored
//	processing ──► uncertain       MarkUncertain: the external outcome is unknown
//	processing ──► processing      takeover after the lease expired (generation+1)
//	processing ──► released        Release: nothing happened; the key is free again
//	uncertain ───► completed|failed  the reconciler, after Adopt (new generation)
//
// A released record keeps its row (as processing with no owner) so that its
// generation survives: generations never go back for a key, across
// takeovers, releases and retention restarts.
//
// # The claim rule
//
// [Store.Claim] is one atomic statement (never check-then-insert). It inserts
// a processing record, or takes over an existing one when exactly one of
// these holds:
//
//   - takeover: the record is processing, its lease expired by the
//     database's clock, and the fingerprint is the same;
//   - released: the record was released; any fingerprint;
//   - restart: the record is completed or failed and past its retention
//     (expires_at); any fingerprint, the stored result is cleared. After
//     retention a retried key is a new operation: this is the documented end
//     of the guarantee.
//
// The new generation is GREATEST(proposed, stored+1). Otherwise nothing is
// written and the existing record is returned for the caller to classify:
// different fingerprint ([ErrMismatch]), finished (replay its result),
// processing with a live lease or uncertain (in progress). Processing and
// uncertain records are never restarted nor deleted when past retention; they
// are counted by [Stats] for alerting.
//
// # Fencing
//
// Complete, Fail, MarkUncertain, Renew and Release each are one UPDATE that
// matches the record's owner AND generation AND expected state. Zero rows
// means the caller's lease is gone: [ErrFenced], and the caller must not
// publish its result. When such a write, or its COMMIT, fails in a way that
// may have applied (the acknowledgement was lost), the backend re-reads the
// record and reports the truth: finished under the caller's token is success.
//
// # Clocks
//
// Every lease and retention decision uses the database's clock. No worker
// clock is read, so worker clock skew cannot break a lease.
//
// # Conformance
//
// Every backend runs the contract suite in package durabletest from its own
// tests. A backend is done when that suite passes unchanged.
package durable
