package storetest

// Retention and sweep: restarts past retention, Sweep, Stats, and the full
// retention a late finish or a takeover keeps.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
)

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
	sent := time.Now()
	res, err := s.Claim(ctxFor(t), noTx[TTx](), params(sc, fp1, long, retention))
	must(t, "takeover", err)
	if !res.Acquired || !res.Takeover {
		t.Fatalf("claim after the lease expired = %+v; want a takeover", res)
	}
	rec := mustGet(t, s, ref)
	// The takeover set the expiry to its own now + retention, and the read
	// came at most elapsed later by the database's clock: ExpiresIn is at
	// least retention - elapsed. The old expiry left at most half the
	// retention, so the check tells the two apart while elapsed stays
	// under half of it (a loaded CI machine once took 1.1s here).
	elapsed := time.Since(sent)
	if elapsed >= retention/2-100*time.Millisecond {
		t.Fatalf("the takeover and the read took %v: too slow to tell a raised expiry (%v) from the old one", elapsed, rec.ExpiresIn)
	}
	if rec.ExpiresIn > retention || rec.ExpiresIn < retention-elapsed-50*time.Millisecond {
		t.Fatalf("after a takeover %v into the retention: ExpiresIn %v %v after it; want a full retention (%v) from the takeover",
			retention-before.ExpiresIn, rec.ExpiresIn, elapsed, retention)
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
