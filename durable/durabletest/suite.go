package durabletest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
)

// Run runs the contract suite against the backend h describes. Every
// subtest gets its own store from h.New and runs in parallel with the
// others. It forces, at least: one winner among 64 concurrent claims;
// takeover only after the lease expired by the database's clock, with the
// old owner fenced; generation = GREATEST(proposed, stored+1), never
// decreasing across takeovers, releases, adoptions and retention restarts;
// ErrMismatch for another fingerprint; exact replay of completed and failed
// results; Release; retention restarts and Sweep in batches (processing and
// uncertain records kept and counted by Stats); isolation of tenants and
// operations; Claim and Complete inside InTx: commit and rollback, and a concurrent
// claimer blocked until commit; ErrUnavailable from an unreachable store;
// ErrInvalidScope with nothing written; a lost COMMIT acknowledgement
// resolved by reading; idempotent Complete; MarkUncertain, Adopt and
// Pending; Renew; Stats; a full retention after a late finish and after a
// takeover; response headers kept byte for byte; generations that rise
// across Sweep (a clock floor for created records, a clock margin for
// Sweep); a refused COMMIT reported as such, not as ErrUnavailable (with
// h.BreakCommit); and, with h.Statements, one round trip per Claim and
// Complete.
//
// The sweep and generation subtests wait for the database's clock to pass a
// new record's generation by the sweep margin: about a minute, in parallel
// with the rest.
func Run[TTx any](t *testing.T, h Harness[TTx]) {
	if h.New == nil || h.Unreachable == nil {
		t.Fatal("durabletest: Harness.New and Harness.Unreachable are required")
	}
	c := &contract[TTx]{h: h}
	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"ConcurrentClaimsAcquireExactlyOnce", c.concurrentClaims},
		{"TakeoverHappensOnlyAfterTheLeaseExpired", c.takeover},
		{"GenerationIsTheGreaterOfProposedAndStoredPlusOne", c.proposedGeneration},
		{"DifferentFingerprintIsAMismatch", c.mismatch},
		{"FinishedRecordReplaysTheStoredResult", c.replay},
		{"FailedRecordReplaysAndCannotBeCompleted", c.failReplay},
		{"CompletingTwiceWithTheSameTokenSucceeds", c.completeTwice},
		{"ReleaseFreesTheKeyAndFencesTheReleasedOwner", c.release},
		{"RecordPastRetentionIsANewOperation", c.retentionRestart},
		{"SweepDeletesOnlyFinishedExpiredRecordsInBatchesAndGenerationsRiseAcrossIt", c.sweep},
		{"TenantsAndOperationsNeverInteract", c.isolation},
		{"ClaimAndCompleteInTheCallersTransaction", c.inTx},
		{"ClaimInTxBlocksAConcurrentClaimerUntilCommit", c.claimTxBlocks},
		{"ClaimInTxRollbackLetsTheBlockedClaimerAcquire", c.claimTxRollback},
		{"UnreachableStoreReturnsErrUnavailable", c.unreachable},
		{"InvalidParametersReturnErrInvalidScopeAndWriteNothing", c.invalid},
		{"LostCommitAckIsResolvedByReadingTheRecord", c.lostCommitAck},
		{"GenerationNeverDecreases", c.monotonic},
		{"UncertainRecordIsAdoptedAndCompletedByTheAdopter", c.uncertain},
		{"AdoptingALiveLeaseIsBusy", c.adoptBusy},
		{"PendingSelectsStaleProcessingAndFreeUncertainRecords", c.pending},
		{"RenewExtendsOnlyTheOwnersLease", c.renew},
		{"StatsCountRecordsByState", c.stats},
		{"ClaimAndCompleteTakeOneRoundTripEach", c.roundTrips},
		{"RecordFinishedAfterItsRetentionKeepsAFullRetention", c.finishAfterRetention},
		{"TakeoverRaisesExpiryToAFullRetention", c.takeoverRetention},
		{"HeadersAreStoredByteForByte", c.headersExact},
		{"DefiniteCommitFailureIsNotReportedAsUnavailable", c.definiteCommitFailure},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t)
		})
	}
}

type contract[TTx any] struct{ h Harness[TTx] }

type outcome struct {
	res durable.ClaimResult
	err error
}

// 1. 64 goroutines claim one scope at once: exactly one acquires; all the
// others see its processing record.
func (c *contract[TTx]) concurrentClaims(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	sc := newScope()
	const n = 64
	out := make([]outcome, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			r, err := s.Claim(ctx, noTx[TTx](), params(sc, fp1, long, long))
			out[i] = outcome{r, err}
		})
	}
	close(start)
	wg.Wait()
	var winner fence.Token
	acquired := 0
	for i, o := range out {
		if o.err != nil {
			t.Fatalf("claim %d: %v", i, o.err)
		}
		if o.res.Acquired {
			acquired++
			winner = o.res.Token
		}
	}
	if acquired != 1 {
		t.Fatalf("%d of %d concurrent claims acquired; want exactly 1", acquired, n)
	}
	for i, o := range out {
		if o.res.Acquired {
			continue
		}
		r := o.res.Record
		if r == nil {
			t.Fatalf("claim %d: neither acquired nor given the existing record", i)
		}
		if r.State != durable.Processing || r.Released || !r.Token.Equal(winner) || r.LeaseRemaining <= 0 || r.Fingerprint != fp1 {
			t.Fatalf("claim %d saw %+v; want the winner's live processing record %v", i, *r, winner)
		}
	}
	rec := mustGet(t, s, mustRef(t, s, sc))
	checkState(t, "after the race", rec, durable.Processing)
	checkToken(t, "after the race", rec.Token, winner)
	if rec.Takeovers != 0 || winner.Generation < generationFloor(rec) {
		t.Fatalf("takeovers %d, generation %d; want 0 and a fresh generation of at least %d", rec.Takeovers, winner.Generation, generationFloor(rec))
	}
}

// 2. A takeover happens only after the lease expired by the database's
// clock; the generation rises, the old owner is fenced, the new one
// completes.
func (c *contract[TTx]) takeover(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)

	sc := newScope()
	a := mustAcquire(t, s, params(sc, fp1, long, long))
	rec := mustNotAcquire(t, s, params(sc, fp1, long, long))
	checkState(t, "live lease", rec, durable.Processing)
	checkToken(t, "live lease", rec.Token, a)
	if rec.LeaseRemaining <= 0 {
		t.Fatalf("live lease reported with LeaseRemaining %v", rec.LeaseRemaining)
	}

	sc = newScope()
	ref := mustRef(t, s, sc)
	a = mustAcquire(t, s, params(sc, fp1, short, long))
	waitLeaseExpired(t, s, ref)
	// An expired lease is not free for another request.
	_, err := s.Claim(ctx, noTx[TTx](), params(sc, fp2, long, long))
	wantErr(t, "claim with another fingerprint after expiry", err, durable.ErrMismatch)
	checkToken(t, "after the mismatch", mustGet(t, s, ref).Token, a)

	pb := params(sc, fp1, long, long)
	res, err := s.Claim(ctx, noTx[TTx](), pb)
	must(t, "takeover claim", err)
	if !res.Acquired || !res.Takeover || res.Restarted {
		t.Fatalf("takeover claim = %+v; want acquired as a takeover", res)
	}
	b := res.Token
	if b.Owner != pb.Owner || b.Generation <= a.Generation {
		t.Fatalf("takeover token %v after %v; want the new owner and a higher generation", b, a)
	}

	wantErr(t, "old owner's Complete", s.Complete(ctx, noTx[TTx](), ref, a, sampleResult()), durable.ErrFenced)
	rec = mustGet(t, s, ref)
	checkState(t, "after the fenced Complete", rec, durable.Processing)
	checkToken(t, "after the fenced Complete", rec.Token, b)
	if rec.Result != nil || rec.Takeovers != 1 {
		t.Fatalf("after the fenced Complete: result %+v, takeovers %d; want none and 1", rec.Result, rec.Takeovers)
	}
	wantErr(t, "old owner's Fail", s.Fail(ctx, noTx[TTx](), ref, a, rejection()), durable.ErrFenced)
	wantErr(t, "old owner's Renew", s.Renew(ctx, ref, a, long), durable.ErrFenced)
	wantErr(t, "old owner's MarkUncertain", s.MarkUncertain(ctx, ref, a), durable.ErrFenced)
	wantErr(t, "old owner's Release", s.Release(ctx, noTx[TTx](), ref, a), durable.ErrFenced)

	won := durable.Result{StatusCode: 200, Body: []byte("new owner"), Version: 1}
	must(t, "new owner's Complete", s.Complete(ctx, noTx[TTx](), ref, b, won))
	wantErr(t, "old owner's late Complete", s.Complete(ctx, noTx[TTx](), ref, a, sampleResult()), durable.ErrFenced)
	rec = mustGet(t, s, ref)
	checkState(t, "after completion", rec, durable.Completed)
	checkToken(t, "after completion", rec.Token, b)
	if !equalResult(rec.Result, won) {
		t.Fatalf("stored result %+v; want the new owner's %+v", rec.Result, won)
	}
}

