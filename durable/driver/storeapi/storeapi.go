// Package storeapi is the claim protocol between the Claimer (package claim)
// and the durable backends of this module (durable/postgres,
// durable/sqlite): the parameters and result of a claim and the full store
// interface, with every write the Claimer, the reconciler and the sweeper
// drive. It is internal so it can still change; package durable documents
// the semantics (states, the claim rule, generations, fencing, retention),
// and testkit/storetest is the contract suite every backend passes.
//
// It is part of oncekey's unstable module seam (package driver): not for
// applications, no compatibility promise between versions.
package storeapi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
)

// ClaimParams are the arguments of [Store.Claim].
type ClaimParams struct {
	Scope durable.Scope
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
	// NoLockUnlessAcquired applies to a claim inside a transaction that
	// its caller keeps open after the claim's answer (DoTx): a claim that
	// does not acquire then leaves no lock on the record for the rest of
	// tx, so the record's holder can still write it (Complete, Renew, the
	// Reconciler's Adopt) before tx ends (issue 27 #7). PostgreSQL's claim
	// statement locks the row it refuses (ON CONFLICT DO UPDATE locks the
	// conflicting row whatever its WHERE says, and the classifying read is
	// FOR SHARE): with this set the store sends a SAVEPOINT with the claim
	// and rolls back to it when the claim did not acquire, which releases
	// those locks; an acquisition keeps the savepoint, whose
	// subtransaction commits or rolls back with tx. SQLite takes no row
	// locks: the caller's transaction holds the database's write lock from
	// its BEGIN IMMEDIATE on, with or without the claim. Without tx it
	// changes nothing. Do leaves it unset: its own transaction ends right
	// after a claim that did not acquire.
	NoLockUnlessAcquired bool
	// ExpectNew tells the store that the caller expects Scope to have no
	// record: Redis has just granted the key (Proposed is its proposal). A
	// store may then try a cheaper insert first and, when a record exists
	// after all (Redis lost it), claim as it would without the hint. Only
	// the number of statements depends on it, never the outcome.
	ExpectNew bool
	// LockFirst applies to [CommitWriter.InsertAtCommit]: before fn runs,
	// the transaction takes the key's lock (the one every Claim takes,
	// held until the transaction ends) and checks that no record of the
	// scope exists and the generation is not below the clock floor of a
	// fresh claim; otherwise nothing runs and the error is ErrExists. The
	// INSERT after fn then checks no floor, so a slow fn cannot fall below
	// it.
	// A concurrent request of the same key then waits for this one's
	// COMMIT instead of running fn beside it.
	LockFirst bool
}

