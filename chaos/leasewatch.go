package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/oncekey/oncekey/chaos/internal/history"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// noLiveLeaseTakeover is the invariant a leaseWatch checks: no claim takes
// over a lease before it ran out by the database's clock.
const noLiveLeaseTakeover = "no-live-lease-takeover"

// leaseWatch is a durable store seen through a watch on its leases: it
// notes, from the worker's side, the earliest moment each lease can run
// out, and reports a takeover that returned before it. A claim or a renewal
// sent at t runs its statement after t and sets the lease to end a lease's
// length after that, by the database's clock; a takeover needs the
// database's clock past that end. So at least a lease's length passes
// between t and the return of the takeover's call, whatever the offset
// between the database's clock and the suite's (only elapsed times are
// compared, both on the suite's monotonic clock). A takeover that returned
// sooner took over a live lease: leases measured by some other clock than
// the database's.
type leaseWatch struct {
	storeapi.Store[pgxTx]
	e *env
	f *leaseFloors
}

// leaseFloors are the floors of a scenario's leases, shared by the
// watches of all its clients, and what each takeover found.
type leaseFloors struct {
	mu sync.Mutex
	m  map[[32]byte]leaseFloor
	// tried is when each token's owner last sent a claim or a renewal,
	// accepted or not: the renewal loop's last sign of life.
	tried map[fence.Token]time.Time
	// lapses are the takeovers of leases that had run out, per key.
	lapses map[[32]byte][]lapse
}

// lapse is a takeover of a lease that had run out: generation to took
// over from, idle after from's owner last sent a claim or a renewal.
// KeepAlive sends one every third of the lease, so idle well past a lease
// means the owner sent none for that long (its process stalled), and
// idle under a lease that its renewals were sent but did not land in time.
type lapse struct {
	from, to uint64
	idle     time.Duration
}

type leaseFloor struct {
	tok   fence.Token
	until time.Time
}

// floorSlack absorbs the granularity of the two readings of one clock.
const floorSlack = 5 * time.Millisecond

func newLeaseFloors() *leaseFloors {
	return &leaseFloors{m: map[[32]byte]leaseFloor{}, tried: map[fence.Token]time.Time{}, lapses: map[[32]byte][]lapse{}}
}

// reported reports whether a takeover by generation to of key was noted;
// f.mu is held.
func (f *leaseFloors) reported(key [32]byte, to uint64) bool {
	for _, l := range f.lapses[key] {
		if l.to == to {
			return true
		}
	}
	return false
}

// explain describes the takeovers of key's leases that had run out, for a
// violation's detail: "" when there were none.
func (f *leaseFloors) explain(key [32]byte, lease time.Duration) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, l := range f.lapses[key] {
		why := "its renewals were sent but none landed in time"
		if l.idle > lease {
			why = "its owner sent no renewal for longer than the lease (the process stalled)"
		}
		fmt.Fprintf(&b, "; generation %d took over generation %d's lease after it ran out: %s, %v after the last one was sent (lease %v)",
			l.to, l.from, why, l.idle.Round(time.Millisecond), lease)
	}
	return b.String()
}

// InsertAtCommit is the watched store's: a write at commit takes no lease.
func (w *leaseWatch) InsertAtCommit(ctx context.Context, p storeapi.ClaimParams, tok fence.Token, fn func(ctx context.Context, tx pgxTx) (durable.State, durable.Result, error)) error {
	return insertAtCommit(ctx, w.Store, p, tok, fn)
}

// insertAtCommit is st's write at commit when st has one (the PostgreSQL
// store, or a layer over it that passes it on). Otherwise it returns
// ErrNotInserted without running fn: the Claimer's Do then claims first,
// through st.
func insertAtCommit(ctx context.Context, st storeapi.Store[pgxTx], p storeapi.ClaimParams, tok fence.Token, fn func(ctx context.Context, tx pgxTx) (durable.State, durable.Result, error)) error {
	if cw, ok := st.(storeapi.CommitWriter[pgxTx]); ok {
		return cw.InsertAtCommit(ctx, p, tok, fn)
	}
	return storeapi.ErrNotInserted
}