// 3. The database's generation is GREATEST(proposed, stored+1), and the
// returned token is the database's. A record created without a (high
// enough) proposal starts at the clock floor: the database's clock in
// milliseconds since the Unix epoch minus 60000, never above the clock.
func (c *contract[TTx]) proposedGeneration(t *testing.T) {
	s := c.h.New(t)
	sc0 := newScope()
	g0 := mustAcquire(t, s, params(sc0, fp1, long, long)).Generation
	rec := mustGet(t, s, mustRef(t, s, sc0))
	if g0 < generationFloor(rec) || g0 > uint64(rec.CreatedAt.UnixMilli()) {
		t.Fatalf("fresh claim without a proposal at %v: generation %d; want between the clock floor %d and the clock %d",
			rec.CreatedAt, g0, generationFloor(rec), rec.CreatedAt.UnixMilli())
	}
	low := params(newScope(), fp1, long, long)
	low.Proposed = 10
	g := mustAcquire(t, s, low).Generation
	if rec := mustGet(t, s, mustRef(t, s, low.Scope)); g < generationFloor(rec) {
		t.Fatalf("fresh claim proposing 10: generation %d; want at least the clock floor %d", g, generationFloor(rec))
	}
	base := g0 + 1_000_000 // a proposal far above the clock floor
	sc := newScope()
	ref := mustRef(t, s, sc)
	step := func(proposed, want uint64, lease time.Duration) {
		t.Helper()
		p := params(sc, fp1, lease, long)
		p.Proposed = proposed
		tok := mustAcquire(t, s, p)
		if tok.Generation != want {
			t.Fatalf("proposed %d: generation %d; want %d", proposed, tok.Generation, want)
		}
		checkToken(t, fmt.Sprintf("stored after proposing %d", proposed), mustGet(t, s, ref).Token, tok)
	}
	step(base+10, base+10, short) // above nothing: the proposal
	waitLeaseExpired(t, s, ref)
	step(base+3, base+11, short) // below the stored one: stored+1
	waitLeaseExpired(t, s, ref)
	step(base+11, base+12, short) // equal to the stored one: stored+1
	waitLeaseExpired(t, s, ref)
	step(base+100, base+100, long) // above: the proposal
}

// 4. Same scope, different fingerprint: ErrMismatch while processing and
// after completion, and nothing changes.
func (c *contract[TTx]) mismatch(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	sc := newScope()
	ref := mustRef(t, s, sc)
	a := mustAcquire(t, s, params(sc, fp1, long, long))
	res, err := s.Claim(ctx, noTx[TTx](), params(sc, fp2, long, long))
	wantErr(t, "claim with another fingerprint while processing", err, durable.ErrMismatch)
	if res.Acquired {
		t.Fatal("a mismatching claim acquired")
	}
	rec := mustGet(t, s, ref)
	checkToken(t, "after the mismatch", rec.Token, a)
	if rec.Fingerprint != fp1 {
		t.Fatalf("fingerprint %q; want %q", rec.Fingerprint, fp1)
	}
	must(t, "Complete", s.Complete(ctx, noTx[TTx](), ref, a, sampleResult()))
	res, err = s.Claim(ctx, noTx[TTx](), params(sc, fp2, long, long))
	wantErr(t, "claim with another fingerprint after completion", err, durable.ErrMismatch)
	if res.Acquired {
		t.Fatal("a mismatching claim acquired a completed record")
	}
	rec = mustGet(t, s, ref)
	checkState(t, "after the mismatch", rec, durable.Completed)
	if !equalResult(rec.Result, sampleResult()) || rec.Fingerprint != fp1 {
		t.Fatalf("completed record changed by a mismatching claim: %+v", rec)
	}
}

// 5. A completed record returns exactly the stored status, headers, body and
// version, to Claim and to Get.
func (c *contract[TTx]) replay(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	for _, want := range []durable.Result{
		sampleResult(),
		{StatusCode: 204, Body: []byte{}}, // empty body, no headers
		{StatusCode: 200, Body: nil, Headers: map[string][]string{}}, // nil body reads back empty
		{StatusCode: 0, Body: []byte("non-HTTP"), Version: 7},
	} {
		sc := newScope()
		ref := mustRef(t, s, sc)
		a := mustAcquire(t, s, params(sc, fp1, long, long))
		must(t, "Complete", s.Complete(ctx, noTx[TTx](), ref, a, want))
		if want.Body == nil {
			want.Body = []byte{}
		}
		for _, rec := range []durable.Record{mustNotAcquire(t, s, params(sc, fp1, long, long)), mustGet(t, s, ref)} {
			checkState(t, "replay", rec, durable.Completed)
			checkToken(t, "replay", rec.Token, a)
			if !equalResult(rec.Result, want) {
				t.Fatalf("replayed result %+v; want exactly %+v", rec.Result, want)
			}
			if rec.CompletedAt.IsZero() || rec.ExpiresIn <= 0 || rec.Fingerprint != fp1 || rec.LeaseRemaining != 0 {
				t.Fatalf("completed record %+v: want CompletedAt set, ExpiresIn > 0, no lease", rec)
			}
		}
	}
}

// A failed record (a final business rejection) replays the same way and
// can be neither completed nor taken over.
func (c *contract[TTx]) failReplay(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	sc := newScope()
	ref := mustRef(t, s, sc)
	a := mustAcquire(t, s, params(sc, fp1, long, long))
	must(t, "Fail", s.Fail(ctx, noTx[TTx](), ref, a, rejection()))
	must(t, "Fail again with the same token and result", s.Fail(ctx, noTx[TTx](), ref, a, rejection()))
	wantErr(t, "Complete after Fail", s.Complete(ctx, noTx[TTx](), ref, a, sampleResult()), durable.ErrFenced)
	rec := mustNotAcquire(t, s, params(sc, fp1, long, long))
	checkState(t, "replay", rec, durable.Failed)
	if !equalResult(rec.Result, rejection()) {
		t.Fatalf("replayed %+v; want %+v", rec.Result, rejection())
	}
	_, err := s.Claim(ctx, noTx[TTx](), params(sc, fp2, long, long))
	wantErr(t, "claim with another fingerprint", err, durable.ErrMismatch)
	if !equalResult(mustGet(t, s, ref).Result, rejection()) {
		t.Fatal("failed record changed")
	}
}

// Completing again with the same token and result succeeds (a retried
// Complete after a lost reply); with another result it is fenced and changes
// nothing.
func (c *contract[TTx]) completeTwice(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	sc := newScope()
	ref := mustRef(t, s, sc)
	a := mustAcquire(t, s, params(sc, fp1, long, long))
	for _, wrong := range []fence.Token{
		{Generation: a.Generation + 1, Owner: a.Owner},
		{Generation: a.Generation, Owner: uuid.New()},
		{},
	} {
		wantErr(t, "Complete with token "+wrong.String(), s.Complete(ctx, noTx[TTx](), ref, wrong, sampleResult()), durable.ErrFenced)
		wantErr(t, "Fail with token "+wrong.String(), s.Fail(ctx, noTx[TTx](), ref, wrong, rejection()), durable.ErrFenced)
		wantErr(t, "MarkUncertain with token "+wrong.String(), s.MarkUncertain(ctx, ref, wrong), durable.ErrFenced)
		wantErr(t, "Release with token "+wrong.String(), s.Release(ctx, noTx[TTx](), ref, wrong), durable.ErrFenced)
	}
	checkState(t, "after the fenced writes", mustGet(t, s, ref), durable.Processing)
	must(t, "Complete", s.Complete(ctx, noTx[TTx](), ref, a, sampleResult()))
	must(t, "Complete again", s.Complete(ctx, noTx[TTx](), ref, a, sampleResult()))
	must(t, "Complete in tx again", s.InTx(ctx, func(ctx context.Context, tx TTx) error {
		return s.Complete(ctx, tx, ref, a, sampleResult())
	}))
	other := durable.Result{StatusCode: 500, Body: []byte("other")}
	wantErr(t, "Complete with another result", s.Complete(ctx, noTx[TTx](), ref, a, other), durable.ErrFenced)
	wantErr(t, "Fail after Complete", s.Fail(ctx, noTx[TTx](), ref, a, rejection()), durable.ErrFenced)
	wantErr(t, "MarkUncertain after Complete", s.MarkUncertain(ctx, ref, a), durable.ErrFenced)
	wantErr(t, "Release after Complete", s.Release(ctx, noTx[TTx](), ref, a), durable.ErrFenced)
	rec := mustGet(t, s, ref)
	checkState(t, "after the repeats", rec, durable.Completed)
	if !equalResult(rec.Result, sampleResult()) {
		t.Fatalf("stored result changed to %+v", rec.Result)
	}
	wrong := a
	wrong.Owner = uuid.New()
	wantErr(t, "Complete with another owner and the same generation", s.Complete(ctx, noTx[TTx](), ref, wrong, sampleResult()), durable.ErrFenced)
}