// Validate checks p and returns an error that matches
// [durable.ErrInvalidScope] and names the field and why.
func (p ClaimParams) Validate() error {
	if err := p.Scope.Validate(); err != nil {
		return err
	}
	switch {
	case p.Fingerprint == "" || len(p.Fingerprint) > 256:
		return Invalid("fingerprint", "empty or longer than 256 bytes")
	case p.Owner == uuid.Nil:
		return Invalid("owner", "nil UUID")
	case p.Lease < time.Millisecond:
		return Invalid("lease", "shorter than 1ms")
	case p.Retention < time.Millisecond:
		return Invalid("retention", "shorter than 1ms")
	case p.Proposed > 1<<62:
		return Invalid("proposed", "generation out of range")
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
	Ref      durable.Ref
	// Takeover reports an acquisition that took over an expired lease of
	// the same request; Restarted one that started a new operation on a
	// released record or one past retention.
	Takeover, Restarted bool
	// Record is the existing record when not Acquired: finished (replay its
	// Result), processing with a live lease, or uncertain.
	Record *durable.Record
}

// Store is the durable source of truth with the whole claim protocol. TTx is the backend's transaction
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
// Every method bounds its round trip by ctx. Errors: [durable.ErrInvalidScope] for
// bad arguments (nothing written), [durable.ErrUnavailable] when the store cannot be
// reached, [durable.ErrFenced] for a fenced write whose token no longer holds the
// record (the write did not apply), [durable.ErrMismatch] from Claim, [durable.ErrNotFound]
// and [durable.ErrBusy] where said. A fenced write whose reply was lost and whose
// record moved on since returns ErrUnavailable: its outcome is unknown.
type Store[TTx any] interface {
	// Ref, Get, Sweep and Stats: what an operator holds.
	durable.Store[TTx]
	// The steps of a workflow (claim's Lease.Step).
	StepStore

	// Claim atomically inserts or takes over the record (see the package
	// documentation of durable for the rule) and returns ErrMismatch for a record with
	// another fingerprint. Inside tx, a concurrent claimer of the same scope
	// waits on the row until tx ends (bounded by the store's lock timeout).
	Claim(ctx context.Context, tx TTx, p ClaimParams) (ClaimResult, error)

	// Complete stores res and moves the record to completed, fenced by tok,
	// and sets its expiry to at least its retention from now. Completing
	// again with the same token and result (headers compared byte for byte)
	// succeeds.
	Complete(ctx context.Context, tx TTx, ref durable.Ref, tok fence.Token, res durable.Result) error
	// Fail stores res as a final business rejection (state failed), fenced.
	Fail(ctx context.Context, tx TTx, ref durable.Ref, tok fence.Token, res durable.Result) error
	// MarkUncertain moves a processing record to uncertain and frees its
	// lease for the reconciler, fenced.
	MarkUncertain(ctx context.Context, ref durable.Ref, tok fence.Token) error
	// Renew extends the lease to lease from now by the database's clock,
	// fenced; only a processing record, or an adopted uncertain one, is renewed.
	Renew(ctx context.Context, ref durable.Ref, tok fence.Token, lease time.Duration) error
	// Release frees a processing record for any new claim, fenced; the row
	// and its generation are kept. An uncertain record is released only by
	// the token that adopted it (its lease set; MarkUncertain's own token
	// cannot): the Reconciler's resolve said nothing happened.
	Release(ctx context.Context, tx TTx, ref durable.Ref, tok fence.Token) error

	// Adopt takes over, for the reconciler, a record that is uncertain (its
	// lease free) or processing with an expired lease, for owner (a fresh
	// random identity, required) with a lease of lease (at least 1ms). The
	// state is kept; the generation becomes GREATEST(proposed, stored+1)
	// (proposed is Redis's generation, or 0). ErrNotFound, ErrBusy otherwise.
	Adopt(ctx context.Context, ref durable.Ref, owner uuid.UUID, proposed uint64, lease time.Duration) (fence.Token, error)
	// Handover moves a processing record held by from to owner (a fresh
	// random identity, required) under generation from+1 with a lease of
	// lease from now, whether or not from's lease expired: the holder of
	// from hands its claim to a worker (an asynchronous job continuing the
	// claim that recorded it). Exactly one handover of a token succeeds;
	// every other returns ErrFenced, as does a record no longer held by
	// from. A lost reply returns ErrUnavailable (the outcome is unknown).
	Handover(ctx context.Context, ref durable.Ref, from fence.Token, owner uuid.UUID, lease time.Duration) (fence.Token, error)
	// Pending lists, oldest first, at most limit (at least 1) records the
	// reconciler should look at: processing records whose lease expired at
	// least staleFor ago by the database's clock, and uncertain records whose
	// lease is free. Released records are not listed.
	Pending(ctx context.Context, staleFor time.Duration, limit int) ([]durable.Record, error)

	// Operation reads the record whose operation identity has digest
	// ([durable.Ref.Digest]), within tenant, with one indexed read. A record
	// of another tenant is not found: ErrNotFound, as for an unknown digest,
	// so the answer never tells whether another tenant has that operation.
	Operation(ctx context.Context, tenant string, digest [32]byte) (durable.Record, error)

	// InTx runs fn in a new transaction and commits it when fn returns nil;
	// it rolls back when fn returns an error or panics (re-panicking). A
	// COMMIT the database refused (a deferred constraint violated, a
	// serialization failure) committed nothing: its error is returned as it
	// is (wrapped, never ErrUnavailable). A COMMIT whose reply was lost is
	// returned wrapped in ErrUnavailable: its outcome is unknown, and the
	// caller re-reads with Get.
	InTx(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error
}

// ValidState reports whether s is one of the four states: what a store
// checks of a state it reads back.
func ValidState(s durable.State) bool {
	switch s {
	case durable.Processing, durable.Completed, durable.Failed, durable.Uncertain:
		return true
	}
	return false
}

// Invalid returns the error of an invalid argument: it matches
// [durable.ErrInvalidScope] and says which field is wrong and why
// ("durable: invalid lease: shorter than 1ms"), like [durable.Scope.Validate].
func Invalid(field, reason string) error { return &invalidError{field: field, reason: reason} }

type invalidError struct{ field, reason string }

func (e *invalidError) Error() string {
	return fmt.Sprintf("durable: invalid %s: %s", e.field, e.reason)
}

func (e *invalidError) Is(target error) bool { return target == durable.ErrInvalidScope }

// ErrNotInserted is returned by [CommitWriter.InsertAtCommit] when the
// record could not be inserted: a record of the scope exists (committed
// before the insert, or by the transaction it waited for), or the proposed
// generation is below the database's clock floor. The transaction rolled
// back with everything fn wrote; the caller goes on with the claim.
var ErrNotInserted = errors.New("storeapi: record exists or generation below the floor; rolled back")

// ErrExists is returned by [CommitWriter.InsertAtCommit] with
// [ClaimParams.LockFirst] when a record of the scope exists, or the token's
// generation is below the clock floor at BEGIN: fn did not run, nothing
// was written, and the caller goes on with the claim.
var ErrExists = errors.New("storeapi: record exists; nothing ran")

// CommitWriter is implemented by a store that can write a request's record
// once, finished, in the round trip of the COMMIT that also commits the
// business write: the transaction is the lease. A concurrent transaction
// inserting the same scope waits on the unique index for this one, and
// fails once it commits.
type CommitWriter[TTx any] interface {
	// InsertAtCommit runs fn in a new transaction (as InTx). When fn
	// returns a state (Completed or Failed) and a result, it inserts the
	// record of p.Scope finished with them, under tok (generation and
	// owner), and commits, in one round trip. The insert requires that no
	// record of the scope exists and that tok.Generation is at least the
	// clock floor of a fresh claim; otherwise nothing commits and the
	// error is ErrNotInserted. fn's error is returned as it is, after a
	// rollback. A COMMIT refused or whose reply was lost is reported as by
	// InTx.
	InsertAtCommit(ctx context.Context, p ClaimParams, tok fence.Token, fn func(ctx context.Context, tx TTx) (durable.State, durable.Result, error)) error
}

// MaxStepResult is the largest step result a store records, in bytes.
const MaxStepResult = 1 << 20

// StepKey returns the downstream idempotency key of step name of ref's
// operation: ref.OperationID() + "/" + name, the same for every attempt.
func StepKey(ref durable.Ref, name string) string { return ref.OperationID() + "/" + name }

// ValidStepName reports whether name can name a step: 1 to 64 bytes of
// ASCII letters, digits, '-', '_' and '.'.
func ValidStepName(name string) bool {
	if len(name) == 0 || len(name) > 64 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// StepParams are the arguments of [StepStore.StartStep].
type StepParams struct {
	// Seq is the step's place in the workflow, from 0.
	Seq int
	// Name is the step's name ([ValidStepName]).
	Name string
	// Repeatable declares the step safe to run again with its key after an
	// earlier attempt started it and never finished it.
	Repeatable bool
}

// Validate checks p: an error matching [durable.ErrInvalidScope].
func (p StepParams) Validate() error {
	switch {
	case p.Seq < 0 || p.Seq > 1<<20:
		return Invalid("step", "sequence number out of range")
	case !ValidStepName(p.Name):
		return Invalid("step name", "not 1 to 64 letters, digits, '-', '_' or '.'")
	}
	return nil
}

// StepStart is what [StepStore.StartStep] found and did. At most one field
// is set; none means the step is now started under the token and its
// function must run.
type StepStart struct {
	// Finished: an earlier attempt finished the step; Result is its
	// recorded result (never nil). Nothing was written; the function must
	// not run.
	Finished bool
	Result   []byte
	// Repeated: an earlier attempt started the repeatable step and never
	// finished it; it is started again under the token and runs again with
	// the same key.
	Repeated bool
	// Uncertain: an earlier attempt started the step, not repeatable, and
	// never finished it: its effect may have happened. The step is marked
	// uncertain and the record moved to uncertain (its lease freed), in
	// the same transaction; the function must not run.
	Uncertain bool
}

// StepStore records the steps of a workflow (claim's Lease.Step). Every
// write is fenced by the token holding the record, in the record's current
// life (a record restarted as a new operation starts with no steps).
type StepStore interface {
	// StartStep records step p.Seq as started under tok, or returns what an
	// earlier attempt recorded for it (see [StepStart]). Errors:
	// durable.ErrFenced when tok does not hold the record (processing),
	// durable.ErrStepOrder when the recorded step p.Seq has another name
	// (nothing written), ErrUnavailable (the outcome is unknown: the step
	// may be started under tok, and its function has not run).
	StartStep(ctx context.Context, ref durable.Ref, tok fence.Token, p StepParams) (StepStart, error)
	// FinishStep records result (at most MaxStepResult bytes) for step seq,
	// started under tok, while tok holds the record. Recording the same
	// result again succeeds. ErrFenced otherwise.
	FinishStep(ctx context.Context, ref durable.Ref, tok fence.Token, seq int, result []byte) error
	// Steps lists the steps of the record's current life in order, with
	// their results when results is set.
	Steps(ctx context.Context, ref durable.Ref, results bool) ([]durable.Step, error)
	// SettleStep settles step seq, left started or uncertain by an earlier
	// attempt, for tok, which holds the record (the reconciler's adoption):
	// finished with result when happened, else as never run. The record
	// then goes back to processing with its lease run out, under tok, so
	// the next claim of the same request takes it over and resumes.
	// ErrFenced when tok does not hold it; ErrNotFound when step seq is not
	// unfinished.
	SettleStep(ctx context.Context, ref durable.Ref, tok fence.Token, seq int, happened bool, result []byte) error
}

// CurrentStep returns the step an operation stopped at or runs, of steps
// as [StepStore.Steps] lists them: the one marked uncertain, else the last
// started and unfinished, else nil. The Reconciler, Claimer.Operation and
// the operator tool all name the step by this one rule.
func CurrentStep(steps []durable.Step) *durable.Step {
	var cur *durable.Step
	for i := range steps {
		switch steps[i].State {
		case durable.StepUncertain:
			return &steps[i]
		case durable.StepStarted:
			cur = &steps[i]
		}
	}
	return cur
}
