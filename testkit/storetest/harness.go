// Package storetest is the contract suite every durable backend of this
// module (durable/postgres, durable/sqlite) runs from its own tests:
//
//	func TestContract(t *testing.T) {
//		storetest.Run(t, storetest.Harness[pgx.Tx]{New: ..., Unreachable: ...})
//	}
//
// A backend is done when the suite passes unchanged. The suite uses short
// leases and retentions (tens of milliseconds) and waits for them to pass by
// polling the store, never by asserting on time.
//
// It is part of oncekey's unstable module seam (package testkit): not for
// applications, no compatibility promise between versions.
package storetest

import (
	"context"
	"testing"

	"github.com/oncekey/oncekey/durable"

	"github.com/oncekey/oncekey/durable/driver/storeapi"
)

// Harness is what a backend gives the suite.
type Harness[TTx any] struct {
	// New returns a fresh, migrated, empty store, isolated from every other
	// test (its own schema or database file). Required.
	New func(t testing.TB) storeapi.Store[TTx]

	// Unreachable returns a store whose database cannot be reached (a closed
	// pool, a port nothing listens on). Every method must return
	// durable.ErrUnavailable. Required.
	Unreachable func(t testing.TB) storeapi.Store[TTx]

	// Upgrade returns a fresh store whose table was created by the
	// migrations before 003 (001 and 002, as a database of the previous
	// release), holding one completed record for each of refs written with
	// plain SQL (keys hashed without a secret, generation 1), and then
	// migrated to the latest version with the backend's Migrate. Required.
	Upgrade func(t testing.TB, refs []durable.Ref) storeapi.Store[TTx]

	// LoseCommitAck returns a fresh store, like New, and a function arm.
	// After arm is called, the next COMMIT sent by the store is applied by
	// the database but its acknowledgement never reaches the store (the
	// connection is cut after COMMIT was sent). Nil for a backend where a
	// commit cannot be ambiguous (an in-process database); the suite then
	// logs that the case does not apply.
	LoseCommitAck func(t testing.TB) (s storeapi.Store[TTx], arm func())

	// Statements, when set, returns how many statements (round trips) the
	// store made so far; the suite checks the documented round-trip counts
	// with it: one each for a fresh Claim, a Complete, a Claim that replays
	// a finished record, and a Get.
	Statements func(s storeapi.Store[TTx]) int64

	// LockWaiters, when set, returns how many of the store's sessions are
	// waiting for a lock right now. The suite uses it to know that a
	// concurrent claimer is blocked on a row held by an open transaction
	// before it commits; without it the suite gives the claimer a short
	// head start instead (the assertions hold either way).
	LockWaiters func(s storeapi.Store[TTx]) int

	// BreakCommit, when set, makes the COMMIT of tx fail definitely: it
	// writes, in tx, to a table of the caller's own (created in tx if need
	// be) in a way that violates a deferred constraint, so the database
	// refuses the COMMIT and rolls the transaction back. The suite checks
	// that InTx reports that refusal as such, not as ErrUnavailable. Nil
	// when the backend has no deferred constraints; the suite then logs
	// that the case does not apply.
	BreakCommit func(ctx context.Context, tx TTx) error

	// TxLocksDatabase says that a transaction from InTx holds the
	// database's write lock from its start (SQLite's BEGIN IMMEDIATE), so
	// a write on its own waits for any open transaction, whatever that
	// transaction did. The suite then does not require a record's holder
	// to finish it while another transaction that claimed it without
	// acquiring is open.
	TxLocksDatabase bool

	// ExpectNew runs the suite with ClaimParams.ExpectNew set on every
	// Claim, as a Claimer sets it when Redis has just granted the key.
	// Every outcome must stay what it is without it; a Claim that replays a
	// finished record may take two round trips instead of one.
	ExpectNew bool
}

// expectNew is a store whose every Claim carries ExpectNew.
type expectNew[TTx any] struct{ storeapi.Store[TTx] }

func (s expectNew[TTx]) Claim(ctx context.Context, tx TTx, p storeapi.ClaimParams) (storeapi.ClaimResult, error) {
	p.ExpectNew = true
	return s.Store.Claim(ctx, tx, p)
}

// withExpectNew returns h with every store it makes wrapped in expectNew,
// and the functions that take a store given the backend's own.
func withExpectNew[TTx any](h Harness[TTx]) Harness[TTx] {
	wrap := func(s storeapi.Store[TTx]) storeapi.Store[TTx] { return expectNew[TTx]{s} }
	unwrap := func(s storeapi.Store[TTx]) storeapi.Store[TTx] {
		if w, ok := s.(expectNew[TTx]); ok {
			return w.Store
		}
		return s
	}
	g := h
	g.New = func(t testing.TB) storeapi.Store[TTx] { return wrap(h.New(t)) }
	g.Unreachable = func(t testing.TB) storeapi.Store[TTx] { return wrap(h.Unreachable(t)) }
	g.Upgrade = func(t testing.TB, refs []durable.Ref) storeapi.Store[TTx] { return wrap(h.Upgrade(t, refs)) }
	if h.LoseCommitAck != nil {
		g.LoseCommitAck = func(t testing.TB) (storeapi.Store[TTx], func()) {
			s, arm := h.LoseCommitAck(t)
			return wrap(s), arm
		}
	}
	if h.Statements != nil {
		g.Statements = func(s storeapi.Store[TTx]) int64 { return h.Statements(unwrap(s)) }
	}
	if h.LockWaiters != nil {
		g.LockWaiters = func(s storeapi.Store[TTx]) int { return h.LockWaiters(unwrap(s)) }
	}
	return g
}