// 6. Release frees the key for a fresh claim (any fingerprint); the released
// owner can no longer write.
func (c *contract[TTx]) release(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	sc := newScope()
	ref := mustRef(t, s, sc)
	a := mustAcquire(t, s, params(sc, fp1, long, long))
	must(t, "Release", s.Release(ctx, noTx[TTx](), ref, a))
	rec := mustGet(t, s, ref)
	if !rec.Released || rec.State != durable.Processing || rec.Token.Owner != uuid.Nil ||
		rec.Token.Generation != a.Generation || rec.LeaseRemaining != 0 {
		t.Fatalf("released record %+v; want processing, released, no owner, generation %d kept", rec, a.Generation)
	}
	wantErr(t, "released owner's Complete", s.Complete(ctx, noTx[TTx](), ref, a, sampleResult()), durable.ErrFenced)
	wantErr(t, "released owner's Fail", s.Fail(ctx, noTx[TTx](), ref, a, rejection()), durable.ErrFenced)
	wantErr(t, "released owner's Renew", s.Renew(ctx, ref, a, long), durable.ErrFenced)
	wantErr(t, "released owner's MarkUncertain", s.MarkUncertain(ctx, ref, a), durable.ErrFenced)

	pb := params(sc, fp2, long, long) // a new operation: any fingerprint
	res, err := s.Claim(ctx, noTx[TTx](), pb)
	must(t, "claim after release", err)
	if !res.Acquired || !res.Restarted || res.Takeover || res.Token.Generation <= a.Generation {
		t.Fatalf("claim after release = %+v; want a restart above generation %d", res, a.Generation)
	}
	wantErr(t, "released owner's late Complete", s.Complete(ctx, noTx[TTx](), ref, a, sampleResult()), durable.ErrFenced)
	wantErr(t, "released owner's late Release", s.Release(ctx, noTx[TTx](), ref, a), durable.ErrFenced)
	must(t, "new owner's Complete", s.Complete(ctx, noTx[TTx](), ref, res.Token, sampleResult()))
	rec = mustGet(t, s, ref)
	checkToken(t, "after release and reclaim", rec.Token, res.Token)
	if rec.Fingerprint != fp2 || rec.Released {
		t.Fatalf("record %+v; want the new operation's", rec)
	}

	// Release in tx inside a transaction.
	sc = newScope()
	ref = mustRef(t, s, sc)
	a = mustAcquire(t, s, params(sc, fp1, long, long))
	must(t, "InTx Release in tx", s.InTx(ctx, func(ctx context.Context, tx TTx) error { return s.Release(ctx, tx, ref, a) }))
	if !mustGet(t, s, ref).Released {
		t.Fatal("Release in tx committed but the record is not released")
	}
}

// 7a. A finished record past its retention is claimed as a new operation
// (the documented end of the guarantee); a processing record past retention
// is not.
func (c *contract[TTx]) retentionRestart(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	for _, finish := range []struct {
		name string
		do   func(ref durable.Ref, tok fence.Token) error
	}{
		{"completed", func(ref durable.Ref, tok fence.Token) error {
			return s.Complete(ctx, noTx[TTx](), ref, tok, sampleResult())
		}},
		{"failed", func(ref durable.Ref, tok fence.Token) error { return s.Fail(ctx, noTx[TTx](), ref, tok, rejection()) }},
	} {
		sc := newScope()
		ref := mustRef(t, s, sc)
		a := mustAcquire(t, s, params(sc, fp1, long, short))
		must(t, finish.name, finish.do(ref, a))
		waitRetentionPassed(t, s, ref)
		pb := params(sc, fp2, long, long)
		res, err := s.Claim(ctx, noTx[TTx](), pb)
		must(t, "claim past retention", err)
		if !res.Acquired || !res.Restarted || res.Takeover || res.Token.Generation <= a.Generation {
			t.Fatalf("%s past retention: claim = %+v; want a restart above %d", finish.name, res, a.Generation)
		}
		rec := mustGet(t, s, ref)
		checkState(t, "restarted", rec, durable.Processing)
		checkToken(t, "restarted", rec.Token, res.Token)
		if rec.Result != nil || !rec.CompletedAt.IsZero() || rec.Fingerprint != fp2 || rec.ExpiresIn <= 0 {
			t.Fatalf("restarted record %+v: want no result, the new fingerprint, a new retention", rec)
		}
	}

	// Processing and uncertain records past retention: never restarted.
	for _, state := range []durable.State{durable.Processing, durable.Uncertain} {
		sc := newScope()
		ref := mustRef(t, s, sc)
		a := mustAcquire(t, s, params(sc, fp1, long, short))
		if state == durable.Uncertain {
			must(t, "MarkUncertain", s.MarkUncertain(ctx, ref, a))
		}
		waitRetentionPassed(t, s, ref)
		_, err := s.Claim(ctx, noTx[TTx](), params(sc, fp2, long, long))
		wantErr(t, "claim of a "+string(state)+" record past retention with another fingerprint", err, durable.ErrMismatch)
		rec := mustNotAcquire(t, s, params(sc, fp1, long, long))
		checkState(t, string(state)+" past retention", rec, state)
		checkToken(t, string(state)+" past retention", rec.Token, a)
	}
}

// 7b. Sweep deletes only finished (and released) records past retention, in
// batches; Stats reports the processing and uncertain ones it leaves. A
// record whose generation is not below the clock minus the sweep margin
// stays until the clock passes it (about a minute after its creation), so
// a scope claimed again after a sweep gets a higher generation than the
// swept record had.
func (c *contract[TTx]) sweep(t *testing.T) {
	s := c.h.New(t)
	ctx := longCtx(t)
	type rec struct {
		ref   durable.Ref
		state durable.State
		sc    durable.Scope
		tok   fence.Token
	}
	var gone, stuck, kept []rec
	create := func(retention time.Duration, end func(ref durable.Ref, tok fence.Token) error, state durable.State) rec {
		sc := newScope()
		ref := mustRef(t, s, sc)
		tok := mustAcquire(t, s, params(sc, fp1, long, retention))
		if end != nil {
			must(t, "finish", end(ref, tok))
		}
		return rec{ref, state, sc, tok}
	}
	complete := func(ref durable.Ref, tok fence.Token) error {
		return s.Complete(ctx, noTx[TTx](), ref, tok, sampleResult())
	}
	for range 4 {
		gone = append(gone, create(short, complete, durable.Completed))
	}
	gone = append(gone, create(short, func(ref durable.Ref, tok fence.Token) error { return s.Fail(ctx, noTx[TTx](), ref, tok, rejection()) }, durable.Failed))
	gone = append(gone, create(short, func(ref durable.Ref, tok fence.Token) error { return s.Release(ctx, noTx[TTx](), ref, tok) }, durable.Processing))
	stuck = append(stuck, create(short, nil, durable.Processing), create(short, nil, durable.Processing))
	stuck = append(stuck, create(short, func(ref durable.Ref, tok fence.Token) error { return s.MarkUncertain(ctx, ref, tok) }, durable.Uncertain))
	kept = append(kept, create(long, complete, durable.Completed), create(long, complete, durable.Completed))
	for _, r := range append(append([]rec{}, gone...), stuck...) {
		waitRetentionPassed(t, s, r.ref)
	}

	// Past retention but created less than a minute ago: their generations
	// are above the sweep margin, so Sweep holds them back.
	for _, r := range gone {
		if rec := mustGet(t, s, r.ref); sweepable(rec) {
			t.Fatalf("a record created a moment ago is already below the sweep margin: %+v", rec)
		}
	}
	n, err := s.Sweep(ctx, 100)
	must(t, "Sweep within the generation margin", err)
	if n != 0 {
		t.Fatalf("Sweep deleted %d records whose generations are above the clock margin; want 0", n)
	}
	for _, r := range gone {
		checkState(t, "held back by the generation margin", mustGet(t, s, r.ref), r.state)
	}
	for _, r := range gone {
		waitSweepable(t, s, r.ref)
	}

	st, err := s.Stats(ctx)
	must(t, "Stats before Sweep", err)
	if st.ExpiredUnswept != 6 || st.ExpiredStuck != 3 || st.ByState[durable.Completed] != 6 ||
		st.ByState[durable.Failed] != 1 || st.ByState[durable.Processing] != 2 || st.ByState[durable.Uncertain] != 1 || st.Released != 1 {
		t.Fatalf("Stats before Sweep = %+v; want 6 unswept, 3 stuck, 6 completed, 1 failed, 2 processing, 1 uncertain, 1 released", st)
	}

	_, err = s.Sweep(ctx, 0)
	wantErr(t, "Sweep(0)", err, durable.ErrInvalidScope)
	for i, want := range []int{4, 2, 0} {
		n, err := s.Sweep(ctx, 4)
		must(t, "Sweep", err)
		if n != want {
			t.Fatalf("Sweep #%d deleted %d; want %d (batches of 4 over 6 sweepable records)", i+1, n, want)
		}
	}
	for _, r := range gone {
		mustNotFound(t, s, r.ref)
	}
	for _, r := range append(append([]rec{}, stuck...), kept...) {
		checkState(t, "left by Sweep", mustGet(t, s, r.ref), r.state)
	}
	st, err = s.Stats(ctx)
	must(t, "Stats after Sweep", err)
	if st.ExpiredUnswept != 0 || st.ExpiredStuck != 3 || st.ByState[durable.Completed] != 2 ||
		st.ByState[durable.Failed] != 0 || st.ByState[durable.Processing] != 2 || st.ByState[durable.Uncertain] != 1 || st.Released != 0 {
		t.Fatalf("Stats after Sweep = %+v; want 0 unswept, 3 stuck, 2 completed, 2 processing, 1 uncertain", st)
	}

	// Generations rise for a scope across Sweep (issue 13, item 14): a swept
	// scope claimed again gets a generation above the swept one, whatever
	// is proposed (nothing, or the old generation, as a Redis that kept its
	// counter would).
	for i, r := range gone {
		p := params(r.sc, fp2, long, long)
		if i%2 == 1 {
			p.Proposed = r.tok.Generation
		}
		res, err := s.Claim(ctx, noTx[TTx](), p)
		must(t, "claim of a swept scope", err)
		if !res.Acquired || res.Takeover || res.Restarted || res.Token.Generation <= r.tok.Generation {
			t.Fatalf("claim of a swept scope = %+v; want a fresh record above the swept generation %d", res, r.tok.Generation)
		}
	}
}

