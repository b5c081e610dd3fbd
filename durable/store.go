package durable

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/fence"
)

// State is the state of a record.
type State string

// The states of a record. See the package documentation for the transitions.
const (
	Processing State = "processing"
	Completed  State = "completed"
	Failed     State = "failed"
	Uncertain  State = "uncertain"
)

// Valid reports whether s is one of the four states.
func (s State) Valid() bool {
	switch s {
	case Processing, Completed, Failed, Uncertain:
		return true
	}
	return false
}

// Finished reports whether s is completed or failed: a state whose result is
// replayed.
func (s State) Finished() bool { return s == Completed || s == Failed }

// Result is the stored representation of a finished operation, replayed to
// every retry.
type Result struct {
	// StatusCode is the HTTP-like status of the result (for example 201 or
	// 402). Zero is allowed for non-HTTP callers.
	StatusCode int
	// Headers are the stored response headers (canonical names).
	Headers map[string][]string
	// Body is the stored response body. It is never nil in a record read
	// back from a store that holds a result; an empty body is empty.
	Body []byte
	// Version is the version of the stored representation, chosen by the
	// caller, so a service can evolve its response format.
	Version int
	// ResourceID optionally names the resource the operation created.
	ResourceID string
}

// Record is the durable state of one idempotency key.
type Record struct {
	Ref         Ref
	Fingerprint string
	State       State
	// Token is the current fencing token. Its Owner is uuid.Nil for a
	// released record.
	Token fence.Token
	// LeaseRemaining is how long the current lease still runs by the
	// database's clock when the record was read; zero when it expired or
	// there is none. It is measured by the store, never by a worker's clock.
	LeaseRemaining time.Duration
	// Released reports whether the record was released: processing with no
	// owner, free for any new claim.
	Released bool
	// Result is set for completed and failed records.
	Result *Result
	// Takeovers counts how often the record was taken over after a lease
	// expired (including adoptions by the reconciler).
	Takeovers   int
	CreatedAt   time.Time
	CompletedAt time.Time // zero unless finished
	ExpiresAt   time.Time
	// ExpiresIn is ExpiresAt minus the database's clock when the record was
	// read: how long the guarantee still holds. Zero or negative when the
	// record is past its retention. The Redis copy of a result is cached
	// for no longer than this.
	ExpiresIn time.Duration
}

// ClaimParams are the arguments of [Store.Claim].
type ClaimParams struct {
	Scope Scope
	// Fingerprint is the canonical fingerprint of the request (package
	// canon). Required, at most 256 bytes.
	Fingerprint string
	// Proposed is the generation proposed by Redis, or 0 without Redis. The
	// store uses GREATEST(Proposed, stored+1) for a takeover and
	// GREATEST(Proposed, stored+1, clock floor) for a created or restarted
	// record (see the package documentation); the returned token is the
	// store's.
	Proposed uint64
	// Owner is a fresh random identity for this claim; required.
	Owner uuid.UUID
	// Lease is how long the claim holds the key by the database's clock;
	// at least 1ms.
	Lease time.Duration
	// Retention is how long the record is kept after it is created, and
	// again after it finishes (Complete, Fail): the guarantee ends then. The
	// store keeps it with the record. At least 1ms (short retentions are for
	// tests).
	Retention time.Duration
}

// Validate checks p and returns a *[ScopeError] (matching [ErrInvalidScope]).
func (p ClaimParams) Validate() error {
	if err := p.Scope.Validate(); err != nil {
		return err
	}
	switch {
	case p.Fingerprint == "" || len(p.Fingerprint) > 256:
		return &ScopeError{Field: "fingerprint", Reason: "empty or longer than 256 bytes"}
	case p.Owner == uuid.Nil:
		return &ScopeError{Field: "owner", Reason: "nil UUID"}
	case p.Lease < time.Millisecond:
		return &ScopeError{Field: "lease", Reason: "shorter than 1ms"}
	case p.Retention < time.Millisecond:
		return &ScopeError{Field: "retention", Reason: "shorter than 1ms"}
	case p.Proposed > 1<<62:
		return &ScopeError{Field: "proposed", Reason: "generation out of range"}
	}
	return nil
}

// ClaimResult is what [Store.Claim] returns.
type ClaimResult struct {
	// Acquired reports whether this claim now holds the key. Then Token is
	// the store's token (its generation may differ from the proposal) and
	// Record is nil.
	Acquired bool
	Token    fence.Token
	Ref      Ref
	// Takeover reports an acquisition that took over an expired lease of
	// the same request; Restarted one that started a new operation on a
	// released record or one past retention.
	Takeover, Restarted bool
	// Record is the existing record when not Acquired: finished (replay its
	// Result), processing with a live lease, or uncertain.
	Record *Record
}

