package storetest

// Fencing and finishing: replay, completing twice, release, renew and
// headers kept byte for byte.

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/fence"
)

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
	s, ctx, sc, ref := c.fresh(t)
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
	s, ctx, sc, ref := c.fresh(t)
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
	s, ctx, sc, ref := c.fresh(t)
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

// Renew extends the lease only for the token that holds the record.
func (c *contract[TTx]) renew(t *testing.T) {
	s, ctx, sc, ref := c.fresh(t)
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