// 8. Two tenants, or two operations, with the same key never interact.
func (c *contract[TTx]) isolation(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	key := newScope().Key
	scopes := []durable.Scope{
		{Tenant: "tenant-a", Operation: "POST /orders", Key: key},
		{Tenant: "tenant-b", Operation: "POST /orders", Key: key},
		{Tenant: "tenant-a", Operation: "POST /refunds", Key: key},
		{Tenant: "tenant-b", Operation: "POST /refunds", Key: key},
		{Tenant: "tenant-aPOST /orders", Operation: "x", Key: key}, // no concatenation collision
	}
	refs := make([]durable.Ref, len(scopes))
	toks := make([]fence.Token, len(scopes))
	ids := map[string]bool{}
	for i, sc := range scopes {
		refs[i] = mustRef(t, s, sc)
		ids[refs[i].OperationID()] = true
		fp := fp1
		if i%2 == 1 {
			fp = fp2 // a different request under the same key: no mismatch across scopes
		}
		p := params(sc, fp, long, long)
		res, err := s.Claim(ctx, noTx[TTx](), p)
		must(t, fmt.Sprintf("claim of scope %d", i), err)
		if !res.Acquired || res.Takeover || res.Restarted || res.Token.Owner != p.Owner {
			t.Fatalf("scope %d: claim = %+v; want a fresh acquisition of its own record", i, res)
		}
		toks[i] = res.Token
	}
	if len(ids) != len(scopes) {
		t.Fatal("two scopes share an operation identity")
	}
	must(t, "Complete scope 0", s.Complete(ctx, noTx[TTx](), refs[0], toks[0], sampleResult()))
	must(t, "Release scope 1", s.Release(ctx, noTx[TTx](), refs[1], toks[1]))
	must(t, "MarkUncertain scope 2", s.MarkUncertain(ctx, refs[2], toks[2]))
	wantErr(t, "scope 3 completed with scope 0's token", s.Complete(ctx, noTx[TTx](), refs[3], toks[0], sampleResult()), durable.ErrFenced)
	for i, want := range []durable.State{durable.Completed, durable.Processing, durable.Uncertain, durable.Processing, durable.Processing} {
		rec := mustGet(t, s, refs[i])
		checkState(t, fmt.Sprintf("scope %d", i), rec, want)
		if rec.Ref != refs[i] {
			t.Fatalf("scope %d: record of ref %v", i, rec.Ref)
		}
		if i >= 3 {
			checkToken(t, fmt.Sprintf("scope %d", i), rec.Token, toks[i])
		}
	}
}

var errRollback = errors.New("durabletest: roll back")

// 9. Claim and Complete inside the caller's transaction: a rollback (or a
// panic) leaves no row; a commit leaves the completed row.
func (c *contract[TTx]) inTx(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	sc := newScope()
	ref := mustRef(t, s, sc)

	claimAndComplete := func(ctx context.Context, tx TTx) (fence.Token, error) {
		res, err := s.Claim(ctx, tx, params(sc, fp1, long, long))
		if err != nil {
			return fence.Token{}, err
		}
		if !res.Acquired {
			return fence.Token{}, fmt.Errorf("claim in tx did not acquire: %+v", res.Record)
		}
		return res.Token, s.Complete(ctx, tx, ref, res.Token, sampleResult())
	}

	err := s.InTx(ctx, func(ctx context.Context, tx TTx) error {
		if _, err := claimAndComplete(ctx, tx); err != nil {
			return err
		}
		return errRollback
	})
	wantErr(t, "InTx returning an error", err, errRollback)
	mustNotFound(t, s, ref)

	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("InTx swallowed a panic")
			}
		}()
		_ = s.InTx(ctx, func(ctx context.Context, tx TTx) error {
			if _, err := claimAndComplete(ctx, tx); err != nil {
				return err
			}
			panic("durabletest: panic inside InTx")
		})
	}()
	mustNotFound(t, s, ref)

	var tok fence.Token
	must(t, "InTx commit", s.InTx(ctx, func(ctx context.Context, tx TTx) (err error) {
		tok, err = claimAndComplete(ctx, tx)
		return err
	}))
	rec := mustGet(t, s, ref)
	checkState(t, "committed", rec, durable.Completed)
	checkToken(t, "committed", rec.Token, tok)
	if !equalResult(rec.Result, sampleResult()) {
		t.Fatalf("committed result %+v", rec.Result)
	}

	// Inside a transaction a finished record replays too; Fail in tx commits.
	must(t, "InTx replay", s.InTx(ctx, func(ctx context.Context, tx TTx) error {
		res, err := s.Claim(ctx, tx, params(sc, fp1, long, long))
		if err != nil {
			return err
		}
		if res.Acquired || res.Record == nil || res.Record.State != durable.Completed {
			return fmt.Errorf("claim in tx of a completed record = %+v; want the replay", res)
		}
		return nil
	}))
	sc2 := newScope()
	ref2 := mustRef(t, s, sc2)
	must(t, "InTx Fail in tx", s.InTx(ctx, func(ctx context.Context, tx TTx) error {
		res, err := s.Claim(ctx, tx, params(sc2, fp1, long, long))
		if err != nil {
			return err
		}
		return s.Fail(ctx, tx, ref2, res.Token, rejection())
	}))
	checkState(t, "Fail in tx committed", mustGet(t, s, ref2), durable.Failed)
}

// waitBlocked returns once a concurrent claimer is (very likely) blocked on
// the row: when the harness can tell, when a lock waiter shows up.
func (c *contract[TTx]) waitBlocked(s durable.Store[TTx], done <-chan outcome) error {
	if c.h.LockWaiters == nil {
		time.Sleep(100 * time.Millisecond)
		return nil
	}
	deadline := time.Now().Add(pollFor)
	for c.h.LockWaiters(s) < 1 {
		select {
		case o := <-done:
			return fmt.Errorf("the concurrent claim returned while the transaction was open: %+v, %v", o.res, o.err)
		default:
		}
		if time.Now().After(deadline) {
			return errors.New("the concurrent claim never waited for the row lock")
		}
		time.Sleep(pollEvery)
	}
	return nil
}

// A concurrent claimer of a scope claimed in an open transaction waits
// until the transaction commits, then sees the completed record (not a
// second acquisition).
func (c *contract[TTx]) claimTxBlocks(t *testing.T) {
	s := c.h.New(t)
	tctx := ctxFor(t)
	sc := newScope()
	ref := mustRef(t, s, sc)
	done := make(chan outcome, 1)
	var tok fence.Token
	err := s.InTx(tctx, func(ctx context.Context, tx TTx) error {
		res, err := s.Claim(ctx, tx, params(sc, fp1, long, long))
		if err != nil {
			return err
		}
		if !res.Acquired {
			return fmt.Errorf("claim in tx did not acquire: %+v", res.Record)
		}
		tok = res.Token
		go func() {
			r, err := s.Claim(tctx, noTx[TTx](), params(sc, fp1, long, long))
			done <- outcome{r, err}
		}()
		if err := c.waitBlocked(s, done); err != nil {
			return err
		}
		select {
		case o := <-done:
			return fmt.Errorf("the concurrent claim returned while the transaction was open: %+v, %v", o.res, o.err)
		default:
		}
		return s.Complete(ctx, tx, ref, tok, sampleResult())
	})
	must(t, "InTx", err)
	var o outcome
	select {
	case o = <-done:
	case <-time.After(pollFor):
		t.Fatal("the concurrent claim never returned after the commit")
	}
	must(t, "concurrent claim", o.err)
	if o.res.Acquired || o.res.Record == nil {
		t.Fatalf("concurrent claim = %+v; want the committed record, not a second acquisition", o.res)
	}
	checkState(t, "concurrent claim", *o.res.Record, durable.Completed)
	checkToken(t, "concurrent claim", o.res.Record.Token, tok)
	if !equalResult(o.res.Record.Result, sampleResult()) {
		t.Fatalf("concurrent claim saw result %+v", o.res.Record.Result)
	}
}