// Stats summarizes the store for metrics and alerting.
type Stats struct {
	// ByState counts records per state (released records excluded).
	ByState map[State]int64
	// Released counts released records not yet swept.
	Released int64
	// OldestUnexpiredAge is the age of the oldest record not yet past its
	// retention; zero when there is none.
	OldestUnexpiredAge time.Duration
	// StaleProcessing counts processing records whose lease expired and
	// that no one took over yet.
	StaleProcessing int64
	// ExpiredUnswept counts finished or released records past retention that
	// Sweep has not deleted yet (sweep lag), including those it holds back
	// until the clock passes their generation by the sweep margin (about a
	// minute after their creation).
	ExpiredUnswept int64
	// ExpiredStuck counts processing and uncertain records past retention:
	// never deleted, to be looked at.
	ExpiredStuck int64
	// Takeovers is the sum of takeovers over all records.
	Takeovers int64
}

// Store is the durable source of truth. TTx is the backend's transaction
// type (pgx.Tx for PostgreSQL, *sql.Tx for SQLite).
//
// Claim, Complete, Fail and Release take a tx: the zero TTx (nil for both
// backends) runs the write on its own, and a transaction from [Store.InTx]
// runs it inside that transaction, so a claim, the caller's business write
// and the completion commit together (river's executor, in one parameter
// instead of a twin ...Tx method per write). Inside tx the write's outcome is
// the transaction's: nothing is re-read after a lost reply, since the COMMIT
// decides.
//
// Every method bounds its round trip by ctx. Errors: [ErrInvalidScope] for
// bad arguments (nothing written), [ErrUnavailable] when the store cannot be
// reached, [ErrFenced] for a fenced write whose token no longer holds the
// record (the write did not apply), [ErrMismatch] from Claim, [ErrNotFound]
// and [ErrBusy] where said. A fenced write whose reply was lost and whose
// record moved on since returns ErrUnavailable: its outcome is unknown.
type Store[TTx any] interface {
	// Ref returns the stored identity of a scope (hashing the key as this
	// store is configured to). It returns ErrInvalidScope for an invalid scope.
	Ref(s Scope) (Ref, error)

	// Claim atomically inserts or takes over the record (see the package
	// documentation for the rule) and returns ErrMismatch for a record with
	// another fingerprint. Inside tx, a concurrent claimer of the same scope
	// waits on the row until tx ends (bounded by the store's lock timeout).
	Claim(ctx context.Context, tx TTx, p ClaimParams) (ClaimResult, error)

	// Complete stores res and moves the record to completed, fenced by tok,
	// and sets its expiry to at least its retention from now. Completing
	// again with the same token and result (headers compared byte for byte)
	// succeeds.
	Complete(ctx context.Context, tx TTx, ref Ref, tok fence.Token, res Result) error
	// Fail stores res as a final business rejection (state failed), fenced.
	Fail(ctx context.Context, tx TTx, ref Ref, tok fence.Token, res Result) error
	// MarkUncertain moves a processing record to uncertain and frees its
	// lease for the reconciler, fenced.
	MarkUncertain(ctx context.Context, ref Ref, tok fence.Token) error
	// Renew extends the lease to lease from now by the database's clock,
	// fenced; only a processing record, or an adopted uncertain one, is renewed.
	Renew(ctx context.Context, ref Ref, tok fence.Token, lease time.Duration) error
	// Release frees a processing record for any new claim, fenced; the row
	// and its generation are kept.
	Release(ctx context.Context, tx TTx, ref Ref, tok fence.Token) error

	// Adopt takes over, for the reconciler, a record that is uncertain (its
	// lease free) or processing with an expired lease, for owner (a fresh
	// random identity, required) with a lease of lease (at least 1ms). The
	// state is kept; the generation becomes GREATEST(proposed, stored+1)
	// (proposed is Redis's generation, or 0). ErrNotFound, ErrBusy otherwise.
	Adopt(ctx context.Context, ref Ref, owner uuid.UUID, proposed uint64, lease time.Duration) (fence.Token, error)
	// Pending lists, oldest first, at most limit (at least 1) records the
	// reconciler should look at: processing records whose lease expired at
	// least staleFor ago by the database's clock, and uncertain records whose
	// lease is free. Released records are not listed.
	Pending(ctx context.Context, staleFor time.Duration, limit int) ([]Record, error)

	// Get reads a record; ErrNotFound when there is none.
	Get(ctx context.Context, ref Ref) (Record, error)
	// Sweep deletes at most batch finished or released records past their
	// retention whose generation is below the database's clock in
	// milliseconds minus 120000, without blocking claims, and returns how
	// many it deleted. Processing and uncertain records are never deleted.
	Sweep(ctx context.Context, batch int) (int, error)
	// Stats summarizes the store.
	Stats(ctx context.Context) (Stats, error)

	// InTx runs fn in a new transaction and commits it when fn returns nil;
	// it rolls back when fn returns an error or panics (re-panicking). A
	// COMMIT the database refused (a deferred constraint violated, a
	// serialization failure) committed nothing: its error is returned as it
	// is (wrapped, never ErrUnavailable). A COMMIT whose reply was lost is
	// returned wrapped in ErrUnavailable: its outcome is unknown, and the
	// caller re-reads with Get.
	InTx(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error
}