func (e *env) watchLeases(st storeapi.Store[pgxTx], f *leaseFloors) *leaseWatch {
	return &leaseWatch{Store: st, e: e, f: f}
}

// acquired checks an acquisition sent at start that returned at end, and,
// when set is true, records its lease.
func (w *leaseWatch) acquired(res storeapi.ClaimResult, start, end time.Time, lease time.Duration, set bool) {
	if !res.Acquired {
		return
	}
	k := res.Ref.KeyHash
	w.f.mu.Lock()
	prev, ok := w.f.m[k]
	if set && (!ok || res.Token.Generation >= prev.tok.Generation) {
		w.f.m[k] = leaseFloor{tok: res.Token, until: start.Add(lease)}
		w.f.tried[res.Token] = start
	}
	live := ok && res.Takeover && res.Token.Generation > prev.tok.Generation && end.Add(floorSlack).Before(prev.until)
	if ok && res.Takeover && res.Token.Generation > prev.tok.Generation && !live {
		// The first answer that reports the takeover describes it (a
		// claim retried after an ambiguous reply reports it again).
		if t, seen := w.f.tried[prev.tok]; seen && !w.f.reported(k, res.Token.Generation) {
			w.f.lapses[k] = append(w.f.lapses[k], lapse{from: prev.tok.Generation, to: res.Token.Generation, idle: end.Sub(t)})
		}
	}
	w.f.mu.Unlock()
	if live {
		w.e.violation(noLiveLeaseTakeover, history.OpName(w.e.keyspace[k], 1),
			"generation %d took over generation %d %v before its lease could have run out by the database's clock",
			res.Token.Generation, prev.tok.Generation, prev.until.Sub(end).Round(time.Millisecond))
	}
}

// Claim is checked; the lease of a claim inside tx is not recorded (it
// holds only if the transaction commits, and then it is finished in it).
func (w *leaseWatch) Claim(ctx context.Context, tx pgxTx, p storeapi.ClaimParams) (storeapi.ClaimResult, error) {
	start := time.Now()
	res, err := w.Store.Claim(ctx, tx, p)
	if err == nil {
		w.acquired(res, start, time.Now(), p.Lease, tx == nil)
	}
	return res, err
}

func (w *leaseWatch) Renew(ctx context.Context, ref durable.Ref, tok fence.Token, lease time.Duration) error {
	start := time.Now()
	w.f.mu.Lock()
	if _, ok := w.f.tried[tok]; ok {
		w.f.tried[tok] = start
	}
	w.f.mu.Unlock()
	err := w.Store.Renew(ctx, ref, tok, lease)
	if err == nil {
		w.f.mu.Lock()
		if f, ok := w.f.m[ref.KeyHash]; ok && f.tok == tok && start.Add(lease).After(f.until) {
			f.until = start.Add(lease)
			w.f.m[ref.KeyHash] = f
		}
		w.f.mu.Unlock()
	}
	return err
}

// Adopt's and Handover's new tokens start leases of their own: recorded
// as a claim's.
func (w *leaseWatch) Adopt(ctx context.Context, ref durable.Ref, owner uuid.UUID, proposed uint64, lease time.Duration) (fence.Token, error) {
	start := time.Now()
	tok, err := w.Store.Adopt(ctx, ref, owner, proposed, lease)
	if err == nil {
		w.started(ref, tok, start, lease)
	}
	return tok, err
}

func (w *leaseWatch) Handover(ctx context.Context, ref durable.Ref, from fence.Token, owner uuid.UUID, lease time.Duration) (fence.Token, error) {
	start := time.Now()
	tok, err := w.Store.Handover(ctx, ref, from, owner, lease)
	if err == nil {
		w.started(ref, tok, start, lease)
	}
	return tok, err
}

func (w *leaseWatch) started(ref durable.Ref, tok fence.Token, start time.Time, lease time.Duration) {
	w.f.mu.Lock()
	defer w.f.mu.Unlock()
	if prev, ok := w.f.m[ref.KeyHash]; !ok || tok.Generation >= prev.tok.Generation {
		w.f.m[ref.KeyHash] = leaseFloor{tok: tok, until: start.Add(lease)}
		w.f.tried[tok] = start
	}
}