// When the transaction holding the claim rolls back, the blocked claimer
// acquires: the rolled-back claim never existed.
func (c *contract[TTx]) claimTxRollback(t *testing.T) {
	s := c.h.New(t)
	tctx := ctxFor(t)
	sc := newScope()
	done := make(chan outcome, 1)
	err := s.InTx(tctx, func(ctx context.Context, tx TTx) error {
		res, err := s.Claim(ctx, tx, params(sc, fp1, long, long))
		if err != nil {
			return err
		}
		if !res.Acquired {
			return fmt.Errorf("claim in tx did not acquire: %+v", res.Record)
		}
		go func() {
			r, err := s.Claim(tctx, noTx[TTx](), params(sc, fp2, long, long))
			done <- outcome{r, err}
		}()
		if err := c.waitBlocked(s, done); err != nil {
			return err
		}
		return errRollback
	})
	wantErr(t, "InTx", err, errRollback)
	var o outcome
	select {
	case o = <-done:
	case <-time.After(pollFor):
		t.Fatal("the concurrent claim never returned after the rollback")
	}
	must(t, "concurrent claim", o.err)
	if !o.res.Acquired || o.res.Takeover || o.res.Restarted {
		t.Fatalf("concurrent claim after the rollback = %+v; want a fresh acquisition (the rolled-back claim never existed)", o.res)
	}
	rec := mustGet(t, s, o.res.Ref)
	checkToken(t, "after the rollback", rec.Token, o.res.Token)
	if rec.Takeovers != 0 || rec.Fingerprint != fp2 || o.res.Token.Generation < generationFloor(rec) {
		t.Fatalf("record after the rollback %+v; want the blocked claimer's fresh record", rec)
	}
}

// 10a. A store whose database cannot be reached returns ErrUnavailable from
// every method.
func (c *contract[TTx]) unreachable(t *testing.T) {
	s := c.h.Unreachable(t)
	ctx := ctxFor(t)
	sc := newScope()
	ref, err := s.Ref(sc)
	must(t, "Ref (needs no database)", err)
	tok := fence.Token{Generation: 1, Owner: uuid.New()}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, durable.ErrUnavailable) {
			t.Errorf("%s on an unreachable store = %v; want ErrUnavailable", what, err)
		}
	}
	_, err = s.Claim(ctx, noTx[TTx](), params(sc, fp1, long, long))
	check("Claim", err)
	check("Complete", s.Complete(ctx, noTx[TTx](), ref, tok, sampleResult()))
	check("Fail", s.Fail(ctx, noTx[TTx](), ref, tok, rejection()))
	check("MarkUncertain", s.MarkUncertain(ctx, ref, tok))
	check("Renew", s.Renew(ctx, ref, tok, long))
	check("Release", s.Release(ctx, noTx[TTx](), ref, tok))
	_, err = s.Adopt(ctx, ref, uuid.New(), 0, long)
	check("Adopt", err)
	_, err = s.Pending(ctx, 0, 10)
	check("Pending", err)
	_, err = s.Get(ctx, ref)
	check("Get", err)
	_, err = s.Sweep(ctx, 10)
	check("Sweep", err)
	_, err = s.Stats(ctx)
	check("Stats", err)
	called := false
	check("InTx", s.InTx(ctx, func(context.Context, TTx) error { called = true; return nil }))
	if called {
		t.Error("InTx ran fn without a transaction")
	}
}

// 10b. Invalid scopes and claim parameters return ErrInvalidScope and write
// nothing.
func (c *contract[TTx]) invalid(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	base := params(newScope(), fp1, long, long)
	cases := map[string]func(p *durable.ClaimParams){
		"empty tenant":           func(p *durable.ClaimParams) { p.Scope.Tenant = "" },
		"tenant not UTF-8":       func(p *durable.ClaimParams) { p.Scope.Tenant = "t\xff" },
		"tenant too long":        func(p *durable.ClaimParams) { p.Scope.Tenant = strings.Repeat("t", 513) },
		"empty operation":        func(p *durable.ClaimParams) { p.Scope.Operation = "" },
		"control in operation":   func(p *durable.ClaimParams) { p.Scope.Operation = "POST\n/orders" },
		"empty key":              func(p *durable.ClaimParams) { p.Scope.Key = "" },
		"key of 256 bytes":       func(p *durable.ClaimParams) { p.Scope.Key = strings.Repeat("k", 256) },
		"key with a newline":     func(p *durable.ClaimParams) { p.Scope.Key = "key\n" },
		"key not ASCII":          func(p *durable.ClaimParams) { p.Scope.Key = "clé" },
		"key with DEL":           func(p *durable.ClaimParams) { p.Scope.Key = "key\x7f" },
		"empty fingerprint":      func(p *durable.ClaimParams) { p.Fingerprint = "" },
		"fingerprint too long":   func(p *durable.ClaimParams) { p.Fingerprint = strings.Repeat("f", 257) },
		"nil owner":              func(p *durable.ClaimParams) { p.Owner = uuid.Nil },
		"zero lease":             func(p *durable.ClaimParams) { p.Lease = 0 },
		"lease under 1ms":        func(p *durable.ClaimParams) { p.Lease = time.Millisecond - 1 },
		"negative retention":     func(p *durable.ClaimParams) { p.Retention = -time.Second },
		"zero retention":         func(p *durable.ClaimParams) { p.Retention = 0 },
		"proposal out of range":  func(p *durable.ClaimParams) { p.Proposed = 1<<62 + 1 },
		"proposal at the uint64": func(p *durable.ClaimParams) { p.Proposed = ^uint64(0) },
	}
	for name, mutate := range cases {
		p := base
		mutate(&p)
		res, err := s.Claim(ctx, noTx[TTx](), p)
		if !errors.Is(err, durable.ErrInvalidScope) || res.Acquired {
			t.Errorf("Claim with %s = %+v, %v; want ErrInvalidScope", name, res, err)
		}
		var se *durable.ScopeError
		if !errors.As(err, &se) {
			t.Errorf("Claim with %s: %v is not a *durable.ScopeError", name, err)
		}
		err = s.InTx(ctx, func(ctx context.Context, tx TTx) error {
			_, err := s.Claim(ctx, tx, p)
			return err
		})
		if !errors.Is(err, durable.ErrInvalidScope) {
			t.Errorf("Claim in tx with %s = %v; want ErrInvalidScope", name, err)
		}
		if p.Scope.Validate() != nil {
			if _, err := s.Ref(p.Scope); !errors.Is(err, durable.ErrInvalidScope) {
				t.Errorf("Ref with %s = %v; want ErrInvalidScope", name, err)
			}
		}
	}
	ref := mustRef(t, s, base.Scope)
	_, err := s.Adopt(ctx, ref, uuid.Nil, 0, long)
	wantErr(t, "Adopt with a nil owner", err, durable.ErrInvalidScope)
	_, err = s.Adopt(ctx, ref, uuid.New(), 0, 0)
	wantErr(t, "Adopt with a zero lease", err, durable.ErrInvalidScope)
	wantErr(t, "Renew with a zero lease", s.Renew(ctx, ref, fence.Token{Generation: 1, Owner: uuid.New()}, 0), durable.ErrInvalidScope)
	_, err = s.Pending(ctx, 0, 0)
	wantErr(t, "Pending with limit 0", err, durable.ErrInvalidScope)

	mustNotFound(t, s, ref)
	st, err := s.Stats(ctx)
	must(t, "Stats", err)
	var total int64
	for _, n := range st.ByState {
		total += n
	}
	if total != 0 || st.Released != 0 {
		t.Fatalf("invalid calls wrote records: %+v", st)
	}
}

// 11. The connection is cut after COMMIT was sent: the caller learns the
// true outcome by reading, and a retried Complete with the same token
// succeeds instead of reporting ErrFenced.
func (c *contract[TTx]) lostCommitAck(t *testing.T) {
	if c.h.LoseCommitAck == nil {
		t.Log("not applicable: this backend's COMMIT cannot lose its acknowledgement (Harness.LoseCommitAck is nil)")
		return
	}
	s, arm := c.h.LoseCommitAck(t)
	ctx := ctxFor(t)

	// Claim and Complete in one transaction whose COMMIT ack is lost.
	sc := newScope()
	ref := mustRef(t, s, sc)
	var tok fence.Token
	arm()
	err := s.InTx(ctx, func(ctx context.Context, tx TTx) error {
		res, err := s.Claim(ctx, tx, params(sc, fp1, long, long))
		if err != nil {
			return err
		}
		if !res.Acquired {
			return fmt.Errorf("claim in tx did not acquire: %+v", res.Record)
		}
		tok = res.Token
		return s.Complete(ctx, tx, ref, tok, sampleResult())
	})
	if !errors.Is(err, durable.ErrUnavailable) {
		t.Fatalf("InTx with a lost COMMIT ack = %v; want ErrUnavailable (outcome unknown)", err)
	}
	rec := mustGet(t, s, ref)
	checkState(t, "the truth after the lost ack", rec, durable.Completed)
	checkToken(t, "the truth after the lost ack", rec.Token, tok)
	if !equalResult(rec.Result, sampleResult()) {
		t.Fatalf("committed result %+v", rec.Result)
	}
	must(t, "retried Complete with the same token", s.Complete(ctx, noTx[TTx](), ref, tok, sampleResult()))
	if r := mustNotAcquire(t, s, params(sc, fp1, long, long)); r.State != durable.Completed {
		t.Fatalf("a retry of the request saw %+v; want the replay", r)
	}

	// The claim committed on its own; the Complete's COMMIT ack is lost.
	sc = newScope()
	ref = mustRef(t, s, sc)
	tok = mustAcquire(t, s, params(sc, fp1, long, long))
	arm()
	err = s.InTx(ctx, func(ctx context.Context, tx TTx) error { return s.Complete(ctx, tx, ref, tok, sampleResult()) })
	if !errors.Is(err, durable.ErrUnavailable) {
		t.Fatalf("InTx with a lost COMMIT ack = %v; want ErrUnavailable", err)
	}
	checkState(t, "the truth after the lost ack", mustGet(t, s, ref), durable.Completed)
	must(t, "retried Complete with the same token", s.Complete(ctx, noTx[TTx](), ref, tok, sampleResult()))
	wantErr(t, "Complete with the same token and another result", s.Complete(ctx, noTx[TTx](), ref, tok, rejection()), durable.ErrFenced)
}

