package storetest

// Reconciliation: MarkUncertain, Adopt and Pending.

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/storeapi"
	"github.com/oncekey/oncekey/fence"
)

// MarkUncertain, then Adopt, then Complete by the adopter; the original
// owner is fenced.
func (c *contract[TTx]) uncertain(t *testing.T) {
	s, ctx, sc, ref := c.fresh(t)
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

// An uncertain record is released only by the token that adopted it (the
// Reconciler's resolve said nothing happened), never by the token that
// marked it uncertain; released, it is a free key like any released record:
// the next claim, with any fingerprint, starts a new operation above its
// generation (issue 27 #9).
func (c *contract[TTx]) uncertainRelease(t *testing.T) {
	s, ctx, sc, ref := c.fresh(t)
	a := mustAcquire(t, s, params(sc, fp1, long, long))
	must(t, "MarkUncertain", s.MarkUncertain(ctx, ref, a))
	wantErr(t, "Release by the token that marked the record uncertain", s.Release(ctx, noTx[TTx](), ref, a), durable.ErrFenced)
	checkState(t, "after the refused release", mustGet(t, s, ref), durable.Uncertain)

	adopted, err := s.Adopt(ctx, ref, uuid.New(), 0, long)
	must(t, "Adopt", err)
	wantErr(t, "Release by the original token after the adoption", s.Release(ctx, noTx[TTx](), ref, a), durable.ErrFenced)
	must(t, "the adopter's Release", s.Release(ctx, noTx[TTx](), ref, adopted))
	rec := mustGet(t, s, ref)
	if !rec.Released || rec.State != durable.Processing || rec.Token.Generation != adopted.Generation {
		t.Fatalf("record released by its adopter %+v; want released at generation %d", rec, adopted.Generation)
	}
	must(t, "the adopter's Release again", s.Release(ctx, noTx[TTx](), ref, adopted))
	wantErr(t, "the adopter's Complete after its release", s.Complete(ctx, noTx[TTx](), ref, adopted, sampleResult()), durable.ErrFenced)
	res, err := s.Claim(ctx, noTx[TTx](), params(sc, fp2, long, long))
	must(t, "claim after the release", err)
	if !res.Acquired || !res.Restarted || res.Token.Generation <= adopted.Generation {
		t.Fatalf("claim after the release = %+v; want a new operation above generation %d", res, adopted.Generation)
	}
}

func pendingHas[TTx any](t testing.TB, s storeapi.Store[TTx], ref durable.Ref, staleFor time.Duration) bool {
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
	s, ctx, sc, ref := c.fresh(t)
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
// ago and uncertain records whose lease is free, at most Limit: those
// taken over fewest times first, oldest first among them, so records the
// Reconciler keeps failing to resolve cannot hold the others back.
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
			if i > 0 && (r.Takeovers < recs[i-1].Takeovers || r.Takeovers == recs[i-1].Takeovers && r.CreatedAt.Before(recs[i-1].CreatedAt)) {
				t.Fatalf("Pending is not fewest takeovers, then oldest, first: %d %v before %d %v",
					recs[i-1].Takeovers, recs[i-1].CreatedAt, r.Takeovers, r.CreatedAt)
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

	// The oldest record, taken over again and left uncertain (a Reconciler
	// that could not resolve it), goes behind the one not tried yet.
	tok, err := s.Adopt(ctx, stale, uuid.New(), 0, long)
	must(t, "Adopt", err)
	must(t, "MarkUncertain", s.MarkUncertain(ctx, stale, tok))
	eq("Pending after the oldest was tried", refs(0, 10), []durable.Ref{free, stale})
	eq("Pending limit 1 after the oldest was tried", refs(0, 1), []durable.Ref{free})
}
