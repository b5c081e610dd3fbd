package durable

import (
	"context"
	"time"

	"github.com/oncekey/oncekey/durable/driver/txmark"
	"github.com/oncekey/oncekey/fence"
)

// State is the state of a record.
type State string

// The four states of a record, the values of its stored state column. See
// the package documentation for the transitions. A released record is not
// a state of its own: it is Processing with [Record.Released] set.
const (
	Processing State = "processing"
	Completed  State = "completed"
	Failed     State = "failed"
	Uncertain  State = "uncertain"
)

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
	// Released reports whether the record was released: its State is
	// Processing and it has no owner (the row's owner_token is NULL), so it
	// is free for any new claim. It is the only representation of a
	// release: there is no released State.
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
	// Step is the step of a workflow (claim's Lease.Step) that an
	// uncertain operation stopped at, or that a processing one started
	// last and has not finished; nil when there is none. Only the reads
	// that say so fill it in: the Reconciler's (for its resolve function),
	// claim's Claimer.Operation and the operator tool's; a claim's answer
	// does not.
	Step *Step
}

// Stats summarizes the store for metrics and alerting. A store computes it
// at a cost that need not grow with its table: durable/postgres counts the
// small sets exactly from partial indexes and, on a table above 1 MiB,
// estimates the completed and failed totals from the planner's statistics
// (see its Stats).
type Stats struct {
	// ByState counts records per state (released records excluded). The
	// counts of Completed and Failed may be estimates (durable/postgres,
	// on a table above 1 MiB); Processing and Uncertain are exact.
	ByState map[State]int64
	// Released counts released records not yet swept.
	Released int64
	// OldestUnexpiredAge is the age of the oldest record not yet past its
	// retention; zero when there is none. durable/postgres, on a table above
	// 1 MiB, takes for finished and released records the age of the one
	// whose retention ends first: the oldest when they share one retention.
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
	// Durability is "" when a commit the database acknowledged survives a
	// crash and a failover; otherwise it names each setting that can lose
	// one and the value to set (see postgres.CheckDurability). A lost
	// commit is a claim or completion that can run again.
	Durability string
}

// Store is the durable source of truth, as an operator holds it: a store
// from durable/postgres or durable/sqlite, passed to claim.New. TTx is the
// backend's transaction type (pgx.Tx for PostgreSQL, *sql.Tx for SQLite),
// the one the Claimer hands to the function it runs.
//
// The claim protocol the Claimer drives (claim, complete, fail, renew,
// release, adopt, transactions) is not part of this interface: it is
// package durable/driver/storeapi, the unstable seam between this module and the
// stores of this repository (durable/postgres here, durable/sqlite in a
// module of its own), so it can still change (see the package
// documentation). Every store of this repository implements it.
//
// Only the stores of this repository implement Store (the embedded
// interface, durable/driver/txmark's, has an unexported method, which also ties a
// store to its TTx).
//
// Every method bounds its round trip by ctx. Errors: [ErrInvalidScope] for
// bad arguments, [ErrUnavailable] when the store cannot be reached,
// [ErrNotFound] where said.
type Store[TTx any] interface {
	txmark.Marked[TTx]

	// Ref returns the stored identity of a scope (hashing the key as this
	// store is configured to). It returns ErrInvalidScope for an invalid scope.
	Ref(s Scope) (Ref, error)
	// Get reads a record; ErrNotFound when there is none.
	Get(ctx context.Context, ref Ref) (Record, error)
	// Sweep deletes at most batch finished or released records past their
	// retention whose generation is below the database's clock in
	// milliseconds minus 120000, without blocking claims, and returns how
	// many it deleted. Processing and uncertain records are never deleted.
	Sweep(ctx context.Context, batch int) (int, error)
	// Stats summarizes the store.
	Stats(ctx context.Context) (Stats, error)
}