// 12. A generation never decreases for a scope, across takeovers, releases,
// adoptions and retention restarts, whatever is proposed.
func (c *contract[TTx]) monotonic(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	sc := newScope()
	ref := mustRef(t, s, sc)
	var last uint64
	seen := func(step string, tok fence.Token) {
		t.Helper()
		if tok.Generation <= last {
			t.Fatalf("%s: generation %d after %d; generations must rise", step, tok.Generation, last)
		}
		if g := mustGet(t, s, ref).Token.Generation; g != tok.Generation {
			t.Fatalf("%s: stored generation %d; returned %d", step, g, tok.Generation)
		}
		last = tok.Generation
	}
	claim := func(step string, fp string, proposed uint64, lease, retention time.Duration) fence.Token {
		t.Helper()
		p := params(sc, fp, lease, retention)
		p.Proposed = proposed
		tok := mustAcquire(t, s, p)
		seen(step, tok)
		return tok
	}

	claim("first claim", fp1, 5, short, long)
	waitLeaseExpired(t, s, ref)
	tok := claim("takeover with a lower proposal", fp1, 1, long, long)
	must(t, "Release", s.Release(ctx, noTx[TTx](), ref, tok))
	tok = claim("claim after release, no proposal", fp2, 0, long, short)
	must(t, "MarkUncertain", s.MarkUncertain(ctx, ref, tok))
	adopted, err := s.Adopt(ctx, ref, uuid.New(), 2, long)
	must(t, "Adopt", err)
	seen("adoption with a lower proposal", adopted)
	must(t, "Complete by the adopter", s.Complete(ctx, noTx[TTx](), ref, adopted, sampleResult()))
	waitRetentionPassed(t, s, ref)
	tok = claim("restart past retention with a lower proposal", fp1, 1, long, long)
	must(t, "Release", s.Release(ctx, noTx[TTx](), ref, tok))
	tok = claim("claim after release with a higher proposal", fp1, 50, long, long)
	must(t, "Release", s.Release(ctx, noTx[TTx](), ref, tok))
	claim("claim after release with an old proposal", fp1, 3, long, long)
}

// MarkUncertain, then Adopt, then Complete by the adopter; the original
// owner is fenced.
func (c *contract[TTx]) uncertain(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	sc := newScope()
	ref := mustRef(t, s, sc)
	a := mustAcquire(t, s, params(sc, fp1, long, long))
	must(t, "MarkUncertain", s.MarkUncertain(ctx, ref, a))
	rec := mustGet(t, s, ref)
	checkState(t, "marked", rec, durable.Uncertain)
	if rec.LeaseRemaining != 0 || rec.Released {
		t.Fatalf("uncertain record %+v: want its lease cleared", rec)
	}
	rec = mustNotAcquire(t, s, params(sc, fp1, long, long))
	checkState(t, "claim of an uncertain record", rec, durable.Uncertain)
	_, err := s.Claim(ctx, noTx[TTx](), params(sc, fp2, long, long))
	wantErr(t, "claim of an uncertain record with another fingerprint", err, durable.ErrMismatch)
	wantErr(t, "Renew of an uncertain record not adopted", s.Renew(ctx, ref, a, long), durable.ErrFenced)
	if !pendingHas(t, s, ref, 0) {
		t.Fatal("Pending does not list the uncertain record")
	}

	r := uuid.New()
	adopted, err := s.Adopt(ctx, ref, r, 0, long)
	must(t, "Adopt", err)
	if adopted.Owner != r || adopted.Generation != a.Generation+1 {
		t.Fatalf("adopted token %v; want owner %v at generation %d", adopted, r, a.Generation+1)
	}
	rec = mustGet(t, s, ref)
	checkState(t, "adopted", rec, durable.Uncertain)
	checkToken(t, "adopted", rec.Token, adopted)
	if rec.Takeovers != 1 || rec.LeaseRemaining <= 0 {
		t.Fatalf("adopted record %+v: want 1 takeover and a live lease", rec)
	}
	if pendingHas(t, s, ref, 0) {
		t.Fatal("Pending lists an uncertain record adopted under a live lease")
	}
	_, err = s.Adopt(ctx, ref, uuid.New(), 0, long)
	wantErr(t, "Adopt of an adopted record", err, durable.ErrBusy)
	wantErr(t, "original owner's Complete", s.Complete(ctx, noTx[TTx](), ref, a, sampleResult()), durable.ErrFenced)
	wantErr(t, "original owner's Fail", s.Fail(ctx, noTx[TTx](), ref, a, rejection()), durable.ErrFenced)
	must(t, "adopter's Renew", s.Renew(ctx, ref, adopted, long))
	must(t, "adopter's Complete", s.Complete(ctx, noTx[TTx](), ref, adopted, sampleResult()))
	rec = mustGet(t, s, ref)
	checkState(t, "reconciled", rec, durable.Completed)
	checkToken(t, "reconciled", rec.Token, adopted)
	if !equalResult(rec.Result, sampleResult()) {
		t.Fatalf("reconciled result %+v", rec.Result)
	}
	_, err = s.Adopt(ctx, ref, uuid.New(), 0, long)
	wantErr(t, "Adopt of a completed record", err, durable.ErrBusy)
	_, err = s.Adopt(ctx, mustRef(t, s, newScope()), uuid.New(), 0, long)
	wantErr(t, "Adopt of no record", err, durable.ErrNotFound)
}

func pendingHas[TTx any](t testing.TB, s durable.Store[TTx], ref durable.Ref, staleFor time.Duration) bool {
	t.Helper()
	recs, err := s.Pending(ctxFor(t), staleFor, 100)
	must(t, "Pending", err)
	for _, r := range recs {
		if r.Ref == ref {
			return true
		}
	}
	return false
}

// Adopt refuses a record held by a live lease, and a released one; it takes
// over a processing record whose lease expired, keeping its state.
func (c *contract[TTx]) adoptBusy(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	sc := newScope()
	ref := mustRef(t, s, sc)
	a := mustAcquire(t, s, params(sc, fp1, long, long))
	_, err := s.Adopt(ctx, ref, uuid.New(), 0, long)
	wantErr(t, "Adopt of a live lease", err, durable.ErrBusy)
	checkToken(t, "after the refused Adopt", mustGet(t, s, ref).Token, a)
	must(t, "Release", s.Release(ctx, noTx[TTx](), ref, a))
	_, err = s.Adopt(ctx, ref, uuid.New(), 0, long)
	wantErr(t, "Adopt of a released record", err, durable.ErrBusy)

	sc = newScope()
	ref = mustRef(t, s, sc)
	a = mustAcquire(t, s, params(sc, fp1, short, long))
	waitLeaseExpired(t, s, ref)
	r := uuid.New()
	adopted, err := s.Adopt(ctx, ref, r, a.Generation+40, long)
	must(t, "Adopt of an expired lease", err)
	if adopted.Owner != r || adopted.Generation != a.Generation+40 {
		t.Fatalf("adopted %v; want owner %v at the proposed generation %d", adopted, r, a.Generation+40)
	}
	rec := mustGet(t, s, ref)
	checkState(t, "adopted processing record", rec, durable.Processing)
	wantErr(t, "expired owner's Complete", s.Complete(ctx, noTx[TTx](), ref, a, sampleResult()), durable.ErrFenced)
	must(t, "adopter's Complete", s.Complete(ctx, noTx[TTx](), ref, adopted, sampleResult()))
}

// Pending lists processing records whose lease expired at least StaleFor
// ago and uncertain records whose lease is free, oldest first, at most
// Limit.
func (c *contract[TTx]) pending(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	mk := func(lease time.Duration) (durable.Ref, fence.Token) {
		sc := newScope()
		return mustRef(t, s, sc), mustAcquire(t, s, params(sc, fp1, lease, long))
	}
	stale, _ := mk(short)
	// Pending orders by creation time: let the database's clock move past
	// the stale record's creation (SQLite's has millisecond resolution).
	staleRec := mustGet(t, s, stale)
	waitRecord(t, s, stale, "the clock to move", func(r durable.Record) bool { return dbClock(r).After(staleRec.CreatedAt) })
	free, freeTok := mk(long)
	must(t, "MarkUncertain", s.MarkUncertain(ctx, free, freeTok))
	live, _ := mk(long)
	adopted, adoptedTok := mk(long)
	must(t, "MarkUncertain", s.MarkUncertain(ctx, adopted, adoptedTok))
	_, err := s.Adopt(ctx, adopted, uuid.New(), 0, long)
	must(t, "Adopt", err)
	done, doneTok := mk(long)
	must(t, "Complete", s.Complete(ctx, noTx[TTx](), done, doneTok, sampleResult()))
	released, releasedTok := mk(long)
	must(t, "Release", s.Release(ctx, noTx[TTx](), released, releasedTok))
	waitLeaseExpired(t, s, stale)

	refs := func(staleFor time.Duration, limit int) []durable.Ref {
		t.Helper()
		recs, err := s.Pending(ctx, staleFor, limit)
		must(t, "Pending", err)
		var out []durable.Ref
		for i, r := range recs {
			if i > 0 && r.CreatedAt.Before(recs[i-1].CreatedAt) {
				t.Fatalf("Pending is not oldest first: %v before %v", recs[i-1].CreatedAt, r.CreatedAt)
			}
			out = append(out, r.Ref)
		}
		return out
	}
	eq := func(what string, got, want []durable.Ref) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s = %v; want %v (stale=%v free=%v live=%v adopted=%v done=%v released=%v)",
				what, got, want, stale, free, live, adopted, done, released)
		}
	}
	eq("Pending", refs(0, 10), []durable.Ref{stale, free})
	eq("Pending limit 1", refs(0, 1), []durable.Ref{stale})
	eq("Pending stale for an hour", refs(time.Hour, 10), []durable.Ref{free})
}

// Renew extends the lease only for the token that holds the record.
func (c *contract[TTx]) renew(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	sc := newScope()
	ref := mustRef(t, s, sc)
	a := mustAcquire(t, s, params(sc, fp1, time.Minute, long))
	must(t, "Renew", s.Renew(ctx, ref, a, time.Hour))
	if l := mustGet(t, s, ref).LeaseRemaining; l <= 30*time.Minute {
		t.Fatalf("after Renew(1h) the lease has %v left; want about an hour", l)
	}
	otherOwner := fence.Token{Generation: a.Generation, Owner: uuid.New()}
	otherGen := fence.Token{Generation: a.Generation + 1, Owner: a.Owner}
	wantErr(t, "Renew by another owner", s.Renew(ctx, ref, otherOwner, time.Millisecond), durable.ErrFenced)
	wantErr(t, "Renew with another generation", s.Renew(ctx, ref, otherGen, time.Millisecond), durable.ErrFenced)
	if l := mustGet(t, s, ref).LeaseRemaining; l <= 30*time.Minute {
		t.Fatalf("a fenced Renew changed the lease to %v", l)
	}
	_, err := s.Claim(ctx, noTx[TTx](), params(sc, fp1, long, long))
	must(t, "claim during the renewed lease", err)
	checkToken(t, "during the renewed lease", mustGet(t, s, ref).Token, a)

	sc = newScope()
	ref = mustRef(t, s, sc)
	a = mustAcquire(t, s, params(sc, fp1, short, long))
	waitLeaseExpired(t, s, ref)
	b := mustAcquire(t, s, params(sc, fp1, long, long))
	wantErr(t, "Renew after a takeover", s.Renew(ctx, ref, a, time.Hour), durable.ErrFenced)
	checkToken(t, "after the fenced Renew", mustGet(t, s, ref).Token, b)
	must(t, "Complete", s.Complete(ctx, noTx[TTx](), ref, b, sampleResult()))
	wantErr(t, "Renew of a completed record", s.Renew(ctx, ref, b, time.Hour), durable.ErrFenced)
	if l := mustGet(t, s, ref).LeaseRemaining; l != 0 {
		t.Fatalf("completed record has a lease of %v", l)
	}
}

// Stats counts records by state, released and stale ones, and takeovers.
func (c *contract[TTx]) stats(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	st, err := s.Stats(ctx)
	must(t, "Stats of an empty store", err)
	if st.OldestUnexpiredAge != 0 || st.Takeovers != 0 || st.StaleProcessing != 0 || st.Released != 0 {
		t.Fatalf("Stats of an empty store = %+v", st)
	}
	mk := func(lease time.Duration) (durable.Scope, durable.Ref, fence.Token) {
		sc := newScope()
		return sc, mustRef(t, s, sc), mustAcquire(t, s, params(sc, fp1, lease, long))
	}
	mk(long) // processing, live
	_, ref, tok := mk(long)
	must(t, "Complete", s.Complete(ctx, noTx[TTx](), ref, tok, sampleResult()))
	_, ref, tok = mk(long)
	must(t, "Fail", s.Fail(ctx, noTx[TTx](), ref, tok, rejection()))
	_, ref, tok = mk(long)
	must(t, "MarkUncertain", s.MarkUncertain(ctx, ref, tok))
	_, ref, tok = mk(long)
	must(t, "Release", s.Release(ctx, noTx[TTx](), ref, tok))
	_, staleRef, _ := mk(short) // processing, lease expired
	sc, takenRef, _ := mk(short)
	waitLeaseExpired(t, s, staleRef)
	waitLeaseExpired(t, s, takenRef)
	mustAcquire(t, s, params(sc, fp1, long, long)) // a takeover

	st, err = s.Stats(ctx)
	must(t, "Stats", err)
	want := map[durable.State]int64{durable.Processing: 3, durable.Completed: 1, durable.Failed: 1, durable.Uncertain: 1}
	for state, n := range want {
		if st.ByState[state] != n {
			t.Errorf("ByState[%s] = %d; want %d", state, st.ByState[state], n)
		}
	}
	if st.Released != 1 || st.StaleProcessing != 1 || st.Takeovers != 1 || st.OldestUnexpiredAge <= 0 ||
		st.ExpiredUnswept != 0 || st.ExpiredStuck != 0 {
		t.Fatalf("Stats = %+v; want 1 released, 1 stale, 1 takeover, an oldest age, nothing expired", st)
	}
}

// The documented round trips: one statement each for a fresh Claim, a
// Complete, a replaying Claim and a Get.
func (c *contract[TTx]) roundTrips(t *testing.T) {
	if c.h.Statements == nil {
		t.Log("Harness.Statements is nil: round trips are not counted for this backend")
		return
	}
	s := c.h.New(t)
	ctx := ctxFor(t)
	sc := newScope()
	ref := mustRef(t, s, sc)
	count := func(what string, fn func()) {
		t.Helper()
		before := c.h.Statements(s)
		fn()
		if n := c.h.Statements(s) - before; n != 1 {
			t.Fatalf("%s took %d statements; want 1", what, n)
		}
	}
	var tok fence.Token
	count("a fresh Claim", func() { tok = mustAcquire(t, s, params(sc, fp1, long, long)) })
	count("Complete", func() { must(t, "Complete", s.Complete(ctx, noTx[TTx](), ref, tok, sampleResult())) })
	count("a replaying Claim", func() { mustNotAcquire(t, s, params(sc, fp1, long, long)) })
	count("Get", func() { mustGet(t, s, ref) })
}

// 6 (issue 13). A record finished after its retention passed (a long
// workflow, a reconciliation) keeps a full retention from its finish: it is
// not already expired, and a retry of the same request replays it instead
// of starting it again. Complete, Fail, their Tx forms and a completion by
// an adopter all do.
func (c *contract[TTx]) finishAfterRetention(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	const retention = 1500 * time.Millisecond
	type pending struct {
		name   string
		sc     durable.Scope
		ref    durable.Ref
		tok    fence.Token
		state  durable.State
		result durable.Result
		finish func(ref durable.Ref, tok fence.Token) error
	}
	inTx := func(fn func(ctx context.Context, tx TTx) error) error { return s.InTx(ctx, fn) }
	cases := []pending{
		{name: "Complete", state: durable.Completed, result: sampleResult(),
			finish: func(ref durable.Ref, tok fence.Token) error {
				return s.Complete(ctx, noTx[TTx](), ref, tok, sampleResult())
			}},
		{name: "Fail", state: durable.Failed, result: rejection(),
			finish: func(ref durable.Ref, tok fence.Token) error { return s.Fail(ctx, noTx[TTx](), ref, tok, rejection()) }},
		{name: "Complete in tx", state: durable.Completed, result: sampleResult(),
			finish: func(ref durable.Ref, tok fence.Token) error {
				return inTx(func(ctx context.Context, tx TTx) error { return s.Complete(ctx, tx, ref, tok, sampleResult()) })
			}},
		{name: "Fail in tx", state: durable.Failed, result: rejection(),
			finish: func(ref durable.Ref, tok fence.Token) error {
				return inTx(func(ctx context.Context, tx TTx) error { return s.Fail(ctx, tx, ref, tok, rejection()) })
			}},
		{name: "adopter's Complete", state: durable.Completed, result: sampleResult(),
			finish: func(ref durable.Ref, tok fence.Token) error {
				adopted, err := s.Adopt(ctx, ref, uuid.New(), 0, long)
				if err != nil {
					return err
				}
				return s.Complete(ctx, noTx[TTx](), ref, adopted, sampleResult())
			}},
	}
	for i := range cases {
		pc := &cases[i]
		pc.sc = newScope()
		pc.ref = mustRef(t, s, pc.sc)
		pc.tok = mustAcquire(t, s, params(pc.sc, fp1, long, retention))
		if strings.HasPrefix(pc.name, "adopter") {
			must(t, "MarkUncertain", s.MarkUncertain(ctx, pc.ref, pc.tok))
		}
	}
	for _, pc := range cases {
		waitRetentionPassed(t, s, pc.ref)
	}
	for _, pc := range cases {
		must(t, pc.name+" after the retention passed", pc.finish(pc.ref, pc.tok))
		rec := mustGet(t, s, pc.ref)
		checkState(t, pc.name, rec, pc.state)
		if rec.ExpiresIn <= 0 || rec.ExpiresIn > retention || rec.ExpiresIn < retention-700*time.Millisecond {
			t.Fatalf("%s after the retention passed: ExpiresIn %v; want about a full retention (%v) from the finish",
				pc.name, rec.ExpiresIn, retention)
		}
		if got := rec.ExpiresAt.Sub(rec.CompletedAt); got < retention {
			t.Fatalf("%s: expires %v after it finished; want at least the retention %v", pc.name, got, retention)
		}
		r := mustNotAcquire(t, s, params(pc.sc, fp1, long, retention))
		checkState(t, pc.name+": a retry right after", r, pc.state)
		if !equalResult(r.Result, pc.result) {
			t.Fatalf("%s: a retry replayed %+v; want %+v", pc.name, r.Result, pc.result)
		}
		_, err := s.Claim(ctx, noTx[TTx](), params(pc.sc, fp2, long, retention))
		wantErr(t, pc.name+": another request with the key right after", err, durable.ErrMismatch)
	}
}

// 7 (issue 13). A takeover after part of the retention elapsed gives the
// record a full retention again (GREATEST(old expiry, now + retention)),
// and keeps its creation time: it is the same operation.
func (c *contract[TTx]) takeoverRetention(t *testing.T) {
	s := c.h.New(t)
	const retention = 3 * time.Second
	sc := newScope()
	ref := mustRef(t, s, sc)
	mustAcquire(t, s, params(sc, fp1, short, retention))
	before := waitRecord(t, s, ref, "half the retention to pass", func(r durable.Record) bool {
		return r.LeaseRemaining <= 0 && r.ExpiresIn <= retention/2
	})
	res, err := s.Claim(ctxFor(t), noTx[TTx](), params(sc, fp1, long, retention))
	must(t, "takeover", err)
	if !res.Acquired || !res.Takeover {
		t.Fatalf("claim after the lease expired = %+v; want a takeover", res)
	}
	rec := mustGet(t, s, ref)
	if rec.ExpiresIn > retention || rec.ExpiresIn < retention-800*time.Millisecond {
		t.Fatalf("after a takeover %v into the retention: ExpiresIn %v; want about a full retention (%v)",
			retention-before.ExpiresIn, rec.ExpiresIn, retention)
	}
	if !rec.CreatedAt.Equal(before.CreatedAt) {
		t.Fatalf("takeover changed CreatedAt from %v to %v", before.CreatedAt, rec.CreatedAt)
	}
	// A takeover never shortens the expiry.
	sc = newScope()
	ref = mustRef(t, s, sc)
	mustAcquire(t, s, params(sc, fp1, short, long))
	waitLeaseExpired(t, s, ref)
	mustAcquire(t, s, params(sc, fp1, long, retention))
	if rec := mustGet(t, s, ref); rec.ExpiresIn < long-time.Minute {
		t.Fatalf("a takeover with a shorter retention cut ExpiresIn to %v; want the longer one kept", rec.ExpiresIn)
	}
}

// 12 (issue 13). Response headers are stored byte for byte: obs-text bytes
// 0x80-0xFF in values (an ETag, say) and names round-trip exactly, so a
// repeated Complete with the same result succeeds, and one that differs in
// a single such byte is another write (fenced).
func (c *contract[TTx]) headersExact(t *testing.T) {
	s := c.h.New(t)
	ctx := ctxFor(t)
	high := make([]byte, 0, 128)
	for b := 0x80; b <= 0xff; b++ {
		high = append(high, byte(b))
	}
	res := durable.Result{
		StatusCode: 200,
		Headers: map[string][]string{
			"Etag":          {"\"\x80\xff\""},
			"X-Obs-Text":    {string(high), "tail \xe9t\xe9"},
			"X-Many":        {"a", "", "\xc3\xa9", "\xe2\x82"},
			"X-Empty":       {},
			"\xfe\xff-Name": {"raw name"},
		},
		Body:    []byte("ok"),
		Version: 2,
	}
	sc := newScope()
	ref := mustRef(t, s, sc)
	a := mustAcquire(t, s, params(sc, fp1, long, long))
	must(t, "Complete", s.Complete(ctx, noTx[TTx](), ref, a, res))
	for what, rec := range map[string]durable.Record{"Get": mustGet(t, s, ref), "a replaying Claim": mustNotAcquire(t, s, params(sc, fp1, long, long))} {
		if !equalResult(rec.Result, res) {
			t.Fatalf("%s: headers %q; want exactly %q", what, rec.Result.Headers, res.Headers)
		}
	}
	must(t, "Complete again with the same result", s.Complete(ctx, noTx[TTx](), ref, a, res))
	must(t, "Complete in tx again with the same result", s.InTx(ctx, func(ctx context.Context, tx TTx) error {
		return s.Complete(ctx, tx, ref, a, res)
	}))
	other := res
	other.Headers = maps.Clone(res.Headers)
	other.Headers["Etag"] = []string{"\"\x81\xff\""} // one byte apart: alike after a lossy encoding
	wantErr(t, "Complete again with an ETag one byte apart", s.Complete(ctx, noTx[TTx](), ref, a, other), durable.ErrFenced)
	if rec := mustGet(t, s, ref); !equalResult(rec.Result, res) {
		t.Fatalf("stored headers changed to %q", rec.Result.Headers)
	}

	// Failed records keep theirs the same way.
	sc = newScope()
	ref = mustRef(t, s, sc)
	a = mustAcquire(t, s, params(sc, fp1, long, long))
	must(t, "Fail", s.Fail(ctx, noTx[TTx](), ref, a, res))
	must(t, "Fail again with the same result", s.Fail(ctx, noTx[TTx](), ref, a, res))
	if rec := mustGet(t, s, ref); !equalResult(rec.Result, res) {
		t.Fatalf("failed record headers %q; want exactly %q", rec.Result.Headers, res.Headers)
	}
}

// 11b (issue 13). A COMMIT the database refused (a deferred constraint
// violated, a serialization failure) rolled the transaction back: InTx
// returns that definite error, not ErrUnavailable ("outcome unknown"), and
// the store keeps working.
func (c *contract[TTx]) definiteCommitFailure(t *testing.T) {
	if c.h.BreakCommit == nil {
		t.Log("Harness.BreakCommit is nil: a definite COMMIT failure is not forced for this backend")
		return
	}
	s := c.h.New(t)
	ctx := ctxFor(t)
	sc := newScope()
	ref := mustRef(t, s, sc)
	err := s.InTx(ctx, func(ctx context.Context, tx TTx) error {
		res, err := s.Claim(ctx, tx, params(sc, fp1, long, long))
		if err != nil {
			return err
		}
		if err := s.Complete(ctx, tx, ref, res.Token, sampleResult()); err != nil {
			return err
		}
		return c.h.BreakCommit(ctx, tx)
	})
	if err == nil || errors.Is(err, durable.ErrUnavailable) {
		t.Fatalf("InTx whose COMMIT the database refused = %v; want its definite error, not ErrUnavailable", err)
	}
	mustNotFound(t, s, ref)
	// Nothing of the refused transaction lingers on any connection.
	for i := range 4 {
		sc := newScope()
		ref := mustRef(t, s, sc)
		must(t, fmt.Sprintf("InTx #%d after the refused COMMIT", i), s.InTx(ctx, func(ctx context.Context, tx TTx) error {
			res, err := s.Claim(ctx, tx, params(sc, fp1, long, long))
			if err != nil {
				return err
			}
			return s.Complete(ctx, tx, ref, res.Token, sampleResult())
		}))
		checkState(t, "after the refused COMMIT", mustGet(t, s, ref), durable.Completed)
	}
	a := mustAcquire(t, s, params(sc, fp1, long, long))
	must(t, "Complete", s.Complete(ctx, noTx[TTx](), ref, a, sampleResult()))
}
